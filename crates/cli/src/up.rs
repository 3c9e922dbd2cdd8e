//! `turnpike up`: the embedded default — nats-server plus every role in one process.

use crate::follow::{self, FollowOutcome, Printer};
use crate::nats_server;
use anyhow::{Context, Result};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use turnpike_config::{Backend, Config};
use turnpike_core::ChatId;
use turnpike_store::Bus;

fn state_dir(config: &Config) -> PathBuf {
    if let Some(d) = &config.state_dir {
        return d.clone();
    }
    let base = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("turnpike")
}

fn port_of(url: &str) -> u16 {
    url.split(',')
        .next()
        .and_then(|u| u.rsplit(':').next())
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .unwrap_or(4222)
}

pub async fn run(mut config: Config, demo: bool) -> Result<ExitCode> {
    let binary = nats_server::find_or_install()?;
    // The demo runs on its own port and a throwaway store, so it never meets an earlier run.
    let scratch = tempfile::tempdir().context("create a temp dir")?;
    let (port, store) = if demo {
        (nats_server::free_port()?, scratch.path().join("nats"))
    } else {
        (port_of(&config.nats_url), state_dir(&config).join("nats"))
    };
    let nats = nats_server::start(&binary, port, &store)?;
    config.nats_url = nats.url();
    if std::env::var_os("TURNPIKE_RUNNER_BACKEND").is_none() {
        config.runner_backend = Backend::Process;
    }
    if config.runner_backend == Backend::Process && config.agent_command.is_none() {
        let me = std::env::current_exe().context("find the turnpike binary")?;
        config.agent_command = Some(format!("{} test-agent", me.display()));
    }

    let bus = Bus::connect(&config, "turnpike-up").await?;
    let shutdown = if demo {
        CancellationToken::new()
    } else {
        crate::roles::shutdown_on_signal()
    };
    let (mut roles, metrics, dashboard_login) =
        start_roles(&bus, &config, !demo, &shutdown).await?;
    crate::roles::serve_metrics(&config, metrics, &shutdown).await?;

    let code = if demo {
        let ok = script(&bus, &config).await?;
        shutdown.cancel();
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        }
    } else {
        welcome(&nats.url(), &store, &config, dashboard_login.as_deref());
        tokio::select! {
            _ = shutdown.cancelled() => {}
            r = roles.join_next() => {
                // A role ending by itself is an error worth stopping for.
                if let Some(Ok(Err(e))) = r {
                    shutdown.cancel();
                    return Err(e);
                }
            }
        }
        ExitCode::SUCCESS
    };
    while let Some(r) = roles.join_next().await {
        if let Ok(Err(e)) = r {
            eprintln!(
                "turnpike: a role stopped with an error: {}",
                crate::cause_chain(&e)
            );
        }
    }
    drop(nats);
    Ok(code)
}

/// Every role's metrics, rendered when scraped.
type Metrics = Vec<Box<dyn Fn() -> Result<String, std::fmt::Error> + Send + Sync>>;

/// Start the dispatcher, the coordinator and the runner (and, `with_dashboard`, the dashboard,
/// bound before the roles start so it answers by the time the pipeline does). Returns the roles'
/// tasks, their metrics, and the dashboard's one-time password if one was made.
async fn start_roles(
    bus: &Bus,
    config: &Config,
    with_dashboard: bool,
    shutdown: &CancellationToken,
) -> Result<(tokio::task::JoinSet<Result<()>>, Metrics, Option<String>)> {
    let mut roles = tokio::task::JoinSet::new();
    // The dashboard, except in the demo (which exits when its script ends). Bound before the
    // roles start, so it answers by the time the pipeline does.
    let mut dashboard_login = None;
    // Every role's metrics, on one `metrics_listen` for the whole process.
    let mut metrics: Metrics = Vec::new();
    if with_dashboard {
        let (access, login) = dashboard_access(config)?;
        dashboard_login = login;
        let listener = turnpike_dashboard::Dashboard::bind(&config.dashboard_listen).await?;
        let dashboard = turnpike_dashboard::Dashboard::new(bus.clone(), config.clone(), access)?;
        metrics.push(Box::new(dashboard.metrics()));
        let token = shutdown.clone();
        roles.spawn(async move {
            dashboard
                .serve(listener, token)
                .await
                .map_err(anyhow::Error::from)
        });
    }

    {
        let dispatcher = turnpike_dispatcher::Dispatcher::new(bus.clone(), config.clone());
        let counters = dispatcher.counters();
        metrics.push(Box::new(move || counters.render()));
        let token = shutdown.clone();
        roles.spawn(async move { dispatcher.run(token).await.map_err(anyhow::Error::from) });
    }
    {
        let coordinator = turnpike_coordinator::Coordinator::new(bus.clone(), config);
        let counters = coordinator.counters();
        metrics.push(Box::new(move || {
            turnpike_coordinator::metrics::render(&counters)
        }));
        let token = shutdown.clone();
        roles.spawn(async move { coordinator.run(token).await.map_err(anyhow::Error::from) });
    }
    {
        let runner = turnpike_runner::Runner::new(bus.clone(), config.clone()).await?;
        let runner_metrics = runner.metrics();
        metrics.push(Box::new(move || runner_metrics.render()));
        let token = shutdown.clone();
        roles.spawn(async move { runner.run(token).await.map_err(anyhow::Error::from) });
    }
    Ok((roles, metrics, dashboard_login))
}

/// What `turnpike up` says once the pipeline is up: where NATS is, how to try it, the dashboard.
fn welcome(url: &str, store: &std::path::Path, config: &Config, dashboard_login: Option<&str>) {
    println!("Turnpike is up: NATS at {url} (store {}).", store.display());
    println!("Try: TURNPIKE_NATS_URL={url} turnpike send --chat demo 'reply:hello'");
    match dashboard_login {
        Some(password) => println!(
            "Dashboard: http://{} (operator `operator`, password {password}; valid until this process ends)",
            config.dashboard_listen
        ),
        None => println!("Dashboard: http://{}", config.dashboard_listen),
    }
    println!("Ctrl-C stops it.");
}

/// A short scripted chat: a reply, a death then a retried success, a give-up.
async fn script(bus: &Bus, config: &Config) -> Result<bool> {
    let limit = config.attempt_limit();
    println!(
        "Turnpike demo: MAX_TURN_RETRY={} ({} per turn), retry delay {}, {} backend.",
        config.max_turn_retry,
        crate::follow::attempts(limit),
        humantime::format_duration(config.retry_delay),
        config.runner_backend
    );
    let steps: [(&str, &str, FollowOutcome); 3] = [
        (
            "A plain reply",
            "reply:Hello! I am the Turnpike test agent.",
            FollowOutcome::Answered,
        ),
        (
            "An agent that dies on its first attempt: retried silently in a fresh run",
            "die-until:2",
            if limit >= 2 {
                FollowOutcome::Answered
            } else {
                FollowOutcome::GaveUp
            },
        ),
        (
            "An agent that runs out of memory every time: Turnpike gives up and says so",
            "oom",
            FollowOutcome::GaveUp,
        ),
    ];
    let chat = ChatId::new("demo").context("demo chat id")?;
    let mut all_ok = true;
    for (i, (title, text, expected)) in steps.iter().enumerate() {
        println!("\n[{}] {title}\nyou: {text}", i + 1);
        let outcome = follow::send_and_follow(
            bus,
            &chat,
            format!("demo-{}-{i}", turnpike_jetstream::now().millis()),
            Vec::new(),
            text,
            Duration::from_secs(120) + config.retry_delay * limit,
            &mut Printer::indented("  "),
        )
        .await?;
        let ok = outcome == *expected;
        all_ok &= ok;
        if !ok {
            println!("  ✗ expected {expected:?}, got {outcome:?}");
        }
    }
    let errored = turnpike_store::views::chat(bus, &chat)
        .await
        .ok()
        .flatten()
        .and_then(|c| c.errored);
    if let Some(e) = errored {
        println!(
            "\nThe chat is flagged errored for operators: turn {} ({}).",
            e.turn, e.reason
        );
    }
    println!(
        "\ndemo {}",
        if all_ok {
            "finished: every turn ended as expected"
        } else {
            "FAILED"
        }
    );
    Ok(all_ok)
}

/// The dashboard's operators: the users file if one is set; otherwise, on a loopback address
/// only, one operator `operator` with a random password made for this run (there is no default
/// password). Returns the access and that password, if one was made.
fn dashboard_access(config: &Config) -> Result<(turnpike_dashboard::Access, Option<String>)> {
    if config.dashboard_users_file.is_some() {
        return Ok((turnpike_dashboard::Access::from_config(config)?, None));
    }
    let loopback = config
        .dashboard_listen
        .parse::<std::net::SocketAddr>()
        .map(|a| a.ip().is_loopback())
        .unwrap_or(false);
    if !loopback {
        anyhow::bail!(
            "dashboard_listen = {} is not a loopback address: set dashboard_users_file (operators) to serve it there",
            config.dashboard_listen
        );
    }
    let password = turnpike_dashboard::auth::hex(&turnpike_dashboard::auth::random::<9>()?);
    let users = turnpike_dashboard::Users::default()
        .with("operator", turnpike_dashboard::hash_password(&password)?);
    let access = turnpike_dashboard::Access {
        users,
        key: turnpike_dashboard::SessionKey::random()?,
        session_ttl: config.dashboard_session_ttl,
        proxies: Default::default(),
    };
    Ok((access, Some(password)))
}
