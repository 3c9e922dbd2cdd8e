//! The pipeline under measurement: a nats-server and every role in this process (process
//! backend), and the helpers every measurement sends turns and reads replies with.

use super::*;

/// The pipeline under measurement (testkit's, as the end-to-end tests run it), with the bench's
/// config: the cheapest agent, a tmpfs scratch dir, quiet logs.
pub(crate) struct Stack {
    pipeline: Pipeline,
    pub(crate) bus: Bus,
    pub(crate) config: Config,
}

impl Stack {
    pub(crate) async fn start(runners: usize, tweak: impl FnOnce(&mut Config)) -> Result<Stack> {
        Self::start_with(runners, true, tweak).await
    }

    /// `coordinator: false` leaves the coordinator to the caller (e.g. as a child process).
    pub(crate) async fn start_with(
        runners: usize,
        coordinator: bool,
        tweak: impl FnOnce(&mut Config),
    ) -> Result<Stack> {
        let server = NatsServer::start();
        let me = std::env::current_exe()?;
        let mut config = Config {
            runner_backend: Backend::Process,
            agent_command: Some(agent_command(&me).0),
            scratch_dir: scratch_dir(),
            lease: Duration::from_secs(10),
            heartbeat: Duration::from_secs(2),
            log: "error".into(),
            runner_id: Some("bench".into()),
            ..Config::default()
        };
        tweak(&mut config);
        let pipeline = Pipeline::start_on(server, config, runners, coordinator).await;
        Ok(Stack {
            bus: pipeline.bus.clone(),
            config: pipeline.config.clone(),
            pipeline,
        })
    }

    /// The nats-server's pid as a `/proc` path component.
    pub(crate) fn server_pid(&self) -> String {
        self.pipeline
            .server
            .pid()
            .map_or_else(|| "0".into(), |p| p.to_string())
    }

    pub(crate) async fn stop(self) {
        self.pipeline.stop().await;
    }
}

/// The agent the process backend runs, cheapest first: the static test agent that
/// `deploy/build-images.sh` packs into the Docker image (musl: no CPUID-heavy glibc start-up, no
/// dynamic loader; ~0.8 ms less CPU per attempt than the dynamic one, BENCHMARKS.md), else the
/// small `bench-agent` built beside this binary, else this binary's own `agent` subcommand. The
/// agent's cost is not Turnpike's, so the cheapest one wins. Returns the command line and what it
/// is, for the report.
pub(crate) fn agent_command(me: &std::path::Path) -> (String, &'static str) {
    let dir = me.parent().unwrap_or(std::path::Path::new("."));
    let candidates = [
        (
            dir.join("../x86_64-unknown-linux-musl/release/turnpike-test-agent"),
            "turnpike-test-agent (static, musl)",
        ),
        (
            dir.join("../x86_64-unknown-linux-gnu/release/turnpike-test-agent"),
            "turnpike-test-agent (static, glibc)",
        ),
        (dir.join("bench-agent"), "bench-agent (dynamic)"),
    ];
    match candidates.into_iter().find(|(p, _)| p.exists()) {
        Some((p, what)) => (p.display().to_string(), what),
        None => (format!("{} agent", me.display()), "turnpike-bench agent"),
    }
}

/// Where the process backend makes attempt directories: a tmpfs when the machine has one, as an
/// operator running the process backend at volume would set `scratch_dir` (on ext4, a `mkdir`
/// and `rmdir` per attempt cost 8–18% of throughput, BENCHMARKS.md).
pub(crate) fn scratch_dir() -> Option<std::path::PathBuf> {
    let shm = std::path::Path::new("/dev/shm");
    shm.is_dir().then(|| shm.to_path_buf())
}

/// Wait (up to 2 minutes) for a turn to reach a terminal state.
pub(crate) async fn ended(bus: &Bus, turn: &TurnId) -> Result<turnpike_core::TurnRecord> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(v) = turns::load(bus, turn).await? {
            if v.record.state.is_terminal() {
                return Ok(v.record);
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "turn {turn} did not end");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A bucket opened directly, as `nats kv` would: for planting fixtures and reading what a run
/// left, never how a role reaches stored state (that is `turnpike-store`).
pub(crate) async fn bucket(bus: &Bus, name: &str) -> Result<async_nats::jetstream::kv::Store> {
    Ok(bus.js.get_key_value(name).await?)
}

/// Publish one inbound message as a chat adapter would; returns its turn id.
pub(crate) async fn send(bus: &Bus, chat: &ChatId, id: &str, text: &str) -> Result<TurnId> {
    let msg = inbound(chat, id, text);
    turnpike_jetstream::publish_inbound(&bus.js, bus.codec, &msg).await?;
    Ok(msg.turn())
}

/// The next outbound item on `sub`, within a minute (anything that is not one is skipped).
pub(crate) async fn next_outbound(sub: &mut async_nats::Subscriber) -> Result<OutboundItem> {
    loop {
        let m = tokio::time::timeout(Duration::from_secs(60), sub.next())
            .await
            .context("no outbound item within a minute")?
            .context("subscription closed")?;
        if let Ok(item) = decode::<OutboundItem>(m.headers.as_ref(), &m.payload) {
            return Ok(item);
        }
    }
}

pub(crate) fn inbound(chat: &ChatId, id: &str, text: &str) -> InboundMessage {
    InboundMessage::new(chat.clone(), id, text, None)
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Send `n` turns to `n` chats at once with `text`; wait for each one's first bot message or notice.
/// Returns (elapsed from first publish to last reply, per-turn latencies sorted).
pub(crate) async fn burst(
    stack: &Stack,
    n: usize,
    text: &str,
    tag: &str,
) -> Result<(Duration, Vec<Duration>)> {
    let mut sub = stack.bus.client.subscribe(subjects::CHAT_OUT_ALL).await?;
    let mut sent = std::collections::HashMap::new();
    let start = Instant::now();
    for i in 0..n {
        let chat = ChatId::new(format!("{tag}-{i}"))?;
        let id = format!("{tag}-m{i}");
        let turn = TurnId::for_message(&chat, &id);
        sent.insert(turn, Instant::now());
        send(&stack.bus, &chat, &id, text).await?;
    }
    let mut latencies = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    while latencies.len() < n {
        let m = tokio::time::timeout_at(deadline, sub.next())
            .await
            .context("replies did not all arrive within 10 minutes")?
            .context("subscription closed")?;
        let Ok(item) = decode::<OutboundItem>(m.headers.as_ref(), &m.payload) else {
            continue;
        };
        if matches!(item.kind, OutboundKind::Message | OutboundKind::Notice) {
            if let Some(t0) = sent.remove(&item.turn) {
                latencies.push(t0.elapsed());
            }
        }
    }
    let elapsed = start.elapsed();
    latencies.sort();
    Ok((elapsed, latencies))
}

/// A coordinator as a child process of this binary, configured as the stack's roles are, so that
/// it can be killed, or measured on its own.
pub(crate) fn spawn_coordinator(stack: &Stack) -> Result<std::process::Child> {
    let me = std::env::current_exe()?;
    let c = &stack.config;
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    Ok(std::process::Command::new(me)
        .arg("coordinator")
        .env("TURNPIKE_NATS_URL", &c.nats_url)
        .env("TURNPIKE_RETRY_DELAY", duration(c.retry_delay))
        .env("TURNPIKE_LEASE", duration(c.lease))
        .env("TURNPIKE_HEARTBEAT", duration(c.heartbeat))
        .env("TURNPIKE_LOG", child_log())
        .spawn()?)
}

/// The child roles' log filter: errors only, unless `TURNPIKE_BENCH_LOG` says otherwise (to see
/// what a role does while it is measured).
fn child_log() -> String {
    std::env::var("TURNPIKE_BENCH_LOG").unwrap_or_else(|_| "error".to_owned())
}

/// A runner as a child process of this binary (process backend, the stack's agent), so that it
/// can be killed -9, or measured on its own.
pub(crate) fn spawn_runner(stack: &Stack) -> Result<std::process::Child> {
    let me = std::env::current_exe()?;
    let c = &stack.config;
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    let mut command = std::process::Command::new(&me);
    command
        .arg("runner")
        .env("TURNPIKE_NATS_URL", &c.nats_url)
        .env("TURNPIKE_RUNNER_ID", "bench-child")
        .env("TURNPIKE_RUNNER_SLOTS", c.runner_slots.to_string())
        .env("TURNPIKE_RUNNER_BACKEND", "process")
        .env("TURNPIKE_AGENT_COMMAND", agent_command(&me).0)
        .env("TURNPIKE_LEASE", duration(c.lease))
        .env("TURNPIKE_HEARTBEAT", duration(c.heartbeat))
        .env("TURNPIKE_LOG", child_log());
    if let Some(dir) = &c.scratch_dir {
        command.env("TURNPIKE_SCRATCH_DIR", dir);
    }
    Ok(command.spawn()?)
}
