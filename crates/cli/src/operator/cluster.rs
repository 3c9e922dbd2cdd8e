//! What the cluster is doing: `runners`, `status` and `watch`.

use anyhow::Result;
use futures::StreamExt;
use serde::Serialize;
use std::process::ExitCode;
use turnpike_core::record::TurnState;
use turnpike_core::TurnRecord;
use turnpike_jetstream::{decode_kv, now};
use turnpike_store::views;
use turnpike_store::Bus;

use super::{age, print_json, print_list};

pub async fn runners_cmd(bus: &Bus, json: bool) -> Result<ExitCode> {
    let runners = views::runners(bus).await?;
    let headers = ["RUNNER", "HOST", "BACKEND", "SLOTS", "VERSION", "HEARTBEAT"];
    print_list(json, &runners, &headers, |p| {
        Some(vec![
            p.runner.to_string(),
            p.host.clone(),
            p.backend.clone(),
            format!("{}/{}", p.slots_in_use, p.slots),
            p.version.clone(),
            age(p.at),
        ])
    })
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
    let c = views::cluster(bus, now()).await?;
    let s = Status {
        queue_depth: c.queue_depth,
        running: c.live_in(TurnState::Running),
        queued: c.live_in(TurnState::Queued),
        pending_retry: c.live_in(TurnState::PendingRetry),
        waiting: c.live_in(TurnState::Waiting),
        gave_up_last_hour: c.gave_up_last_hour as u64,
        runners: c.runners,
        slots: c.slots,
        slots_in_use: c.slots_in_use,
    };
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
    let mut watch = views::watch(bus, views::Watched::Turns).await?;
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
