//! Leases: a runner's heartbeat per running attempt, in the `turnpike_leases` bucket with a
//! server-side TTL (judged by the server's clock, never by comparing hosts' clocks). A runner that
//! cannot renew for longer than the lease allows stops its own run first, so a runner cut off from
//! NATS never keeps a zombie attempt going after the coordinator may have declared it lost.

use crate::context::RunnerContext;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::warn;
use turnpike_core::exit::StopReason;
use turnpike_core::{subjects, TurnId};
use turnpike_jetstream::BusError;
use turnpike_store::leases;

/// Write the attempt's lease a heartbeat after its claim (sent at `claimed_at`), then hold it
/// until dropped, after the exit is reported: renew it every heartbeat by compare-and-set, and
/// stop the run (`LeaseLost`) while one heartbeat of it is still left if writes keep failing, or
/// at once if it lapsed or was taken away — a lapsed lease is never renewed again, since the
/// coordinator may have declared the attempt lost. The first write expects no trace of a lease,
/// so a sweep that gave up on the attempt meanwhile (and left its marker) stops the run too. Once
/// the attempt holds its fence (`fence`), each heartbeat also checks the fence is still its own,
/// so a kill or loss it missed on the wire still stops it.
///
/// Each renewal also moves the watchdog's deadline on (`watchdog`, see [`watchdog_deadline`]):
/// if this runner freezes, the agent's container stops its agent by itself.
///
/// A run that ends within its first heartbeat writes no lease: the sweep gives a claimed attempt
/// with no trace of one a whole lease before it calls it lost (`recovery::absent_lease`), by
/// which time this loop has written it or stopped the run.
pub(crate) fn keep_alive(
    ctx: Arc<RunnerContext>,
    turn: TurnId,
    attempt: u32,
    stop: Arc<watch::Sender<Option<StopReason>>>,
    fence: watch::Receiver<Option<u64>>,
    watchdog: watch::Sender<Instant>,
    claimed_at: Instant,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let key = subjects::lease_key(&turn, attempt, &ctx.id);
        let lease = ctx.config.lease;
        let beat = ctx.config.heartbeat;
        // `last_ok` is when the last write that succeeded was *sent* (the server's TTL started
        // no earlier than that), or the claim's, before the first. `seq` is the lease's
        // sequence, none until it exists.
        let mut last_ok = claimed_at;
        let mut seq: Option<u64> = None;
        loop {
            // Stop the run while one heartbeat of the lease is still left. Both the wait and the
            // renewal are bounded by that deadline: checking only between renewals could miss
            // it by a whole heartbeat plus a renewal time-out, and keep a zombie run past its
            // lease (seen in the fault suite with lease 6 s, heartbeat 2 s).
            let stop_at = last_ok + lease.saturating_sub(beat);
            let next = Instant::now() + beat.saturating_sub(Duration::from_millis(10));
            tokio::time::sleep_until(next.min(stop_at).into()).await;
            if Instant::now() >= stop_at && crate::stop::request(&stop, StopReason::LeaseLost) {
                warn!("lease about to lapse; stopping the run before the coordinator declares it lost");
            }
            let sent = Instant::now();
            let budget = match stop_at.checked_duration_since(sent) {
                Some(left) if !left.is_zero() => left.min(beat),
                _ => beat,
            };
            // Every renewal renews exactly the lease we hold.
            let expect = Some(seq.unwrap_or(0));
            let renewed = tokio::time::timeout(
                budget,
                leases::renew(&ctx.bus, &key, &ctx.id, lease, expect),
            )
            .await;
            // Every other request of this loop is bounded by the same deadline: one that waits for
            // the client's own time-out while cut off would keep the run past its lease.
            let left = || {
                stop_at
                    .checked_duration_since(Instant::now())
                    .unwrap_or_default()
                    .min(beat)
            };
            let renewed_ok = matches!(renewed, Ok(Ok(_)));
            match renewed {
                Ok(Ok(s)) => {
                    last_ok = sent;
                    seq = Some(s);
                    watchdog.send_replace(watchdog_deadline(last_ok, lease, beat));
                }
                Ok(Err(BusError::Fenced { .. })) => {
                    match tokio::time::timeout(left(), leases::held_by(&ctx.bus, &key, &ctx.id))
                        .await
                    {
                        Ok(Ok(Some(s))) => seq = Some(s),
                        Ok(Ok(None)) => {
                            if crate::stop::request(&stop, StopReason::LeaseLost) {
                                warn!("the lease lapsed; stopping the run and never renewing it");
                            }
                            return;
                        }
                        Ok(Err(e)) => warn!(error = %e, "lease state unknown; retrying"),
                        Err(_) => warn!("lease state unknown (timed out); retrying"),
                    }
                }
                Ok(Err(e)) => warn!(error = %e, "lease renewal failed"),
                Err(_) => warn!("lease renewal timed out"),
            }
            // The fence check, only while NATS answers (a renewal just went through).
            let ours = *fence.borrow();
            if let (true, Some(ours)) = (renewed_ok, ours) {
                let read =
                    tokio::time::timeout(left(), turnpike_store::fence::last(&ctx.bus, &turn))
                        .await;
                if let Ok(Ok(last)) = read {
                    let why =
                        turnpike_core::fence::check(last.as_ref(), ours).map(StopReason::fenced);
                    if let Some(why) = why {
                        if crate::stop::request(&stop, why) {
                            warn!(?why, "the attempt's fence moved; stopping the run");
                        }
                    }
                }
            }
        }
    })
}

/// When the agent must be gone if its runner, whose last lease write that went through was sent
/// at `last_ok`, cannot stop it itself: half a heartbeat after the runner's own stop (so a live
/// runner stops its run first, and says why), half a heartbeat before the lease can lapse on
/// the server (whose time-to-live started no sooner than `last_ok`), so before the attempt can
/// be declared lost and retried.
pub(crate) fn watchdog_deadline(last_ok: Instant, lease: Duration, beat: Duration) -> Instant {
    last_ok + lease.saturating_sub(beat) + beat / 2
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_fires_after_the_runner_would_stop_and_before_the_lease_lapses() {
        let t = Instant::now();
        for (lease, beat) in [(6, 2), (15, 5), (4, 1), (1, 1)] {
            let (lease, beat) = (Duration::from_secs(lease), Duration::from_secs(beat));
            let d = watchdog_deadline(t, lease, beat);
            assert!(
                d > t + lease.saturating_sub(beat),
                "after the runner's own stop"
            );
            assert!(d < t + lease, "before the lease can lapse");
        }
    }

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        use turnpike_jetstream::ttl_secs;
        assert_eq!(ttl_secs(Duration::from_millis(1500)), "2s");
        assert_eq!(ttl_secs(Duration::from_secs(15)), "15s");
        assert_eq!(ttl_secs(Duration::from_millis(10)), "1s");
    }
}
