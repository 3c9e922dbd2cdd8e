//! The live index (`turnpike_live`): one key per turn not yet ended, so the sweep and the
//! operator views find every live turn without reading every turn ever stored. A turn enters
//! before its record is created and leaves after its end's effects are carried out.

use async_nats::jetstream::kv::{CreateErrorKind, Operation};
use bytes::Bytes;
use std::time::{Duration, SystemTime};
use turnpike_core::{ChatId, TurnId};
use turnpike_jetstream::BusError;

use crate::Bus;

/// How long the purge marker of an ended turn stays in the live index. Long enough for a sweep
/// that listed the key just before to see it gone; short, so the sweep's listing grows with live
/// turns only, never with the turns that ended in the bucket's lifetime.
const MARKER_TTL: Duration = Duration::from_secs(60);

/// List `turn` (of `chat`) as live. `false` if it was listed already: a replay of its creation.
pub async fn enlist(bus: &Bus, turn: &TurnId, chat: &ChatId) -> Result<bool, BusError> {
    match bus
        .live
        .create(turn.as_str(), Bytes::from(chat.to_string()))
        .await
    {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(BusError::kv(format!("index live turn {turn}"), e)),
    }
}

/// Drop a turn from the live index, leaving a purge marker that expires by itself.
pub async fn unlist(bus: &Bus, turn: &TurnId) -> Result<(), BusError> {
    drop_key(bus, turn.as_str()).await
}

/// Drop a key that names no turn at all (written by hand, or by a bug).
pub async fn drop_key(bus: &Bus, key: &str) -> Result<(), BusError> {
    bus.live
        .purge_with_ttl(key, MARKER_TTL)
        .await
        .map_err(|e| BusError::kv(format!("drop {key} from live index"), e))
}

/// The keys of the live index as they stand now (malformed ones included: the caller decides).
pub async fn keys(bus: &Bus) -> Result<Vec<String>, BusError> {
    crate::bus::keys(&bus.live, "live turns").await
}

/// Is the turn in the live index (not ended, or ended with effects perhaps still owed)?
pub async fn is_listed(bus: &Bus, turn: &TurnId) -> Result<bool, BusError> {
    Ok(listed_at(bus, turn).await?.is_some())
}

/// When `turn` was listed, by the server's clock; `None` if it is not listed.
pub async fn listed_at(bus: &Bus, turn: &TurnId) -> Result<Option<SystemTime>, BusError> {
    match bus.live.entry(turn.as_str()).await {
        Ok(Some(e)) if e.operation == Operation::Put => Ok(Some(e.created.into())),
        Ok(_) => Ok(None),
        Err(e) => Err(BusError::kv(format!("read live turn {turn}"), e)),
    }
}
