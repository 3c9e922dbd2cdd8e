//! Runner presence (`turnpike_runners`, key: the runner id): what each runner says about itself
//! every heartbeat, with a server-side time-to-live, so a runner that dies disappears by itself.

use std::time::Duration;
use turnpike_core::wire::RunnerPresence;
use turnpike_core::{subjects, RunnerId};
use turnpike_jetstream::BusError;

use crate::Bus;

/// Say `presence` (a runner's own), expiring after `ttl` unless said again.
pub async fn announce(bus: &Bus, presence: &RunnerPresence, ttl: Duration) -> Result<(), BusError> {
    let value = bus.codec.encode(presence)?;
    turnpike_jetstream::kv_put(
        &bus.js,
        subjects::BUCKET_RUNNERS,
        presence.runner.as_str(),
        value.into(),
        None,
        Some(ttl),
    )
    .await
    .map(|_| ())
}

/// A runner going away says so at once, rather than letting its presence expire.
pub async fn withdraw(bus: &Bus, runner: &RunnerId) -> Result<(), BusError> {
    turnpike_jetstream::kv_delete(&bus.js, subjects::BUCKET_RUNNERS, runner.as_str(), None)
        .await
        .map(|_| ())
}

/// Whether `runner` is present (its presence has not expired).
pub async fn is_present(bus: &Bus, runner: &RunnerId) -> Result<bool, BusError> {
    match bus.runners.get(runner.as_str()).await {
        Ok(v) => Ok(v.is_some_and(|v| !v.is_empty())),
        Err(e) => Err(BusError::kv(format!("read runner {runner}'s presence"), e)),
    }
}

/// `runner`'s presence as it last said it; `None` if it has none (gone, or never there).
pub async fn presence(bus: &Bus, runner: &RunnerId) -> Result<Option<RunnerPresence>, BusError> {
    let what = || format!("read runner {runner}'s presence");
    match bus.runners.get(runner.as_str()).await {
        Ok(Some(v)) if !v.is_empty() => turnpike_jetstream::decode_kv(&v)
            .map(Some)
            .map_err(|e| BusError::kv(what(), e)),
        Ok(_) => Ok(None),
        Err(e) => Err(BusError::kv(what(), e)),
    }
}

/// This deployment's mark: when its runners bucket was made. Every NATS system Turnpike runs on
/// makes its own, so runners that share a Docker host never judge another deployment's
/// containers.
pub async fn deployment(bus: &Bus) -> Result<String, BusError> {
    let info = bus
        .runners
        .status()
        .await
        .map_err(|e| BusError::kv("read the runners bucket", e))?;
    Ok(info.info.created.unix_timestamp_nanos().to_string())
}
