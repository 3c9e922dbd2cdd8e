//! Taking an attempt and letting it go: its claim (exactly one runner runs an attempt, however
//! often its work item is delivered; a delivery that cannot be taken now comes back), and fencing
//! one of this runner's attempts out to settle what it landed.

use crate::context::RunnerContext;
use async_nats::jetstream::AckKind;
use std::time::Duration;
use tracing::{debug, info, warn};
use turnpike_core::wire::{ClaimHolder, ClaimRecord, ExitReport, WorkItem};
use turnpike_core::FORMAT_VERSION;
use turnpike_jetstream::now;
use turnpike_store::claims::Created;

/// Claim the attempt; `true` when it is ours. Otherwise the delivery has been answered (dropped
/// as a duplicate, or handed back to be delivered again). The lease comes a heartbeat later, from
/// the run itself (`lease::keep_alive`): most runs end before, and write none.
pub(crate) async fn take(
    ctx: &RunnerContext,
    msg: &async_nats::jetstream::Message,
    work: &WorkItem,
) -> bool {
    // Claim: exactly one runner runs an attempt, however often its work item is delivered.
    let claim = ClaimRecord {
        v: FORMAT_VERSION,
        turn: work.turn.clone(),
        attempt: work.attempt,
        holder: ClaimHolder::Runner {
            runner: ctx.id.clone(),
        },
        at: now(),
        token: Some(token()),
    };
    match turnpike_store::claims::create(&ctx.bus, &claim).await {
        Ok(Created::Ours) => true,
        Ok(Created::Held(_)) => {
            info!("attempt already claimed (or cancelled); dropping this delivery");
            let _ = msg.double_ack().await;
            false
        }
        Err(e) => {
            warn!(error = %e, "cannot claim; will be redelivered");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            false
        }
    }
}

/// A token unique to one handling of a delivery: this process, and a counter.
fn token() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static PROCESS: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let process = PROCESS.get_or_init(|| {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        format!("{}-{started:x}", std::process::id())
    });
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{process}-{n}")
}

/// A publish whose outcome is unknown may still land: fence the attempt out first (nothing of it
/// can land after that), then count what landed, as the sweep does for a lost attempt. Without
/// this a reply that landed unacknowledged was reported as none, and the turn retried after a
/// reply (found by the model checker: `Bugs::trust_uncertain_count`). `None` when the count
/// cannot be settled: no report then; the lease lapses and the sweep counts.
pub(crate) async fn settle_uncertain(
    ctx: &RunnerContext,
    work: &WorkItem,
    report: &mut ExitReport,
) -> Option<()> {
    match fence_out_and_count(ctx, &work.chat, &work.turn, work.attempt).await {
        Settled::Landed(landed) => {
            report.messages_landed = landed.count;
            report.reply_span = landed.span;
            Some(())
        }
        // A later attempt holds the fence: this report changes nothing.
        Settled::Superseded => Some(()),
        Settled::Unknown => None,
    }
}

/// What fencing one of this runner's attempts out found.
pub(crate) enum Settled {
    /// Fenced out; this is what of it landed, and no more can.
    Landed(turnpike_core::wire::Landed),
    /// A later attempt holds the fence already.
    Superseded,
    /// The fence or the count failed; the coordinator's lease sweep will settle the attempt.
    Unknown,
}

/// Move the turn's fence past `attempt` (only if it could still hold it), then count what of it
/// landed: after the move the count is final. The same order as the sweep's for a lost attempt.
pub(crate) async fn fence_out_and_count(
    ctx: &RunnerContext,
    chat: &turnpike_core::ChatId,
    turn: &turnpike_core::TurnId,
    attempt: u32,
) -> Settled {
    use turnpike_store::fence::{self, Losing};
    let writer = turnpike_core::fence::FenceWriter::Runner(ctx.id.clone());
    match fence::lose(&ctx.bus, turn, attempt, &writer).await {
        Ok(Losing::Fenced { runner_seq, .. }) => {
            match fence::landed(&ctx.bus, chat, turn, attempt, runner_seq).await {
                Ok(landed) => Settled::Landed(landed),
                Err(e) => {
                    warn!(turn_id = %turn, attempt, error = %e, "could not count what the attempt landed; the lease sweep will settle it");
                    Settled::Unknown
                }
            }
        }
        Ok(Losing::Stale { current }) => {
            debug!(turn_id = %turn, attempt, current, "a later attempt holds the fence");
            Settled::Superseded
        }
        Err(e) => {
            warn!(turn_id = %turn, attempt, error = %e, "could not fence the attempt out; the lease sweep will settle it");
            Settled::Unknown
        }
    }
}
