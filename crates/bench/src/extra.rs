//! Measurements 2 (Docker attempt overhead), 4 (scale with stored turns) and the plots.

use crate::{inbound, ms, percentile, Stack};
use anyhow::{Context, Result};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    WaitContainerOptions,
};
use futures::StreamExt;
use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime};
use tokio::io::AsyncWriteExt;
use turnpike_config::Backend;
use turnpike_core::lifecycle::{self, NewTurn};
use turnpike_core::wire::{AgentInput, OutboundItem, OutboundKind};
use turnpike_core::{subjects, ChatId, RunnerId, Timestamp, TurnId};
use turnpike_jetstream::decode;
use turnpike_runner::backend::{attach_options, DockerBackend};

const IMAGE: &str = "turnpike-test-agent:latest";
/// The label on the bench's own bare-run containers, as key and value.
const BARE_LABEL: [&str; 2] = ["turnpike.bench", "bare"];

/// One bare run of the container an attempt gets (same image, user, limits, network): create,
/// attach, start, feed the input, wait, remove.
async fn bare_run(
    docker: &bollard::Docker,
    body: ContainerCreateBody,
    input: &[u8],
    name: &str,
) -> Result<Duration> {
    let start = Instant::now();
    let id = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::new().name(name).build()),
            body,
        )
        .await?
        .id;
    let ran = async {
        let attach = docker.attach_container(&id, Some(attach_options())).await?;
        docker.start_container(&id, None).await?;
        let mut stdin = attach.input;
        stdin.write_all(input).await?;
        stdin.shutdown().await?;
        let mut output = attach.output;
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(10), output.next()).await {
        }
        let _ = docker
            .wait_container(&id, None::<WaitContainerOptions>)
            .next()
            .await;
        Ok::<_, anyhow::Error>(())
    }
    .await;
    // Removed whatever happened, so that a failed run leaves nothing behind.
    let removed = remove_bare(docker, &id).await;
    ran?;
    removed?;
    Ok(start.elapsed())
}

/// Force-remove one of the bench's bare-run containers.
async fn remove_bare(docker: &bollard::Docker, id: &str) -> Result<()> {
    let force = RemoveContainerOptionsBuilder::new().force(true).build();
    Ok(docker.remove_container(id, Some(force)).await?)
}

/// Remove bare-run containers an interrupted earlier run left (found by the bench's own label):
/// their fixed names would otherwise refuse this run's.
async fn remove_leftover_bare_runs(docker: &bollard::Docker) -> Result<()> {
    let filters: std::collections::HashMap<&str, Vec<String>> =
        [("label", vec![BARE_LABEL.join("=")])].into();
    let leftovers = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await?;
    for id in leftovers.into_iter().filter_map(|c| c.id) {
        remove_bare(docker, &id).await?;
    }
    Ok(())
}

pub async fn docker_overhead(out: &mut String) -> Result<()> {
    // 20 a side: at 10 one slow container moved p50 by several percent (BENCHMARKS.md).
    let n = 20;
    writeln!(out, "\n### 2. Docker attempt overhead ({n} sequential attempts, `reply:ok`, bare run after each)\n")?;
    let docker = match bollard::Docker::connect_with_local_defaults() {
        Ok(d) => match d.negotiate_version().await {
            Ok(d) => d,
            Err(e) => {
                return Ok(writeln!(
                    out,
                    "Skipped: the Docker Engine does not answer ({e})."
                )?)
            }
        },
        Err(e) => return Ok(writeln!(out, "Skipped: no Docker Engine ({e}).")?),
    };
    if docker.inspect_image(IMAGE).await.is_err() {
        writeln!(
            out,
            "Skipped: image {IMAGE} missing (run `bash deploy/build-images.sh`)."
        )?;
        return Ok(());
    }
    let stack = Stack::start(1, |c| {
        c.runner_backend = Backend::Docker;
        c.agent_command = None;
        c.agent_image = IMAGE.into();
        c.runner_slots = 1;
    })
    .await?;
    remove_leftover_bare_runs(&docker).await?;
    let container = DockerBackend::connect(&stack.config, RunnerId::sanitized("bench-bare"))
        .await
        .map_err(anyhow::Error::msg)?;
    let mut pipeline = Vec::new();
    let mut bare = Vec::new();
    for i in 0..n {
        // Claim (server time of the claim's KV write) → reply landed (server time of the message).
        let chat = ChatId::new(format!("dock-{i}"))?;
        let id = format!("dock-m{i}");
        let turn = TurnId::for_message(&chat, &id);
        let mut sub = stack
            .bus
            .client
            .subscribe(subjects::chat_out(&chat))
            .await?;
        crate::send(&stack.bus, &chat, &id, "reply:ok").await?;
        loop {
            let m = tokio::time::timeout(Duration::from_secs(60), sub.next())
                .await
                .context("docker reply")?
                .context("subscription")?;
            let Ok(item) = decode::<OutboundItem>(m.headers.as_ref(), &m.payload) else {
                continue;
            };
            if item.kind == OutboundKind::Message {
                break;
            }
        }
        let claim = stack
            .bus
            .claims
            .entry(subjects::claim_key(&turn, 1))
            .await?
            .context("claim")?;
        // The exit report is the runner's last word, sent after the container is removed: the
        // same span as the bare run below (create → remove).
        let events = stack.bus.js.get_stream(subjects::STREAM_EVENTS).await?;
        let exited = loop {
            let last = events
                .get_last_raw_message_by_subject(&subjects::events(&turn))
                .await?;
            let ev: turnpike_core::wire::RunnerEvent = decode(Some(&last.headers), &last.payload)?;
            if matches!(ev.kind, turnpike_core::wire::RunnerEventKind::Exited { .. }) {
                break last;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let claimed: SystemTime = claim.created.into();
        let exited: SystemTime = exited.time.into();
        pipeline.push(exited.duration_since(claimed).unwrap_or_default());
        // The same image and input document, by hand.
        let work = turnpike_core::wire::WorkItem {
            v: 1,
            turn: turn.clone(),
            chat: chat.clone(),
            attempt: 1,
            max_attempts: 3,
            message: inbound(&chat, &id, "reply:ok"),
            history: vec![],
        };
        let input = serde_json::to_vec(&AgentInput::from_work(&work, vec![]))?;
        // The runner's own container settings (network `none` saves the bridge set-up a default
        // container pays), labelled as the bench's so no runner takes it for its own.
        let mut body = container.container_body(&work, stack.config.memory_limit.0);
        body.labels = Some([(BARE_LABEL[0].to_owned(), BARE_LABEL[1].to_owned())].into());
        let name = format!("turnpike-bench-bare-{i}");
        bare.push(bare_run(&docker, body, &input, &name).await?);
    }
    stack.stop().await;
    pipeline.sort();
    bare.sort();
    let (p, b) = (percentile(&pipeline, 0.5), percentile(&bare, 0.5));
    writeln!(out, "| path | p50 | max |")?;
    writeln!(out, "|---|---|---|")?;
    writeln!(
        out,
        "| Turnpike: claim → container removed and exit reported | {} | {} |",
        ms(p),
        ms(*pipeline.last().unwrap_or(&p))
    )?;
    writeln!(
        out,
        "| bare bollard create/start/wait/remove, same container settings | {} | {} |",
        ms(b),
        ms(*bare.last().unwrap_or(&b))
    )?;
    writeln!(
        out,
        "\nOverhead at p50: {:+.1}% (goal ≤ 10%).",
        (p.as_secs_f64() / b.as_secs_f64() - 1.0) * 100.0
    )?;
    Ok(())
}

/// A coordinator killed -9 inside the 10 s delay and started again at once: when does the retried
/// attempt run, and when does the turn end, measured from when the retry was due?
pub async fn coordinator_kill(out: &mut String) -> Result<()> {
    let n = 5;
    writeln!(
        out,
        "\n### 3b. Coordinator kill -9 inside the delay ({n} turns, restarted at once)\n"
    )?;
    // The stack without its in-process coordinator: it runs as a child process here.
    let stack = Stack::start_with(1, false, |c| {
        c.retry_delay = Duration::from_secs(10);
        c.runner_slots = 5;
    })
    .await?;
    let mut coordinator = spawn_coordinator(&stack)?;
    let mut ids = Vec::new();
    for i in 0..n {
        let chat = ChatId::new(format!("ck-{i}"))?;
        let id = format!("ck-m{i}");
        ids.push(crate::send(&stack.bus, &chat, &id, "die-until:2").await?);
    }
    // All pending their retry, then the kill, 3 s into the delay.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut pending = 0;
        for t in &ids {
            if let Some(v) = turnpike_store::turns::load(&stack.bus, t).await? {
                if v.record.state == turnpike_core::TurnState::PendingRetry {
                    pending += 1;
                }
            }
        }
        if pending == n {
            break;
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "turns did not reach pending_retry"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    coordinator.kill()?;
    coordinator.wait()?;
    let mut coordinator = spawn_coordinator(&stack)?;
    let mut started = Vec::new();
    let mut ended = Vec::new();
    for t in &ids {
        let r = crate::ended(&stack.bus, t).await?;
        let due = r
            .attempts
            .get(1)
            .and_then(|a| a.due_at)
            .context("retry due time")?;
        let published = r
            .attempts
            .get(1)
            .and_then(|a| a.published_at)
            .context("published")?;
        let done = r.outcome.as_ref().map(|o| o.at).context("outcome")?;
        started.push(published.since(due));
        ended.push(done.since(due));
    }
    coordinator.kill()?;
    coordinator.wait()?;
    stack.stop().await;
    started.sort();
    ended.sort();
    writeln!(out, "| from the due time to | p50 | max |")?;
    writeln!(out, "|---|---|---|")?;
    writeln!(
        out,
        "| attempt 2 published | {} | {} |",
        ms(percentile(&started, 0.5)),
        ms(*started.last().unwrap_or(&Duration::ZERO))
    )?;
    writeln!(
        out,
        "| turn ended (new coordinator applied the events) | {} | {} |",
        ms(percentile(&ended, 0.5)),
        ms(*ended.last().unwrap_or(&Duration::ZERO))
    )?;
    writeln!(out, "\nThe retry is held by JetStream, so it fires on time whatever the coordinator does; the restarted coordinator then settles the turns from the events stream.")?;
    Ok(())
}

/// A coordinator as a child process of this binary, configured as the stack's roles are, so that
/// it can be killed, or measured on its own.
fn spawn_coordinator(stack: &Stack) -> Result<std::process::Child> {
    let me = std::env::current_exe()?;
    let c = &stack.config;
    let duration = |d: Duration| humantime::format_duration(d).to_string();
    Ok(std::process::Command::new(me)
        .arg("coordinator")
        .env("TURNPIKE_NATS_URL", &c.nats_url)
        .env("TURNPIKE_RETRY_DELAY", duration(c.retry_delay))
        .env("TURNPIKE_LEASE", duration(c.lease))
        .env("TURNPIKE_HEARTBEAT", duration(c.heartbeat))
        .env("TURNPIKE_LOG", "error")
        .spawn()?)
}

/// CPU time of a process from `/proc/<pid>/stat`: its own, and that of its reaped children.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cpu {
    pub own: Duration,
    pub children: Duration,
}

impl Cpu {
    pub fn of(pid: &str) -> Cpu {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name; utime, stime, cutime, cstime are 14-17 of stat(5), in
        // clock ticks (100 Hz on Linux).
        let after = stat.rsplit(')').next().unwrap_or("");
        let f: Vec<u64> = after
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let at = |i: usize| Duration::from_millis(f.get(i).copied().unwrap_or(0) * 10);
        Cpu {
            own: at(11) + at(12),
            children: at(13) + at(14),
        }
    }
}

/// A process's resident set now and at its peak, in MiB, from `/proc/<pid>/status`.
fn rss_mib(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|k| k.parse::<f64>().ok())
            .map_or(0.0, |kb| kb / 1024.0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// The coordinator's own CPU per event and memory with 1k, 10k and 100k finished turns stored: it
/// runs as a child process started after the bucket is filled (as after a restart), so the
/// figures are its alone, start-up scan included in the peak memory.
pub async fn scale(out: &mut String) -> Result<()> {
    writeln!(
        out,
        "\n### 4. Scale: the coordinator's cost per event with stored turns in the bucket\n"
    )?;
    writeln!(
        out,
        "| stored turns | coordinator CPU per event: median (range) | RSS after (peak) | bytes per stored turn |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    let (warm_up, live_turns) = (20, 1000);
    for stored in [1_000usize, 10_000, 100_000] {
        let stack = Stack::start_with(1, false, |c| c.runner_slots = 4).await?;
        fill_finished_turns(&stack.bus, stored).await?;
        let info = stack
            .bus
            .js
            .get_stream("KV_turnpike_turns")
            .await?
            .info()
            .await?
            .state
            .clone();
        let per_turn = info.bytes / info.messages.max(1);
        let mut coordinator = spawn_coordinator(&stack)?;
        let pid = coordinator.id();
        // A few turns first, so that start-up is behind it when the clock starts.
        let measured = async {
            crate::burst(&stack, warm_up, "reply:ok", &format!("warm{stored}")).await?;
            // Several bursts, each timed on its own: one burst's figure moves by a third with
            // what else the machine runs, and the median is what to compare across sizes.
            let mut per_event_ms = Vec::with_capacity(crate::ROUNDS);
            for round in 0..crate::ROUNDS {
                let cpu0 = Cpu::of(&pid.to_string()).own;
                let tag = format!("scale{stored}r{round}");
                crate::burst(&stack, live_turns, "reply:ok", &tag).await?;
                let cpu = Cpu::of(&pid.to_string()).own.saturating_sub(cpu0);
                // 3 runner events per turn reach the coordinator (started, message landed,
                // exited).
                per_event_ms.push(cpu.as_secs_f64() * 1000.0 / (3 * live_turns) as f64);
            }
            Ok::<_, anyhow::Error>((per_event_ms, rss_mib(pid)))
        }
        .await;
        let _ = coordinator.kill();
        let _ = coordinator.wait();
        stack.stop().await;
        let (mut per_event_ms, (rss, peak)) = measured?;
        let median = crate::median(&mut per_event_ms);
        let (lo, hi) = (
            per_event_ms.first().copied().unwrap_or(0.0),
            per_event_ms.last().copied().unwrap_or(0.0),
        );
        writeln!(
            out,
            "| {stored} | {median:.3} ms ({lo:.3}–{hi:.3}) | {rss:.0} MiB ({peak:.0} MiB) | {per_turn} |",
        )?;
    }
    writeln!(
        out,
        "\nCPU is the coordinator process's own (user + system, 10 ms ticks) over {live_turns} turns, divided by \
their {} runner events; {} bursts per size, one coordinator, the median and the range. It does not grow with the stored turns: the sweep reads only the live index. \
Storage stays bounded by `retention_turns` (KV max age) with one revision per key.",
        3 * live_turns,
        crate::ROUNDS
    )?;
    Ok(())
}

/// Two PNG plots next to BENCHMARKS.md: latency vs load, throughput vs runners.
pub fn plots(
    dir: &std::path::Path,
    latency: &[(usize, f64, f64)],
    throughput: &[(usize, f64)],
) -> Result<Vec<std::path::PathBuf>> {
    use plotters::prelude::*;
    let font = std::fs::read("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")
        .context("the plots need DejaVu Sans (Debian: fonts-dejavu-core)")?;
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("DejaVu Sans did not load"))?;
    let lat_path = dir.join("bench-latency.png");
    {
        let root = BitMapBackend::new(&lat_path, (800, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let max_x = latency.iter().map(|l| l.0).max().unwrap_or(1) as f64;
        let max_y = latency.iter().map(|l| l.2).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption("Latency vs load (inbound → reply)", ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..max_x * 1.05, 0f64..max_y)?;
        chart
            .configure_mesh()
            .x_desc("turns sent at once")
            .y_desc("ms")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                latency.iter().map(|l| (l.0 as f64, l.1)),
                &BLUE,
            ))?
            .label("p50")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(
                latency.iter().map(|l| (l.0 as f64, l.2)),
                &RED,
            ))?
            .label("p99")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
        chart.configure_series_labels().border_style(BLACK).draw()?;
        root.present()?;
    }
    let tp_path = dir.join("bench-runners.png");
    {
        let root = BitMapBackend::new(&tp_path, (800, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let max_x = throughput.iter().map(|t| t.0).max().unwrap_or(1) as f64;
        let one = throughput.first().map(|t| t.1).unwrap_or(1.0);
        let max_y = (one * max_x).max(throughput.iter().map(|t| t.1).fold(0.0, f64::max)) * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption("Throughput vs runners (sleep:1 turns)", ("sans-serif", 24))
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..max_x + 0.5, 0f64..max_y)?;
        chart
            .configure_mesh()
            .x_desc("runners (2 slots each)")
            .y_desc("turns/s")
            .draw()?;
        chart
            .draw_series(LineSeries::new(
                throughput.iter().map(|t| (t.0 as f64, t.1)),
                &BLUE,
            ))?
            .label("measured")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(LineSeries::new(
                throughput.iter().map(|t| (t.0 as f64, one * t.0 as f64)),
                &BLACK.mix(0.4),
            ))?
            .label("linear")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.mix(0.4)));
        chart.configure_series_labels().border_style(BLACK).draw()?;
        root.present()?;
    }
    Ok(vec![lat_path, tp_path])
}

/// `stored` finished turns in the turns bucket (16 writers), as it holds them after a long life.
pub(crate) async fn fill_finished_turns(
    bus: &turnpike_jetstream::Bus,
    stored: usize,
) -> Result<()> {
    let chat = ChatId::new("stored")?;
    let template = lifecycle::create(
        NewTurn {
            turn: TurnId::for_message(&chat, "x"),
            message: inbound(&chat, "x", "an old question"),
            history: vec![],
            max_turn_retry: 3,
            retry_delay: Duration::from_secs(10),
            rerun_of: None,
            created_by: None,
            admit_now: true,
        },
        Timestamp(1_800_000_000_000),
    )
    .0;
    let mut handles = Vec::new();
    for w in 0..16 {
        let kv = bus.turns.clone();
        let mut rec = template.clone();
        handles.push(tokio::spawn(async move {
            for i in (w..stored).step_by(16) {
                rec.turn = TurnId::for_message(&rec.chat, &format!("old-{i}"));
                rec.state = turnpike_core::TurnState::Done;
                let bytes = bytes::Bytes::from(serde_json::to_vec(&rec)?);
                kv.put(rec.turn.as_str(), bytes).await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok(())
}
