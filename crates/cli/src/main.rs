//! `turnpike`: every role, the local pipeline, and the operator commands, in one binary.

mod follow;
mod health;
mod nats_server;
mod operator;
mod up;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use turnpike_config::Config;
use turnpike_jetstream::Bus;

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
}

#[derive(Subcommand)]
enum RunnerCmd {
    /// Print, as Docker Engine API JSON, the container each attempt gets with this config (image,
    /// user, limits, network, read-only root, dropped capabilities), for review; runs nothing.
    ContainerSpec,
}

#[derive(Subcommand)]
enum DashboardCmd {
    /// Read a password on stdin and print its hash for a `dashboard_users_file` line.
    HashPassword,
}

fn init_logs(config: &Config) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        // Colour only for a person at a terminal: escape codes in a log file or journal are noise.
        .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none())
        .compact()
        .init();
}

/// Cancelled on Ctrl-C or SIGTERM.
fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                    t.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}

/// A role's connection: waits for NATS and the topology (a cluster may still be forming), unless
/// told to stop first (then `None`).
async fn role_bus(
    config: &Config,
    name: &str,
    shutdown: &CancellationToken,
) -> Result<Option<Bus>> {
    tokio::select! {
        bus = Bus::connect_patiently(config, name) => Ok(Some(bus?)),
        _ = shutdown.cancelled() => Ok(None),
    }
}

/// This process's `/metrics` on `metrics_listen`, when set: the text expositions of `parts`,
/// joined (one `# EOF` at the end).
async fn serve_metrics(
    config: &Config,
    parts: Vec<Box<dyn Fn() -> Result<String, std::fmt::Error> + Send + Sync>>,
    shutdown: &CancellationToken,
) -> Result<()> {
    let Some(listen) = &config.metrics_listen else {
        return Ok(());
    };
    let listener = turnpike_dashboard::Dashboard::bind(listen).await?;
    let render: turnpike_dashboard::metrics::Render = std::sync::Arc::new(move || {
        let mut out = String::new();
        for part in &parts {
            let text = part().map_err(|e| e.to_string())?;
            out.push_str(text.strip_suffix("# EOF\n").unwrap_or(&text));
        }
        out.push_str("# EOF\n");
        Ok(out)
    });
    let token = shutdown.clone();
    tokio::spawn(async move {
        if let Err(e) =
            turnpike_dashboard::metrics::serve_role_metrics(listener, render, token).await
        {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    });
    Ok(())
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if let Command::TestAgent = cli.command {
        turnpike_test_agent::run();
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
    use std::process::ExitCode;
    match command {
        Command::Up { demo } => {
            if !demo {
                init_logs(&config);
            }
            up::run(config, demo).await
        }
        Command::Setup { wait } => {
            init_logs(&config);
            let mut config = config;
            config.manage_topology = true;
            if wait.is_zero() {
                Bus::connect(&config, "turnpike-setup").await?;
            } else {
                tokio::time::timeout(wait, Bus::connect_patiently(&config, "turnpike-setup"))
                    .await
                    .map_err(|_| {
                        anyhow::anyhow!(
                            "NATS at {} was not ready within {}",
                            turnpike_jetstream::describe_servers(&config),
                            humantime::format_duration(wait)
                        )
                    })??;
            }
            println!(
                "topology ready on {}: {} streams and buckets, {} consumers, {}",
                turnpike_jetstream::describe_servers(&config),
                turnpike_jetstream::topology::STREAM_FILES.len(),
                turnpike_jetstream::topology::CONSUMER_FILES.len(),
                turnpike_core::texts::count(config.replicas as u64, "replica", "replicas")
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Healthcheck { check, url } => match health::run(check, &url, config).await {
            Ok(what) => {
                println!("healthy: {what}");
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                println!("unhealthy: {}", cause_chain(&e));
                Ok(ExitCode::FAILURE)
            }
        },
        Command::Dispatcher => {
            init_logs(&config);
            let shutdown = shutdown_on_signal();
            let Some(bus) = role_bus(&config, "turnpike-dispatcher", &shutdown).await? else {
                return Ok(ExitCode::SUCCESS);
            };
            let dispatcher = turnpike_dispatcher::Dispatcher::new(bus, config.clone());
            let counters = dispatcher.counters();
            serve_metrics(
                &config,
                vec![Box::new(move || counters.render())],
                &shutdown,
            )
            .await?;
            dispatcher.run(shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Coordinator => {
            init_logs(&config);
            let shutdown = shutdown_on_signal();
            let Some(bus) = role_bus(&config, "turnpike-coordinator", &shutdown).await? else {
                return Ok(ExitCode::SUCCESS);
            };
            let coordinator = turnpike_coordinator::Coordinator::new(bus, &config);
            let counters = coordinator.counters();
            serve_metrics(
                &config,
                vec![Box::new(move || {
                    turnpike_coordinator::metrics::render(&counters)
                })],
                &shutdown,
            )
            .await?;
            coordinator.run(shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Runner {
            cmd: Some(RunnerCmd::ContainerSpec),
        } => {
            let runner = turnpike_runner::runner_id(&config);
            let chat = turnpike_core::ChatId::new("example-chat")?;
            let message =
                turnpike_core::wire::InboundMessage::new(chat.clone(), "example", "", None);
            let work = turnpike_core::wire::WorkItem {
                v: turnpike_core::FORMAT_VERSION,
                turn: message.turn(),
                chat,
                attempt: 1,
                max_attempts: config.attempt_limit(),
                message,
                history: Vec::new(),
            };
            // The image's own entrypoint and command follow the watchdog; read at each attempt.
            let command = turnpike_runner::backend::watchdog_command(
                config.lease,
                ["<the image's entrypoint and command>".to_owned()],
            );
            let body = turnpike_runner::backend::ContainerSettings::new(&config, runner).body(
                &work,
                config.memory_limit.0,
                Some(command),
            );
            println!("{}", serde_json::to_string_pretty(&body)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Runner { cmd: None } => {
            init_logs(&config);
            let config = turnpike_runner::nats_identity(config)?;
            let shutdown = shutdown_on_signal();
            let Some(bus) = role_bus(&config, "turnpike-runner", &shutdown).await? else {
                return Ok(ExitCode::SUCCESS);
            };
            let runner = turnpike_runner::Runner::new(bus, config.clone()).await?;
            let metrics = runner.metrics();
            serve_metrics(&config, vec![Box::new(move || metrics.render())], &shutdown).await?;
            runner.run(shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Send {
            chat,
            id,
            timeout,
            attach,
            text,
        } => {
            let chat = turnpike_core::ChatId::new(chat).context("--chat")?;
            let bus = Bus::connect(&config, "turnpike-send").await?;
            let id = id.unwrap_or_else(|| {
                format!(
                    "cli-{}-{}",
                    turnpike_jetstream::now().millis(),
                    std::process::id()
                )
            });
            let attachments = follow::upload(&bus, &chat, &id, &attach).await?;
            let outcome = follow::send_and_follow(
                &bus,
                &chat,
                id,
                attachments,
                &text,
                timeout,
                &mut follow::Printer::stdout(),
            )
            .await?;
            Ok(outcome.exit_code())
        }
        Command::Turns { cmd } => {
            let bus = Bus::connect(&config, "turnpike-cli").await?;
            operator::turns_cmd(&bus, cmd, json).await
        }
        Command::Chats { cmd } => {
            let bus = Bus::connect(&config, "turnpike-cli").await?;
            operator::chats_cmd(&bus, cmd, json).await
        }
        Command::Runners => {
            let bus = Bus::connect(&config, "turnpike-cli").await?;
            operator::cluster::runners_cmd(&bus, json).await
        }
        Command::Status => {
            let bus = Bus::connect(&config, "turnpike-cli").await?;
            operator::cluster::status_cmd(&bus, json).await
        }
        Command::NatsAccounts { template } => {
            use std::io::Read;
            use turnpike_jetstream::accounts;
            let template = match template {
                Some(path) => std::fs::read_to_string(&path)
                    .with_context(|| format!("read {}", path.display()))?,
                None => accounts::TEMPLATE.to_owned(),
            };
            let mut input = String::new();
            std::io::stdin()
                .read_to_string(&mut input)
                .context("read runner lines on stdin")?;
            let runners = accounts::parse_runners(&input)?;
            print!("{}", accounts::render(&template, &runners)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Dashboard {
            cmd: Some(DashboardCmd::HashPassword),
        } => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("read the password on stdin")?;
            let password = line.trim_end_matches(['\n', '\r']);
            if password.is_empty() {
                anyhow::bail!("empty password");
            }
            println!("{}", turnpike_dashboard::hash_password(password)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Dashboard { cmd: None } => {
            init_logs(&config);
            let access = turnpike_dashboard::Access::from_config(&config)?;
            let shutdown = shutdown_on_signal();
            let listener = turnpike_dashboard::Dashboard::bind(&config.dashboard_listen).await?;
            let Some(bus) = role_bus(&config, "turnpike-dashboard", &shutdown).await? else {
                return Ok(ExitCode::SUCCESS);
            };
            let dashboard = turnpike_dashboard::Dashboard::new(bus, config.clone(), access)?;
            serve_metrics(&config, vec![Box::new(dashboard.metrics())], &shutdown).await?;
            dashboard.serve(listener, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Watch { chat, limit } => {
            let bus = Bus::connect(&config, "turnpike-cli").await?;
            operator::cluster::watch_cmd(&bus, chat, json, limit).await
        }
        Command::TestAgent => turnpike_test_agent::run(),
    }
}
