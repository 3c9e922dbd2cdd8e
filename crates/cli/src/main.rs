//! `turnpike`: every role, the local pipeline, and the operator commands, in one binary.

mod follow;
mod nats_server;
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
    /// Run the dispatcher role (inbound chat messages become turns).
    Dispatcher,
    /// Run the coordinator role (turn state, retries, notices).
    Coordinator,
    /// Run a runner node (attempts in fresh containers or processes).
    Runner,
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
        text: String,
    },
    /// The built-in test agent (reads an input document on stdin); used by the process backend.
    #[command(hide = true)]
    TestAgent,
}

fn init_logs(config: &Config) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUST_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&config.log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
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
    match runtime.block_on(run(cli.command, config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("turnpike: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(command: Command, config: Config) -> Result<std::process::ExitCode> {
    use std::process::ExitCode;
    match command {
        Command::Up { demo } => {
            if !demo {
                init_logs(&config);
            }
            up::run(config, demo).await
        }
        Command::Dispatcher => {
            init_logs(&config);
            let bus = Bus::connect(&config, "turnpike-dispatcher").await?;
            turnpike_dispatcher::Dispatcher::new(bus, config)
                .run(shutdown_on_signal())
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Coordinator => {
            init_logs(&config);
            let bus = Bus::connect(&config, "turnpike-coordinator").await?;
            turnpike_coordinator::Coordinator::new(bus, &config)
                .run(shutdown_on_signal())
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Runner => {
            init_logs(&config);
            let bus = Bus::connect(&config, "turnpike-runner").await?;
            turnpike_runner::Runner::new(bus, config)
                .await?
                .run(shutdown_on_signal())
                .await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Send {
            chat,
            id,
            timeout,
            text,
        } => {
            let bus = Bus::connect(&config, "turnpike-send").await?;
            let chat = turnpike_core::ChatId::new(chat).context("--chat")?;
            let outcome = follow::send_and_follow(
                &bus,
                &chat,
                id,
                &text,
                timeout,
                &mut follow::Printer::stdout(),
            )
            .await?;
            Ok(outcome.exit_code())
        }
        Command::TestAgent => turnpike_test_agent::run(),
    }
}
