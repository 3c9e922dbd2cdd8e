//! Measurement 2: an attempt in Docker through the pipeline against a bare run of the same
//! container (same image, user, limits, network), alternating.

use crate::stack::*;
use anyhow::{Context, Result};
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, EventsOptionsBuilder, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, WaitContainerOptions,
};
use futures::StreamExt;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};
use tokio::io::AsyncWriteExt;
use turnpike_config::Backend;
use turnpike_core::wire::{AgentInput, OutboundKind};
use turnpike_core::{subjects, ChatId, RunnerId, TurnId};
use turnpike_jetstream::decode;
use turnpike_runner::backend::{attach_options, ContainerSettings, LABEL_MANAGED, LABEL_TURN};

const IMAGE: &str = "turnpike-test-agent:latest";
/// The label on the bench's own bare-run containers, as key and value.
const BARE_LABEL: [&str; 2] = ["turnpike.bench", "bare"];

/// The phases of one container's life, in order, each as the time it ended.
const PHASES: [&str; 5] = ["created", "started", "first output", "exited", "removed"];

/// One bare run of the container an attempt gets (same image, user, limits, network): create,
/// attach, start, feed the input, wait, remove. Returns when each phase ended, from just before
/// the create.
async fn bare_run(
    docker: &bollard::Docker,
    body: ContainerCreateBody,
    input: &[u8],
    name: &str,
) -> Result<[Duration; 5]> {
    let start = Instant::now();
    let mut marks = [Duration::ZERO; 5];
    let id = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::new().name(name).build()),
            body,
        )
        .await?
        .id;
    marks[0] = start.elapsed();
    let ran = async {
        let attach = docker.attach_container(&id, Some(attach_options())).await?;
        docker.start_container(&id, None).await?;
        marks[1] = start.elapsed();
        let mut stdin = attach.input;
        stdin.write_all(input).await?;
        stdin.shutdown().await?;
        let mut output = attach.output;
        let mut first = true;
        while let Ok(Some(_)) = tokio::time::timeout(Duration::from_secs(10), output.next()).await {
            if first {
                marks[2] = start.elapsed();
                first = false;
            }
        }
        let _ = docker
            .wait_container(&id, None::<WaitContainerOptions>)
            .next()
            .await;
        marks[3] = start.elapsed();
        Ok::<_, anyhow::Error>(())
    }
    .await;
    // Removed whatever happened, so that a failed run leaves nothing behind.
    let removed = remove_bare(docker, &id).await;
    ran?;
    removed?;
    marks[4] = start.elapsed();
    Ok(marks)
}

/// The engine's own account of the runner's containers (create, start, die, destroy), by the
/// turn each ran, with the engine's times: watched for the whole measurement.
#[derive(Clone, Default)]
struct EngineTimeline(Arc<Mutex<HashMap<String, Actions>>>);

/// What the engine said of one container, in order: its action and when.
type Actions = Vec<(String, SystemTime)>;

impl EngineTimeline {
    fn watch(docker: &bollard::Docker) -> (Self, tokio::task::JoinHandle<()>) {
        let timeline = EngineTimeline::default();
        let filters: HashMap<&str, Vec<String>> = HashMap::from([
            ("type", vec!["container".to_owned()]),
            ("label", vec![format!("{LABEL_MANAGED}=true")]),
            (
                "event",
                ["create", "start", "die", "destroy"]
                    .map(String::from)
                    .to_vec(),
            ),
        ]);
        let mut events = docker.events(Some(EventsOptionsBuilder::new().filters(&filters).build()));
        let kept = timeline.clone();
        let task = tokio::spawn(async move {
            while let Some(Ok(ev)) = events.next().await {
                let turn = ev
                    .actor
                    .as_ref()
                    .and_then(|a| a.attributes.as_ref())
                    .and_then(|a| a.get(LABEL_TURN).cloned());
                let (Some(turn), Some(action), Some(nanos)) = (turn, ev.action, ev.time_nano)
                else {
                    continue;
                };
                let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos.max(0) as u64);
                if let Ok(mut t) = kept.0.lock() {
                    t.entry(turn).or_default().push((action, at));
                }
            }
        });
        (timeline, task)
    }

    /// When the engine said `action` for the turn's container, if it has yet.
    fn at(&self, turn: &TurnId, action: &str) -> Option<SystemTime> {
        let t = self.0.lock().ok()?;
        t.get(turn.as_str())?
            .iter()
            .find(|(a, _)| a == action)
            .map(|(_, at)| *at)
    }
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
    let (engine, watching) = EngineTimeline::watch(&docker);
    let container = ContainerSettings::new(&stack.config, RunnerId::sanitized("bench-bare"));
    // Per attempt, when each phase ended, from the claim (Turnpike) or the create call (bare);
    // Turnpike's last mark is its exit report, sent after the container is removed.
    let mut pipeline_marks: Vec<[Duration; 6]> = Vec::new();
    let mut bare_marks: Vec<[Duration; 5]> = Vec::new();
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
        while crate::next_outbound(&mut sub).await?.kind != OutboundKind::Message {}
        let claim = crate::bucket(&stack.bus, subjects::BUCKET_CLAIMS)
            .await?
            .entry(subjects::claim_key(&turn, 1))
            .await?
            .context("claim")?;
        // The exit report is the runner's last word, sent after the container is removed: the
        // same span as the bare run below (create → remove).
        let events = stack.bus.js.get_stream(subjects::STREAM_EVENTS).await?;
        let exited = loop {
            let last = events
                .get_last_raw_message_by_subject(&subjects::events_of(&turn))
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
        // The engine reports the removal a little after it happens: wait for it (bounded).
        for _ in 0..100 {
            if engine.at(&turn, "destroy").is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The reply's own stream time: where the exit report says it is stored.
        let record = turnpike_store::turns::load(&stack.bus, &turn)
            .await?
            .context("turn record")?
            .record;
        let reply_seq = record.attempts[0].reply_span.context("reply stored")?.first;
        let reply: SystemTime = stack
            .bus
            .js
            .get_stream_no_info(subjects::STREAM_CHAT_OUT)
            .await?
            .get_raw_message(reply_seq)
            .await?
            .time
            .into();
        let since = |t: Option<SystemTime>| {
            t.and_then(|t| t.duration_since(claimed).ok())
                .unwrap_or_default()
        };
        pipeline_marks.push([
            since(engine.at(&turn, "create")),
            since(engine.at(&turn, "start")),
            since(Some(reply)),
            since(engine.at(&turn, "die")),
            since(engine.at(&turn, "destroy")),
            since(Some(exited)),
        ]);
        // The same image and input document, by hand.
        let deadline = turnpike_jetstream::now().saturating_add(stack.config.run_timeout);
        let work = turnpike_core::wire::WorkItem {
            workspace: None,
            v: 1,
            turn: turn.clone(),
            chat: chat.clone(),
            attempt: 1,
            max_attempts: 3,
            message: inbound(&chat, &id, "reply:ok"),
            history: vec![],
            profile: None,
        };
        let input = serde_json::to_vec(&AgentInput::from_work(&work, vec![], deadline))?;
        // The runner's own container settings (network `none` saves the bridge set-up a default
        // container pays), labelled as the bench's so no runner takes it for its own.
        // Bare: the image's own entrypoint, no watchdog in front of it.
        let profile = stack.config.profile(None).context("the default profile")?;
        let mut body = container.body(&work, &profile, deadline, None);
        body.labels = Some([(BARE_LABEL[0].to_owned(), BARE_LABEL[1].to_owned())].into());
        let name = format!("turnpike-bench-bare-{i}");
        let marks = bare_run(&docker, body, &input, &name).await?;
        bare.push(marks[4]);
        bare_marks.push(marks);
    }
    watching.abort();
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
    write_phases(out, &pipeline_marks, &bare_marks)?;
    Ok(())
}

/// Each phase's own length (from the end of the one before), p50 over the attempts.
fn write_phases(
    out: &mut String,
    turnpike: &[[Duration; 6]],
    bare: &[[Duration; 5]],
) -> Result<()> {
    fn phase_p50<const N: usize>(runs: &[[Duration; N]], k: usize) -> Duration {
        let mut lengths: Vec<Duration> = runs
            .iter()
            .map(|m| m[k].saturating_sub(if k == 0 { Duration::ZERO } else { m[k - 1] }))
            .collect();
        lengths.sort();
        percentile(&lengths, 0.5)
    }
    writeln!(
        out,
        "\nThe same attempts phase by phase (p50 of each phase's own length). Turnpike's phases \
         are dated by the engine's events (create, start, die, destroy), the reply's and the exit \
         report's stream times, from the claim's KV time; the bare run's by the client, from \
         just before its create call. All clocks are this host's.\n"
    )?;
    writeln!(out, "| phase | Turnpike p50 | bare bollard p50 |")?;
    writeln!(out, "|---|---|---|")?;
    let firsts = ["claim → created", "(create call) → created"];
    for (k, phase) in PHASES.iter().enumerate() {
        let name = if k == 0 {
            format!("{} / {}", firsts[0], firsts[1])
        } else {
            format!("{} → {phase}", PHASES[k - 1])
        };
        writeln!(
            out,
            "| {name} | {} | {} |",
            ms(phase_p50(turnpike, k)),
            ms(phase_p50(bare, k))
        )?;
    }
    writeln!(
        out,
        "| removed → exit reported | {} | — |",
        ms(phase_p50(turnpike, 5))
    )?;
    Ok(())
}
