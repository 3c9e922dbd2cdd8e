//! Measurement 2: an attempt in Docker through the pipeline against a bare run of the same
//! container (same image, user, limits, network), alternating.

use crate::stack::*;
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
use turnpike_core::wire::{AgentInput, OutboundKind};
use turnpike_core::{subjects, ChatId, RunnerId, TurnId};
use turnpike_jetstream::decode;
use turnpike_runner::backend::{attach_options, ContainerSettings};

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
    let container = ContainerSettings::new(&stack.config, RunnerId::sanitized("bench-bare"));
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
        let mut body = container.body(&work, stack.config.memory_limit.0);
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
