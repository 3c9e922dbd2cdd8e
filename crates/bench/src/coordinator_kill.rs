//! Measurement 3b: a coordinator killed with SIGKILL inside the retry delay and restarted at
//! once: every retry still fires on time, once.

use crate::stack::*;
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use turnpike_core::ChatId;

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
