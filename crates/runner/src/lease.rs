//! Leases: a runner's heartbeat per running attempt, in the `turnpike_leases` bucket with a
//! server-side TTL (judged by the server's clock, never by comparing hosts' clocks). A runner that
//! cannot renew for longer than the lease allows stops its own run first, so a runner cut off from
//! NATS never keeps a zombie attempt going after the coordinator may have declared it lost.

use crate::classify::StopReason;
use crate::Inner;
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::warn;
use turnpike_core::{subjects, TurnId};
use turnpike_jetstream::BusError;
use turnpike_store::claims;

/// The raw subject of a key: KV puts are publishes, and only a raw publish carries `Nats-TTL`.
fn kv_subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// The TTL header takes whole seconds; round up so a lease never lasts less than configured.
fn ttl_secs(d: Duration) -> String {
    let secs = d.as_millis().div_ceil(1000).max(1);
    format!("{secs}s")
}

/// Put `value` under `key` in a TTL bucket, expiring after `ttl` unless renewed; with
/// `expect`, only if the key's last sequence is still that one. Returns the new sequence.
pub(crate) async fn put_with_ttl(
    inner: &Inner,
    bucket: &str,
    key: &str,
    ttl: Duration,
    value: Bytes,
    expect: Option<u64>,
) -> Result<u64, BusError> {
    let subject = kv_subject(bucket, key);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-TTL", ttl_secs(ttl).as_str());
    if let Some(seq) = expect {
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            seq.to_string().as_str(),
        );
    }
    let ack = inner
        .bus
        .js
        .publish_with_headers(subject.clone(), headers, value)
        .await
        .map_err(|e| BusError::publish(&subject, e))?
        .await
        .map_err(|e| {
            use async_nats::jetstream::context::PublishErrorKind;
            if e.kind() == PublishErrorKind::WrongLastSequence || turnpike_jetstream::lost_cas(&e) {
                BusError::Fenced {
                    subject: subject.clone(),
                }
            } else {
                BusError::publish(&subject, e)
            }
        })?;
    Ok(ack.sequence)
}

/// `Some(seq)` if the lease key's last value is still our live lease (a write whose ack we
/// missed), `None` if it lapsed or is someone else's.
async fn still_ours(inner: &Inner, key: &str) -> Result<Option<u64>, BusError> {
    let last = claims::last_value(&inner.bus, subjects::BUCKET_LEASES, key).await?;
    Ok(last
        .filter(|l| l.value.as_deref() == Some(inner.id.as_str().as_bytes()))
        .map(|l| l.seq))
}

/// What taking an attempt's lease came to.
pub(crate) enum Taken {
    /// Ours, at this sequence.
    Ours(u64),
    /// Another runner holds a live lease on it: it is taking or running the attempt.
    Held,
}

/// Create the attempt's lease, before claiming it (so a claimed attempt without a live lease has
/// lost it to the server's TTL): expecting no lease yet, or the marker a lapsed one left.
pub(crate) async fn take(inner: &Inner, key: &str) -> Result<Taken, BusError> {
    let value = Bytes::from(inner.id.to_string());
    for round in 0..5 {
        // An attempt's lease is usually taken once, by one runner: first expect no lease at all
        // (the same compare-and-set a read finding none would lead to), and read only if that
        // fails.
        let expect = if round == 0 {
            0
        } else {
            match claims::last_value(&inner.bus, subjects::BUCKET_LEASES, key).await? {
                None => 0,
                Some(last) => match last.value {
                    None => last.seq,
                    // Ours already: a create whose ack we did not see.
                    Some(v) if v == value => return Ok(Taken::Ours(last.seq)),
                    Some(_) => return Ok(Taken::Held),
                },
            }
        };
        let lease = inner.config.lease;
        match put_with_ttl(
            inner,
            subjects::BUCKET_LEASES,
            key,
            lease,
            value.clone(),
            Some(expect),
        )
        .await
        {
            Ok(seq) => return Ok(Taken::Ours(seq)),
            Err(BusError::Fenced { .. }) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Taken::Held)
}

/// Hold the attempt's lease (taken at `seq` before the claim) until dropped, after the exit is
/// reported: renew it every heartbeat by compare-and-set, and stop the run (`LeaseLost`) while one
/// heartbeat of it is still left if renewals keep failing, or at once if it lapsed — a lapsed
/// lease is never renewed again, since the coordinator may have declared the attempt lost. Once
/// the attempt holds its fence (`fence`), each heartbeat also checks the fence is still its own, so
/// a kill or loss it missed on the wire still stops it.
pub(crate) fn keep_alive(
    inner: Arc<Inner>,
    turn: TurnId,
    attempt: u32,
    stop: Arc<watch::Sender<Option<StopReason>>>,
    fence: watch::Receiver<Option<u64>>,
    taken: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let key = subjects::claim_key(&turn, attempt);
        let lease = inner.config.lease;
        let beat = inner.config.heartbeat;
        let value = Bytes::from(inner.id.to_string());
        // `last_ok` is when the last renewal that succeeded was *sent*: the server's TTL started
        // no earlier than that. `seq` is the lease's sequence, none until it exists.
        let mut last_ok = Instant::now();
        let mut seq: Option<u64> = Some(taken);
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
                put_with_ttl(
                    &inner,
                    subjects::BUCKET_LEASES,
                    &key,
                    lease,
                    value.clone(),
                    expect,
                ),
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
                }
                Ok(Err(BusError::Fenced { .. })) => {
                    match tokio::time::timeout(left(), still_ours(&inner, &key)).await {
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
                    tokio::time::timeout(left(), turnpike_store::fence::last(&inner.bus, &turn))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1500)), "2s");
        assert_eq!(ttl_secs(Duration::from_secs(15)), "15s");
        assert_eq!(ttl_secs(Duration::from_millis(10)), "1s");
    }
}
