//! `turnpike`: every role, the local pipeline, and the operator commands, in one binary.

mod follow;
mod health;
mod nats_server;
mod operator;
mod roles;
mod tools;
mod up;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;
use turnpike_config::Config;
use turnpike_store::Bus;

#[derive(Parser)]
#[command(
    name = "turnpike",
    version,
    about = "Run chat-agent turns in throwaway containers; retry the ones that die empty-handed."
)]
struct Cli {
    /// Config file (default: $TURNPIKE_CONFIG, else ./turnpike.toml if present).
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a whole local pipeline: nats-server, dispatcher, coordinator and one runner.
    Up {
        /// Run a short scripted chat against the test agent, print what a user sees, and exit.
        #[arg(long)]
        demo: bool,
    },
    /// Create or update the streams, consumers and buckets (needs admin rights), then exit.
    Setup {
        /// Wait this long for NATS (a cluster still electing its leaders) before giving up.
        #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
        wait: Duration,
    },
    /// Exit 0 if this container's role is healthy (for health checks in images with no shell).
    Healthcheck {
        #[arg(value_enum)]
        check: health::Check,
        /// For `nats`: the server's monitoring endpoint.
        #[arg(long, default_value = "http://127.0.0.1:8222/healthz")]
        url: String,
    },
    /// Run the dispatcher role (inbound chat messages become turns).
    Dispatcher,
    /// Run the coordinator role (turn state, retries, notices).
    Coordinator,
    /// Run a runner node (attempts in fresh containers or processes).
    Runner {
        #[command(subcommand)]
        cmd: Option<RunnerCmd>,
    },
    /// Run the operator dashboard (web pages on `dashboard_listen`), or make a password hash.
    Dashboard {
        #[command(subcommand)]
        cmd: Option<DashboardCmd>,
    },
    /// Send a chat message and follow its turn live; exits non-zero unless it was answered.
    Send {
        #[arg(long)]
        chat: String,
        /// Message id (default: a fresh one). Re-using an id re-sends the same message.
        #[arg(long)]
        id: Option<String>,
        /// Stop following after this long.
        #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// A file to attach (repeatable); uploaded to the object store first.
        #[arg(long = "attach", value_name = "FILE")]
        attach: Vec<PathBuf>,
        text: String,
    },
    /// Turns: list, show, kill, re-run.
    Turns {
        #[command(subcommand)]
        cmd: operator::TurnsCmd,
    },
    /// Chats flagged errored, and clearing them.
    Chats {
        #[command(subcommand)]
        cmd: operator::ChatsCmd,
    },
    /// Runners with their slots in use and last heartbeat.
    Runners,
    /// Queue depth, running turns, pending retries, recent give-ups, capacity.
    Status,
    /// Live view of turns across the cluster (Ctrl-C stops it).
    Watch {
        #[arg(long)]
        chat: Option<String>,
        /// Stop after this many changes (for scripts).
        #[arg(long, hide = true)]
        limit: Option<usize>,
    },
    /// Print the NATS users file (`deploy/nats/accounts.conf`) with one user per runner: reads
    /// `<runner id> <password>` lines on stdin (deploy/secrets.sh feeds them).
    NatsAccounts {
        /// The accounts file to render (default: the one this build was made with).
        #[arg(long)]
        template: Option<PathBuf>,
    },
    /// The built-in test agent (reads an input document on stdin); used by the process backend.
    #[command(hide = true)]
    TestAgent,
    /// The egress proxy a runner starts beside an agent whose profile has `egress_allow`: HTTP
    /// CONNECT and plain HTTP to the listed destinations only. Prints `ready <address>`, then
    /// one line per connection (`allowed host:port`, `refused host:port`, …).
    EgressProxy {
        /// Where to listen.
        #[arg(long, default_value = "0.0.0.0:3128")]
        listen: std::net::SocketAddr,
        /// The destinations, `host:port,…` (as `egress_allow`).
        #[arg(long)]
        allow: String,
    },
}

#[derive(Subcommand)]
enum RunnerCmd {
    /// Print, as Docker Engine API JSON, the container each attempt gets with this config (image,
    /// user, limits, network, read-only root, dropped capabilities), for review; runs nothing.
    ContainerSpec {
        /// The resource profile to show (default: `default_profile`).
        #[arg(long)]
        profile: Option<String>,
    },
}

#[derive(Subcommand)]
enum DashboardCmd {
    /// Read a password on stdin and print its hash for a `dashboard_users_file` line.
    HashPassword,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Command::TestAgent = cli.command {
        turnpike_test_agent::run();
    }
    if let Command::EgressProxy { listen, allow } = &cli.command {
        // Needs no configuration: it runs in a container of its own with its list as argument.
        let served = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(tools::egress_proxy(*listen, allow)));
        return match served {
            Ok(code) => code,
            Err(e) => {
                eprintln!("turnpike egress-proxy: {}", cause_chain(&e));
                std::process::ExitCode::from(2)
            }
        };
    }
    let config = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("turnpike: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("turnpike: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli.command, config, cli.json)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("turnpike: {}", cause_chain(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, each said once: many errors quote their source in their
/// own message, so `{:#}` would repeat it ("Connection refused" three times).
pub(crate) fn cause_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

async fn run(command: Command, config: Config, json: bool) -> Result<std::process::ExitCode> {
    match command {
        Command::Up { demo } => {
            if !demo {
                roles::init_logs(&config);
            }
            up::run(config, demo).await
        }
        Command::Setup { wait } => roles::setup(config, wait).await,
        Command::Healthcheck { check, url } => health::report(check, &url, config).await,
        Command::Dispatcher => roles::dispatcher(config).await,
        Command::Coordinator => roles::coordinator(config).await,
        Command::Runner {
            cmd: Some(RunnerCmd::ContainerSpec { profile }),
        } => tools::container_spec(&config, profile.as_deref()),
        Command::Runner { cmd: None } => roles::runner(config).await,
        Command::Send {
            chat,
            id,
            timeout,
            attach,
            text,
        } => follow::send_command(&config, chat, id, timeout, &attach, &text).await,
        Command::Turns { cmd } => operator::turns_cmd(&cli_bus(&config).await?, cmd, json).await,
        Command::Chats { cmd } => {
            operator::chats_cmd(&cli_bus(&config).await?, &config, cmd, json).await
        }
        Command::Runners => operator::cluster::runners_cmd(&cli_bus(&config).await?, json).await,
        Command::Status => operator::cluster::status_cmd(&cli_bus(&config).await?, json).await,
        Command::NatsAccounts { template } => tools::nats_accounts(template),
        Command::Dashboard {
            cmd: Some(DashboardCmd::HashPassword),
        } => tools::hash_password(),
        Command::Dashboard { cmd: None } => roles::dashboard(config).await,
        Command::Watch { chat, limit } => {
            operator::cluster::watch_cmd(&cli_bus(&config).await?, chat, json, limit).await
        }
        Command::TestAgent => turnpike_test_agent::run(),
        Command::EgressProxy { listen, allow } => tools::egress_proxy(listen, &allow).await,
    }
}

/// The connection of an operator command: at once, or an error (a person is waiting).
async fn cli_bus(config: &Config) -> Result<Bus> {
    Ok(Bus::connect(config, "turnpike-cli").await?)
}
