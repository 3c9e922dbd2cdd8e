//! What the cluster is doing: `runners`, `status` and `watch`.

use anyhow::{Context, Result};
use futures::StreamExt;
use serde::Serialize;
use std::process::ExitCode;
use turnpike_core::record::TurnState;
use turnpike_core::wire::{ChatErrorCause, ChatRecord, RunnerPresence};
use turnpike_core::{subjects, TurnId, TurnRecord};
use turnpike_jetstream::{decode_kv, now, Bus};
use turnpike_store::turns;

use super::{age, keys, print_json, table};

async fn presences(bus: &Bus) -> Result<Vec<RunnerPresence>> {
    let mut out = Vec::new();
    for k in keys(&bus.runners).await? {
        if let Ok(Some(v)) = bus.runners.get(&k).await {
            if let Ok(p) = decode_kv::<RunnerPresence>(&v) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

pub async fn runners_cmd(bus: &Bus, json: bool) -> Result<ExitCode> {
    let runners = presences(bus).await?;
    if json {
        print_json(&runners)?;
    } else {
        let rows: Vec<Vec<String>> = runners
            .iter()
            .map(|p| {
                vec![
                    p.runner.to_string(),
                    p.host.clone(),
                    p.backend.clone(),
                    format!("{}/{}", p.slots_in_use, p.slots),
                    p.version.clone(),
                    age(p.at),
                ]
            })
            .collect();
        table(
            &["RUNNER", "HOST", "BACKEND", "SLOTS", "VERSION", "HEARTBEAT"],
            &rows,
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[derive(Debug, Serialize)]
struct Status {
    queue_depth: u64,
    running: u64,
    queued: u64,
    pending_retry: u64,
    waiting: u64,
    gave_up_last_hour: u64,
    runners: usize,
    slots: u32,
    slots_in_use: u32,
}

pub async fn status_cmd(bus: &Bus, json: bool) -> Result<ExitCode> {
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        turnpike_jetstream::consume::durable(
            &bus.js,
            subjects::STREAM_WORK,
            subjects::CONSUMER_RUNNERS,
        )
        .await?;
    let queue_depth = consumer
        .info()
        .await
        .context("read the work queue")?
        .num_pending;
    let mut s = Status {
        queue_depth,
        running: 0,
        queued: 0,
        pending_retry: 0,
        waiting: 0,
        gave_up_last_hour: 0,
        runners: 0,
        slots: 0,
        slots_in_use: 0,
    };
    for id in keys(&bus.live).await? {
        let Ok(turn) = TurnId::new(id) else { continue };
        if let Some(v) = turns::load(bus, &turn).await? {
            match v.record.state {
                TurnState::Running => s.running += 1,
                TurnState::Queued => s.queued += 1,
                TurnState::PendingRetry => s.pending_retry += 1,
                TurnState::Waiting => s.waiting += 1,
                _ => {}
            }
        }
    }
    let hour_ago = now().millis().saturating_sub(3_600_000);
    for k in keys(&bus.chats).await? {
        if let Ok(Some(v)) = bus.chats.get(&k).await {
            if let Ok(c) = decode_kv::<ChatRecord>(&v) {
                if c.errored.is_some_and(|e| {
                    e.at.millis() >= hour_ago && e.cause == Some(ChatErrorCause::GaveUp)
                }) {
                    s.gave_up_last_hour += 1;
                }
            }
        }
    }
    let runners = presences(bus).await?;
    s.runners = runners.len();
    s.slots = runners.iter().map(|r| r.slots).sum();
    s.slots_in_use = runners.iter().map(|r| r.slots_in_use).sum();
    if json {
        print_json(&s)?;
    } else {
        println!(
            "work queue      {} waiting for a runner",
            turnpike_core::texts::count(s.queue_depth, "attempt", "attempts")
        );
        println!(
            "turns           {} running, {} queued, {} pending retry, {} waiting for their chat",
            s.running, s.queued, s.pending_retry, s.waiting
        );
        use turnpike_core::texts::count;
        println!(
            "gave up (1 h)   {} flagged",
            count(s.gave_up_last_hour, "chat", "chats")
        );
        println!(
            "capacity        {}, {}/{} slots in use",
            count(s.runners as u64, "runner", "runners"),
            s.slots_in_use,
            s.slots
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Follow every turn (or one chat's) as its record changes, until Ctrl-C or `limit` changes.
pub async fn watch_cmd(
    bus: &Bus,
    chat: Option<String>,
    json: bool,
    limit: Option<usize>,
) -> Result<ExitCode> {
    let mut watch = bus
        .turns
        .watch_all()
        .await
        .context("watch the turns bucket")?;
    let mut seen = 0;
    while let Some(entry) = watch.next().await {
        let Ok(entry) = entry else { continue };
        let Ok(r) = decode_kv::<TurnRecord>(&entry.value) else {
            continue;
        };
        if chat.as_deref().is_some_and(|c| c != r.chat.as_str()) {
            continue;
        }
        if json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            println!(
                "{}  {}  {}  {:<13}  attempt {}/{}",
                r.updated_at,
                r.chat,
                r.turn,
                r.state.to_string(),
                r.attempt,
                r.max_attempts
            );
        }
        seen += 1;
        if limit.is_some_and(|l| seen >= l) {
            break;
        }
    }
    Ok(ExitCode::SUCCESS)
}
