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

/// The raw subject of a key: KV puts are publishes, and only a raw publish carries `Nats-TTL`.
fn kv_subject(bucket: &str, key: &str) -> String {
    format!("$KV.{bucket}.{key}")
}

/// The TTL header takes whole seconds; round up so a lease never lasts less than configured.
fn ttl_secs(d: Duration) -> String {
    let secs = d.as_millis().div_ceil(1000).max(1);
    format!("{secs}s")
}

/// Put `value` under `key` in a TTL bucket, expiring after `ttl` unless renewed.
pub(crate) async fn put_with_ttl(
    inner: &Inner,
    bucket: &str,
    key: &str,
    ttl: Duration,
    value: Bytes,
) -> Result<(), BusError> {
    let subject = kv_subject(bucket, key);
    let mut headers = async_nats::HeaderMap::new();
    headers.insert("Nats-TTL", ttl_secs(ttl).as_str());
    inner
        .bus
        .js
        .publish_with_headers(subject.clone(), headers, value)
        .await
        .map_err(|e| BusError::publish(&subject, e))?
        .await
        .map_err(|e| BusError::publish(&subject, e))?;
    Ok(())
}

/// Renew the attempt's lease every heartbeat until dropped. If renewals keep failing until less than
/// one heartbeat of the lease is left, ask the run to stop (`LeaseLost`).
pub(crate) fn keep_alive(
    inner: Arc<Inner>,
    turn: TurnId,
    attempt: u32,
    stop: Arc<watch::Sender<Option<StopReason>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let key = subjects::claim_key(&turn, attempt);
        let lease = inner.config.lease;
        let beat = inner.config.heartbeat;
        let value = Bytes::from(inner.id.to_string());
        // The lease was created with the claim; renew it from here on. `last_ok` is when the
        // last renewal that succeeded was *sent*: the server's TTL started no earlier than that.
        let mut last_ok = Instant::now();
        loop {
            // Stop the run while one heartbeat of the lease is still left. Both the wait and the
            // renewal are bounded by that deadline: checking only between renewals could miss
            // it by a whole heartbeat plus a renewal time-out, and keep a zombie run past its
            // lease (seen in the fault suite with lease 6 s, heartbeat 2 s).
            let stop_at = last_ok + lease.saturating_sub(beat);
            let next = Instant::now() + beat.saturating_sub(Duration::from_millis(10));
            tokio::time::sleep_until(next.min(stop_at).into()).await;
            if Instant::now() >= stop_at {
                let asked = stop.send_if_modified(|s| {
                    if s.is_none() {
                        *s = Some(StopReason::LeaseLost);
                        true
                    } else {
                        false
                    }
                });
                if asked {
                    warn!("lease about to lapse; stopping the run before the coordinator declares it lost");
                }
            }
            let sent = Instant::now();
            let budget = match stop_at.checked_duration_since(sent) {
                Some(left) if !left.is_zero() => left.min(beat),
                _ => beat,
            };
            let renewed = tokio::time::timeout(
                budget,
                put_with_ttl(&inner, subjects::BUCKET_LEASES, &key, lease, value.clone()),
            )
            .await;
            match renewed {
                Ok(Ok(())) => last_ok = sent,
                Ok(Err(e)) => warn!(error = %e, "lease renewal failed"),
                Err(_) => warn!("lease renewal timed out"),
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
