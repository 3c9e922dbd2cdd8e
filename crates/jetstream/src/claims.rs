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
