//! Dashboard sessions ended before their time (`turnpike_sessions`, key: the session's nonce,
//! value: when it would have expired, in Unix milliseconds). Sessions are signed, not stored: this
//! bucket holds only the logouts, each until the session would have expired anyway.

use async_nats::jetstream::kv;
use std::time::Duration;
use turnpike_core::subjects;
use turnpike_jetstream::BusError;

use crate::Bus;

/// Record that the session `nonce`, expiring at `expires_ms`, ended; kept for `ttl`.
pub async fn revoke(
    bus: &Bus,
    nonce: &str,
    expires_ms: u64,
    ttl: Duration,
) -> Result<(), BusError> {
    turnpike_jetstream::kv_put(
        &bus.js,
        subjects::BUCKET_SESSIONS,
        nonce,
        bytes::Bytes::from(expires_ms.to_string()),
        None,
        Some(ttl),
    )
    .await
    .map(|_| ())
}

/// Every session ended (those ended before now too), then each one that ends from now on.
pub async fn watch_revoked(bus: &Bus) -> Result<kv::Watch, BusError> {
    let store = bus
        .js
        .get_key_value(subjects::BUCKET_SESSIONS)
        .await
        .map_err(|e| BusError::bucket(subjects::BUCKET_SESSIONS, e))?;
    store
        .watch_with_history(">")
        .await
        .map_err(|e| BusError::kv("watch the ended sessions", e))
}

/// When a revoked session's entry says it would have expired; `None` if it is not a number.
pub fn expires_ms(entry: &kv::Entry) -> Option<u64> {
    std::str::from_utf8(&entry.value).ok()?.parse().ok()
}
