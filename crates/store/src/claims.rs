//! Attempt claims (`turnpike_claims`, key `<turn>.<attempt>`). A claim is created once by the
//! runner that runs the attempt (or by a cancellation) and never changes: the bucket refuses a
//! second message on a key (`discard_new_per_subject`) and any roll-up, so not even a runner's
//! NATS user can replace one. Claims, like leases ([`crate::leases`]), are read from the stream
//! leader, so an acknowledged write is never missed.

use crate::Bus;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use bytes::Bytes;
use turnpike_core::subjects;
use turnpike_core::wire::{ClaimHolder, ClaimRecord};
use turnpike_core::{RunnerId, Timestamp, TurnId};
use turnpike_jetstream::{decode_kv, BusError};

/// A KV key's last message, as the stream leader has it.
#[derive(Debug, Clone)]
pub(crate) struct KvLast {
    pub(crate) seq: u64,
    /// When the server stored it.
    pub(crate) time: Timestamp,
    /// `None` for a delete or purge marker, the server's own marker of a lapsed TTL included.
    pub(crate) value: Option<Bytes>,
}

/// The last message of `key` in KV bucket `bucket`; `None` if the key has none at all.
pub(crate) async fn last_value(
    bus: &Bus,
    bucket: &str,
    key: &str,
) -> Result<Option<KvLast>, BusError> {
    let stream = bus
        .js
        .get_stream_no_info(format!("KV_{bucket}"))
        .await
        .map_err(|e| BusError::kv(format!("open the {bucket} stream"), e))?;
    match stream
        .get_last_raw_message_by_subject(&format!("$KV.{bucket}.{key}"))
        .await
    {
        Ok(m) => {
            let marker = m.payload.is_empty()
                || m.headers.get("Nats-Marker-Reason").is_some()
                || m.headers.get("KV-Operation").is_some();
            Ok(Some(KvLast {
                seq: m.sequence,
                time: Timestamp::from_system_time(std::time::SystemTime::from(m.time)),
                value: (!marker).then_some(m.payload),
            }))
        }
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(BusError::kv(format!("read {bucket}/{key}"), e)),
    }
}

/// What creating a claim came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The claim is the one given: this caller holds the attempt.
    Ours,
    /// Someone else's claim was there first (a runner, or a cancellation).
    Held(ClaimRecord),
}

/// Create `claim`, unless the attempt is claimed already. A create whose outcome is unknown (a
/// time-out, a connection lost before the acknowledgement) is settled by reading the claim back
/// from the stream leader: the claim as stored says whose it is. async-nats does a read of its
/// own after a failed create and calls the key "already existing" even when the write was ours,
/// so an existing key is never taken for another's without looking at who holds it.
pub async fn create(bus: &Bus, claim: &ClaimRecord) -> Result<Created, BusError> {
    let key = subjects::claim_key(&claim.turn, claim.attempt);
    let value = Bytes::from(bus.codec.encode(claim)?);
    let failed = match bus.claims.create(&key, value).await {
        Ok(_) => return Ok(Created::Ours),
        Err(e) => e,
    };
    let last = last_value(bus, subjects::BUCKET_CLAIMS, &key).await?;
    match last.and_then(|l| l.value) {
        Some(v) => match decode_kv::<ClaimRecord>(&v) {
            Ok(stored) if claim.is_same_claim(&stored) => Ok(Created::Ours),
            Ok(stored) => Ok(Created::Held(stored)),
            // Made by someone, unreadable: not ours.
            Err(e) => Err(BusError::kv(format!("read claim {key}"), e)),
        },
        // Not stored (yet): the create failed; the caller tries again later.
        None => Err(BusError::kv(format!("create claim {key}"), failed)),
    }
}

/// Who holds the claim of `attempt`, if anyone does.
pub async fn holder(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
) -> Result<Option<ClaimHolder>, BusError> {
    let key = subjects::claim_key(turn, attempt);
    let last = last_value(bus, subjects::BUCKET_CLAIMS, &key).await?;
    Ok(last
        .and_then(|l| l.value)
        .and_then(|v| decode_kv::<ClaimRecord>(&v).ok())
        .map(|c| c.holder))
}

/// What the claims bucket says of `attempt`, as the sweep judges it: unclaimed, cancelled by an
/// operator kill, or taken by a runner (a claim that does not decode was still made by someone,
/// so it counts as a runner's, judged by its lease: which, with no runner to look under, is
/// absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// Whose the claim is, as the sweep's decisions take it.
    pub claim: turnpike_core::recovery::Claim,
    /// The runner that holds it, if it is a runner's and decodes.
    pub runner: Option<RunnerId>,
}

/// Read attempt `attempt`'s claim from the stream leader, as [`Claimed`] says.
pub async fn claim(bus: &Bus, turn: &TurnId, attempt: u32) -> Result<Claimed, BusError> {
    use turnpike_core::recovery::Claim;
    let key = subjects::claim_key(turn, attempt);
    let last = last_value(bus, subjects::BUCKET_CLAIMS, &key).await?;
    Ok(match last.and_then(|l| l.value) {
        None => Claimed {
            claim: Claim::None,
            runner: None,
        },
        Some(v) => match decode_kv::<ClaimRecord>(&v).map(|c| c.holder) {
            Ok(ClaimHolder::Cancelled) => Claimed {
                claim: Claim::Cancelled,
                runner: None,
            },
            Ok(ClaimHolder::Runner { runner }) => Claimed {
                claim: Claim::Runner,
                runner: Some(runner),
            },
            Err(_) => Claimed {
                claim: Claim::Runner,
                runner: None,
            },
        },
    })
}
