//! Attempt claims (`turnpike_claims`, key `<turn>.<attempt>`): created once by the runner that
//! runs the attempt (or by a cancellation), never changed. Read here from the stream leader, so a
//! claim whose create was acknowledged is never missed.

use crate::{decode_kv, Bus, BusError};
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use turnpike_core::subjects;
use turnpike_core::wire::{ClaimHolder, ClaimRecord};
use turnpike_core::TurnId;

/// Who holds the claim of `attempt`, if anyone does.
pub async fn holder(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
) -> Result<Option<ClaimHolder>, BusError> {
    let key = subjects::claim_key(turn, attempt);
    let stream = bus
        .js
        .get_stream_no_info(format!("KV_{}", subjects::BUCKET_CLAIMS))
        .await
        .map_err(|e| BusError::kv("open the claims stream", e))?;
    match stream
        .get_last_raw_message_by_subject(&format!("$KV.{}.{key}", subjects::BUCKET_CLAIMS))
        .await
    {
        Ok(m) if m.payload.is_empty() => Ok(None),
        Ok(m) => Ok(decode_kv::<ClaimRecord>(&m.payload).ok().map(|c| c.holder)),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(BusError::kv(format!("read claim {key}"), e)),
    }
}

/// An attempt's lease (`turnpike_leases`, same key as its claim), as the stream leader has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Renewed within its TTL.
    Live,
    /// The server removed it when its TTL ran out, at this time (by the server's clock); or no
    /// trace of it is left (`None`: its marker expired too).
    Lapsed(Option<turnpike_core::Timestamp>),
}

/// The lease of `attempt`. A runner creates it before it claims the attempt, so for a claimed
/// attempt a lease that is not live has lapsed, judged by the server: no clocks compared.
pub async fn lease(bus: &Bus, turn: &TurnId, attempt: u32) -> Result<Lease, BusError> {
    let key = subjects::claim_key(turn, attempt);
    let stream = bus
        .js
        .get_stream_no_info(format!("KV_{}", subjects::BUCKET_LEASES))
        .await
        .map_err(|e| BusError::kv("open the leases stream", e))?;
    match stream
        .get_last_raw_message_by_subject(&format!("$KV.{}.{key}", subjects::BUCKET_LEASES))
        .await
    {
        Ok(m) => {
            let marker = m.payload.is_empty()
                || m.headers.get("Nats-Marker-Reason").is_some()
                || m.headers.get("KV-Operation").is_some();
            Ok(if marker {
                Lease::Lapsed(Some(turnpike_core::Timestamp::from_system_time(
                    std::time::SystemTime::from(m.time),
                )))
            } else {
                Lease::Live
            })
        }
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(Lease::Lapsed(None)),
        Err(e) => Err(BusError::kv(format!("read lease {key}"), e)),
    }
}
