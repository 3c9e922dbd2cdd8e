//! `turnpike-bench`: what the pipeline costs, each figure next to a baseline measured in the same
//! run (shared machines are noisy, so ratios are what compare across runs).
//!
//! ```sh
//! bash deploy/build-images.sh   # Docker images for measurement 2, static agent for measurement 1
//! cargo build --release -p turnpike-bench && target/release/turnpike-bench all --write BENCHMARKS.md
//! ```
//!
//! Every measurement starts its own nats-server (loopback, temporary store) and runs the roles in
//! this process with the process backend; the agent is the static test agent if
//! `deploy/build-images.sh` built it, else `bench-agent`, built beside this binary.
//! Measurement 1's baseline replays the operations a turn was counted to cost on the wire
//! (`census`), not a hand count.

mod census;
mod codecs;
mod coordinator_kill;
mod dashboard;
mod docker;
mod idle;
mod live_turns;
mod pipeline;
mod plots;
mod procstat;
mod report;
mod retry;
mod runners_and_load;
mod stack;
mod stored_turns;

pub(crate) use stack::*;

use anyhow::{Context, Result};
use census::Op;
use clap::{Parser, Subcommand};
use futures::StreamExt;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use turnpike_config::{Backend, Config};
use turnpike_core::codec::Codec;
use turnpike_core::wire::{
    HistoryEntry, InboundMessage, OutboundItem, OutboundKind, Role, WorkItem,
};
use turnpike_core::{subjects, ChatId, TurnId, FORMAT_VERSION};
use turnpike_jetstream::decode;
use turnpike_store::turns;
use turnpike_store::Bus;
use turnpike_testkit::pipeline::Pipeline;
use turnpike_testkit::NatsServer;

#[derive(Parser)]
#[command(name = "turnpike-bench")]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Every measurement below, one after another.
    All {
        /// Make this run the latest in this Markdown file (BENCHMARKS.md); the run it replaces
        /// moves to docs/benchmarks/history.md beside it, the plots to docs/img/.
        #[arg(long)]
        write: Option<std::path::PathBuf>,
        /// Turns per pipeline run.
        #[arg(long, default_value_t = 200)]
        turns: usize,
    },
    /// Only measurement 1 (pipeline vs raw JetStream), printed; for profiling and quick checks.
    Pipeline {
        #[arg(long, default_value_t = 200)]
        turns: usize,
        /// Slots per runner (`all` uses 4). With 1, four runners hold as many turns at once as
        /// one runner with 4 slots: the runner count without the extra load.
        #[arg(long, default_value_t = 4)]
        slots: usize,
    },
    /// Single-turn latency on an idle pipeline beside its floor (a bare client replaying the
    /// census's operations in sequence), printed.
    Idle {
        #[arg(long, default_value_t = 200)]
        turns: usize,
    },
    /// Only measurement 2 (Docker attempt overhead, phase by phase beside bare bollard), printed.
    Docker,
    /// Only measurement 3 (the retry path, and the coordinator kill -9 inside the delay), printed.
    Retry,
    /// Only measurement 4 (the coordinator's cost per event with 1k, 10k, 100k stored turns).
    Scale,
    /// Only measurement 7 (the dashboard's page time with stored turns), printed.
    Dashboard {
        #[arg(long, default_value_t = 100_000)]
        stored: usize,
    },
    /// Only measurement 8 (live turns at rest: idle CPU, views, lost-runner detection), printed.
    Live {
        /// Live turns, per run (each size in both shapes).
        #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
        sizes: Vec<usize>,
        /// How the turns wait, per size.
        #[arg(long, value_delimiter = ',', default_value = "queued,waiting")]
        shapes: Vec<live_turns::Shape>,
    },
    /// Count the JetStream operations `turns` turns cost, by kind, on the wire.
    Census {
        #[arg(long, default_value_t = 200)]
        turns: usize,
        #[arg(long, default_value_t = 1)]
        runners: usize,
    },
    /// Only the pipeline side of measurement 1 (no census, no baseline): for profiling the roles.
    Burst {
        #[arg(long, default_value_t = 1000)]
        turns: usize,
        #[arg(long, default_value_t = 4)]
        runners: usize,
    },
    /// Rebuild the index at the top of the history page (`all --write` keeps it current).
    IndexHistory {
        #[arg(long, default_value = "docs/benchmarks/history.md")]
        path: std::path::PathBuf,
    },
    /// The test agent (used by the process backend).
    #[command(hide = true)]
    Agent,
    /// A coordinator in its own process (config from the environment), for the kill -9 timing.
    #[command(hide = true)]
    Coordinator,
    /// A runner in its own process (config from the environment), to kill -9 and to measure.
    #[command(hide = true)]
    Runner,
}

/// Run one measurement that writes its report into `out` on a fresh runtime, then print it.
macro_rules! print_report {
    (|$out:ident| $body:expr) => {{
        let rt = runtime()?;
        let mut $out = String::new();
        rt.block_on(async { $body })?;
        print!("{}", $out);
        Ok(())
    }};
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.what {
        What::Agent => turnpike_test_agent::run(),
        What::IndexHistory { path } => {
            let history = std::fs::read_to_string(&path)
                .with_context(|| format!("read {}", path.display()))?;
            std::fs::write(&path, report::with_index(&history))
                .with_context(|| format!("write {}", path.display()))
        }
        What::Coordinator => {
            child_logs();
            let rt = runtime()?;
            rt.block_on(async {
                let config = Config::load(None)?;
                let bus = Bus::connect(&config, "bench-coordinator").await?;
                turnpike_coordinator::Coordinator::new(bus, &config)
                    .run(CancellationToken::new())
                    .await?;
                Ok(())
            })
        }
        What::Runner => {
            child_logs();
            let rt = runtime()?;
            rt.block_on(async {
                let config = turnpike_runner::nats_identity(Config::load(None)?)?;
                let bus = Bus::connect(&config, "bench-runner").await?;
                turnpike_runner::Runner::new(bus, config)
                    .await?
                    .run(CancellationToken::new())
                    .await?;
                Ok(())
            })
        }
        What::Live { sizes, shapes } => {
            print_report!(|out| live_turns::live_turns(&mut out, &sizes, &shapes).await)
        }
        What::Pipeline { turns, slots } => {
            print_report!(|out| pipeline::pipeline_overhead(&mut out, turns, slots).await)
        }
        What::Idle { turns } => print_report!(|out| idle::idle_latency(&mut out, turns).await),
        What::Docker => print_report!(|out| docker::docker_overhead(&mut out).await),
        What::Retry => print_report!(|out| {
            retry::retry_path(&mut out).await?;
            coordinator_kill::coordinator_kill(&mut out).await
        }),
        What::Dashboard { stored } => {
            print_report!(|out| dashboard::page_time(&mut out, stored).await)
        }
        What::Scale => print_report!(|out| stored_turns::coordinator_cost(&mut out).await),
        What::Burst { turns, runners } => {
            let rt = runtime()?;
            rt.block_on(async {
                let stack = Stack::start(runners, |c| c.runner_slots = 4).await?;
                let (elapsed, lat) = burst(&stack, turns, "reply:ok", "burst").await?;
                stack.stop().await;
                println!(
                    "{turns} turns in {:.2} s: {:.1} turns/s, p50 {}, p99 {}",
                    elapsed.as_secs_f64(),
                    turns as f64 / elapsed.as_secs_f64(),
                    ms(percentile(&lat, 0.5)),
                    ms(percentile(&lat, 0.99))
                );
                Ok::<_, anyhow::Error>(())
            })
        }
        What::Census { turns, runners } => {
            let rt = runtime()?;
            rt.block_on(async {
                let stack = Stack::start(runners, |c| c.runner_slots = 4).await?;
                let mix = census::count(&stack, turns, "census").await?;
                stack.stop().await;
                for (op, n) in &mix.0 {
                    println!("{n:>7.2}  {op}");
                }
                println!("{:>7.2}  round trips per turn", mix.round_trips());
                Ok::<_, anyhow::Error>(())
            })
        }
        What::All { write, turns } => {
            let rt = runtime()?;
            let plot_dir = write
                .as_deref()
                .map(|p| report::dir_of(p).join(report::PLOTS))
                .unwrap_or_else(|| std::path::PathBuf::from("."));
            let run = rt.block_on(all(turns, &plot_dir))?;
            print!("{run}");
            if let Some(path) = write {
                report::write(&path, &run)?;
            }
            Ok(())
        }
    }
}

/// A child role logs to stderr only when `TURNPIKE_BENCH_LOG` asks (a filter): to see what it
/// does while it is measured.
fn child_logs() {
    if let Ok(filter) = std::env::var("TURNPIKE_BENCH_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}

/// The runtime every subcommand but `agent` runs on (the agent is measured, so it starts none).
fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Alternating pipeline/baseline rounds per runner count.
const ROUNDS: usize = 3;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

async fn all(turns: usize, plot_dir: &std::path::Path) -> Result<String> {
    let mut out = String::new();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_owned())
        })
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| format!("{} GiB", kb / 1024 / 1024))
        .unwrap_or_else(|| "?".into());
    writeln!(
        out,
        "{}{} — {cores} cores, {mem}, nats-server from $TURNPIKE_NATS_SERVER or PATH\n\n`bash deploy/build-images.sh && cargo build --release -p turnpike-bench && target/release/turnpike-bench all --turns {turns} --write BENCHMARKS.md`",
        report::LATEST,
        turnpike_jetstream::now()
    )?;
    pipeline::pipeline_overhead(&mut out, turns, 4).await?;
    docker::docker_overhead(&mut out).await?;
    retry::retry_path(&mut out).await?;
    coordinator_kill::coordinator_kill(&mut out).await?;
    stored_turns::coordinator_cost(&mut out).await?;
    codecs::codecs(&mut out)?;
    let throughput = runners_and_load::runner_scaling(&mut out).await?;
    let latency = runners_and_load::latency_vs_load(&mut out).await?;
    dashboard::page_time(&mut out, 100_000).await?;
    match plots::plots(plot_dir, &latency, &throughput) {
        Ok(paths) => {
            let names: Vec<String> = paths
                .iter()
                .filter_map(|p| {
                    p.file_name()
                        .map(|n| format!("![{0}]({1}/{0})", n.to_string_lossy(), report::PLOTS))
                })
                .collect();
            writeln!(out, "\n{}", names.join(" "))?;
        }
        Err(e) => writeln!(out, "\nPlots not drawn: {e:#}")?,
    }
    Ok(out)
}
