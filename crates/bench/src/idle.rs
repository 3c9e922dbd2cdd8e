//! Issue 19: one turn at a time on an idle pipeline (inbound published → bot message seen on the
//! chat's outbound subject, process backend, the agent replies at once), beside its floor: the
//! same JetStream operations, counted by the census, replayed in sequence by one bare client.

use crate::{burst, census, ms, next_outbound, percentile, send, Stack};
use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use turnpike_core::wire::OutboundKind;
use turnpike_core::{subjects, ChatId};

/// One turn on an idle pipeline: (inbound published → bot message seen, → final status seen).
async fn one_turn(stack: &Stack, i: usize) -> Result<(Duration, Duration)> {
    let chat = ChatId::new(format!("idle-{i}"))?;
    let mut sub = stack
        .bus
        .client
        .subscribe(subjects::chat_out(&chat))
        .await?;
    // The subscription is in place before the message goes.
    stack.bus.client.flush().await?;
    let t0 = Instant::now();
    send(&stack.bus, &chat, &format!("idle-m{i}"), "reply:ok").await?;
    let mut reply = None;
    loop {
        let item = next_outbound(&mut sub).await?;
        match item.kind {
            OutboundKind::Message if reply.is_none() => reply = Some(t0.elapsed()),
            OutboundKind::Status if item.r#final => {
                let done = t0.elapsed();
                return Ok((reply.context("final status before any reply")?, done));
            }
            _ => {}
        }
    }
}

/// Turns counted by the census before the timed ones.
const CENSUS_TURNS: usize = 100;
const WARM_UP: usize = 10;

pub(crate) async fn idle_latency(out: &mut String, n: usize) -> Result<()> {
    // Counted on a stack of its own, so the timed turns carry no `>` subscription.
    let counted = Stack::start(1, |c| c.runner_slots = 4).await?;
    let mix = census::count(&counted, CENSUS_TURNS, "idle-census").await?;
    counted.stop().await;
    let whole = mix.whole();
    let stack = Stack::start(1, |c| c.runner_slots = 4).await?;
    burst(&stack, WARM_UP, "reply:ok", "idle-warm").await?;
    let (mut replies, mut ended) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n {
        // One at a time: each turn finds the pipeline idle.
        let (reply, done) = one_turn(&stack, i).await?;
        replies.push(reply);
        ended.push(done);
    }
    let base = census::Baseline::create(&stack, 1, 1).await?;
    for t in 0..WARM_UP {
        base.turn(0, t, &whole).await?;
    }
    let mut floor = Vec::with_capacity(n);
    for t in 0..n {
        let t0 = Instant::now();
        base.turn(0, WARM_UP + t, &whole).await?;
        floor.push(t0.elapsed());
    }
    stack.stop().await;
    replies.sort();
    ended.sort();
    floor.sort();
    let row = |name: &str, l: &[Duration]| {
        format!(
            "| {name} | {} | {} |",
            ms(percentile(l, 0.5)),
            ms(percentile(l, 0.99))
        )
    };
    writeln!(
        out,
        "\n### Single-turn latency on an idle pipeline ({n} turns one at a time, process backend, \
         agent replies at once)\n"
    )?;
    writeln!(out, "| | p50 | p99 |")?;
    writeln!(out, "|---|---|---|")?;
    writeln!(
        out,
        "{}",
        row("inbound published → bot message seen", &replies)
    )?;
    writeln!(
        out,
        "{}",
        row("inbound published → final status seen", &ended)
    )?;
    writeln!(
        out,
        "{}",
        row(
            &format!(
                "floor: the census's {} round trips in sequence, one bare client",
                census::round_trips(&whole)
            ),
            &floor
        )
    )?;
    writeln!(
        out,
        "\nThe floor is the whole turn's operations (the final status comes before only the \
         release, the unlisting and the acks); the reply needs about half of \
         them. The floor has no agent, no process start and no hand-offs between roles."
    )?;
    Ok(())
}
