//! Measurement 4: the coordinator's cost per event with many stored turns in the bucket.

use crate::stack::*;
use anyhow::Result;
use std::fmt::Write as _;
use std::time::Duration;
use turnpike_core::lifecycle::{self, NewTurn};
use turnpike_core::{ChatId, Timestamp, TurnId};

/// The coordinator's own CPU per event and memory with 1k, 10k and 100k finished turns stored: it
/// runs as a child process started after the bucket is filled (as after a restart), so the
/// figures are its alone, start-up scan included in the peak memory.
pub async fn coordinator_cost(out: &mut String) -> Result<()> {
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
                let cpu0 = crate::procstat::Cpu::of(&pid.to_string()).own;
                let tag = format!("scale{stored}r{round}");
                crate::burst(&stack, live_turns, "reply:ok", &tag).await?;
                let cpu = crate::procstat::Cpu::of(&pid.to_string())
                    .own
                    .saturating_sub(cpu0);
                // 3 runner events per turn reach the coordinator (started, message landed,
                // exited).
                per_event_ms.push(cpu.as_secs_f64() * 1000.0 / (3 * live_turns) as f64);
            }
            Ok::<_, anyhow::Error>((per_event_ms, crate::procstat::rss_mib(pid)))
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
Storage stays bounded by `retention_turns` (each ended record's TTL) with one revision per key.",
        3 * live_turns,
        crate::ROUNDS
    )?;
    Ok(())
}

/// `stored` finished turns in the turns bucket (16 writers), as it holds them after a long life.
pub(crate) async fn fill_finished_turns(bus: &turnpike_store::Bus, stored: usize) -> Result<()> {
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
    let turns = crate::bucket(bus, turnpike_core::subjects::BUCKET_TURNS).await?;
    let mut handles = Vec::new();
    for w in 0..16 {
        let kv = turns.clone();
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
