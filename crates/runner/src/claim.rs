//! Taking an attempt and letting it go: its lease, then its claim (exactly one runner runs an
//! attempt, however often its work item is delivered; a delivery that cannot be taken now comes
//! back), and fencing one of this runner's attempts out to settle what it landed.

use crate::Inner;
use async_nats::jetstream::kv::CreateErrorKind;
use async_nats::jetstream::AckKind;
use bytes::Bytes;
use std::time::Duration;
use tracing::{debug, info, warn};
use turnpike_core::subjects;
use turnpike_core::wire::{ClaimHolder, ClaimRecord, ExitReport, WorkItem};
use turnpike_core::FORMAT_VERSION;
use turnpike_jetstream::now;

/// Take the attempt's lease and claim it; `Some(lease revision)` when it is ours. Otherwise the
/// delivery has been answered (dropped as a duplicate, or handed back to be delivered again).
pub(crate) async fn take(
    inner: &Inner,
    msg: &async_nats::jetstream::Message,
    work: &WorkItem,
) -> Option<u64> {
    let bus = &inner.bus;
    // The lease first, then the claim: so a claimed attempt without a live lease can only have
    // lost it to the server's TTL, and the sweep needs no clock to tell a dead runner.
    let key = subjects::claim_key(&work.turn, work.attempt);
    let lease_seq = match crate::lease::take(inner, &key).await {
        Ok(crate::lease::Taken::Ours(seq)) => seq,
        Ok(crate::lease::Taken::Held) => {
            // Another runner holds the attempt: if it claimed it, this delivery is a duplicate;
            // if it has not yet, it may still fail to, so the item comes back.
            match turnpike_store::claims::holder(&inner.bus, &work.turn, work.attempt).await {
                Ok(Some(_)) => {
                    info!("attempt already claimed; dropping this delivery");
                    let _ = msg.double_ack().await;
                }
                _ => {
                    debug!("another runner is taking this attempt; leaving this delivery");
                    let _ = msg
                        .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                        .await;
                }
            }
            return None;
        }
        Err(e) => {
            warn!(error = %e, "cannot take the lease; will be redelivered");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return None;
        }
    };

    // Claim: exactly one runner runs an attempt, however often its work item is delivered.
    let claim = ClaimRecord {
        v: FORMAT_VERSION,
        turn: work.turn.clone(),
        attempt: work.attempt,
        holder: ClaimHolder::Runner {
            runner: inner.id.clone(),
        },
        at: now(),
    };
    let claim_bytes = match bus.codec.encode(&claim) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            warn!(error = %e, "cannot encode claim");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return None;
        }
    };
    match bus
        .claims
        .create(subjects::claim_key(&work.turn, work.attempt), claim_bytes)
        .await
    {
        Ok(_) => {}
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            info!("attempt already claimed (or cancelled); dropping this delivery");
            // The lease we took is not the claimant's: give it back, so it cannot hide the
            // claimant's death from the sweep.
            let _ = bus
                .leases
                .purge_expect_revision(&key, Some(lease_seq))
                .await;
            let _ = msg.double_ack().await;
            return None;
        }
        Err(e) => {
            warn!(error = %e, "cannot claim; will be redelivered");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return None;
        }
    }
    Some(lease_seq)
}

/// A publish whose outcome is unknown may still land: fence the attempt out first (nothing of it
/// can land after that), then count what landed, as the sweep does for a lost attempt. Without
/// this a reply that landed unacknowledged was reported as none, and the turn retried after a
/// reply (found by the model checker: `Bugs::trust_uncertain_count`). `None` when the count
/// cannot be settled: no report then; the lease lapses and the sweep counts.
pub(crate) async fn settle_uncertain(
    inner: &Inner,
    work: &WorkItem,
    report: &mut ExitReport,
) -> Option<()> {
    match fence_out_and_count(inner, &work.chat, &work.turn, work.attempt).await {
        Settled::Landed(replies) => {
            report.messages_landed = replies.len() as u32;
            report.replies = replies;
            Some(())
        }
        // A later attempt holds the fence: this report changes nothing.
        Settled::Superseded => Some(()),
        Settled::Unknown => None,
    }
}

/// What fencing one of this runner's attempts out found.
pub(crate) enum Settled {
    /// Fenced out; these replies of it landed (stream sequences), and no more can.
    Landed(Vec<u64>),
    /// A later attempt holds the fence already.
    Superseded,
    /// The fence or the count failed; the coordinator's lease sweep will settle the attempt.
    Unknown,
}

/// Move the turn's fence past `attempt` (only if it could still hold it), then count what of it
/// landed: after the move the count is final. The same order as the sweep's for a lost attempt.
pub(crate) async fn fence_out_and_count(
    inner: &Inner,
    chat: &turnpike_core::ChatId,
    turn: &turnpike_core::TurnId,
    attempt: u32,
) -> Settled {
    use turnpike_store::fence::{self, Losing};
    match fence::lose(&inner.bus, turn, attempt).await {
        Ok(Losing::Fenced { runner_seq }) => {
            match fence::landed(&inner.bus, chat, turn, attempt, runner_seq).await {
                Ok(replies) => Settled::Landed(replies),
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
