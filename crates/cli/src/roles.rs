//! Each long-running role as the binary starts it: logs, the shutdown signal, NATS (waiting for
//! it), its `/metrics`, then the role until it is told to stop. Also `setup`, which makes the
//! topology the roles wait for.

use anyhow::Result;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use turnpike_config::Config;
use turnpike_store::Bus;

pub(crate) fn init_logs(config: &Config) {
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
pub(crate) fn shutdown_on_signal() -> CancellationToken {
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
pub(crate) async fn serve_metrics(
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

/// Logs, the shutdown signal, then NATS; `None` if told to stop before NATS answered.
async fn start(config: &Config, name: &str) -> Result<Option<(Bus, CancellationToken)>> {
    init_logs(config);
    let shutdown = shutdown_on_signal();
    Ok(role_bus(config, name, &shutdown)
        .await?
        .map(|bus| (bus, shutdown)))
}

/// `turnpike setup`: create or update the topology, waiting up to `wait` for NATS.
pub async fn setup(config: Config, wait: Duration) -> Result<ExitCode> {
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

pub async fn dispatcher(config: Config) -> Result<ExitCode> {
    let Some((bus, shutdown)) = start(&config, "turnpike-dispatcher").await? else {
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

pub async fn coordinator(config: Config) -> Result<ExitCode> {
    let Some((bus, shutdown)) = start(&config, "turnpike-coordinator").await? else {
        return Ok(ExitCode::SUCCESS);
    };
    let coordinator = turnpike_coordinator::Coordinator::new(bus, &config);
    let counters = coordinator.counters();
    let render = move || turnpike_coordinator::metrics::render(&counters);
    serve_metrics(&config, vec![Box::new(render)], &shutdown).await?;
    coordinator.run(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

pub async fn runner(config: Config) -> Result<ExitCode> {
    let config = turnpike_runner::nats_identity(config)?;
    let Some((bus, shutdown)) = start(&config, "turnpike-runner").await? else {
        return Ok(ExitCode::SUCCESS);
    };
    let runner = turnpike_runner::Runner::new(bus, config.clone()).await?;
    let metrics = runner.metrics();
    serve_metrics(&config, vec![Box::new(move || metrics.render())], &shutdown).await?;
    runner.run(shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

pub async fn dashboard(config: Config) -> Result<ExitCode> {
    // The settings and the address first: a dashboard that cannot serve says so at once.
    let access = turnpike_dashboard::Access::from_config(&config)?;
    let listener = turnpike_dashboard::Dashboard::bind(&config.dashboard_listen).await?;
    let Some((bus, shutdown)) = start(&config, "turnpike-dashboard").await? else {
        return Ok(ExitCode::SUCCESS);
    };
    let dashboard = turnpike_dashboard::Dashboard::new(bus, config.clone(), access)?;
    serve_metrics(&config, vec![Box::new(dashboard.metrics())], &shutdown).await?;
    dashboard.serve(listener, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}
