//! Leases (`turnpike_leases`): a runner's heartbeat per running attempt, one key per attempt and
//! runner, with a server-side time-to-live, so whether a lease lapsed is judged by the server's
//! clock, never by comparing hosts' clocks. The runner writes and renews it; the sweep reads it
//! and, when it declares the attempt lost, leaves a marker on its key. A lease is written by the
//! claimant alone (its key names it, and only its user may write there) a heartbeat after the
//! claim (a shorter run writes none), and renewed until the exit is reported.

use bytes::Bytes;
use std::time::Duration;
use turnpike_core::{subjects, RunnerId, Timestamp, TurnId};
use turnpike_jetstream::BusError;

use crate::claims::{last_value, KvLast};
use crate::Bus;

/// Write `runner`'s lease on `key`, expiring after `ttl` unless renewed: with `expect`, only if
/// the key's last sequence is still that one (0: no trace of the key at all), else
/// [`BusError::Fenced`]. Returns the new sequence.
pub async fn renew(
    bus: &Bus,
    key: &str,
    runner: &RunnerId,
    ttl: Duration,
    expect: Option<u64>,
) -> Result<u64, BusError> {
    let value = Bytes::from(runner.to_string());
    turnpike_jetstream::kv_put(
        &bus.js,
        subjects::BUCKET_LEASES,
        key,
        value,
        expect,
        Some(ttl),
    )
    .await
}

/// `Some(seq)` if the key's last value is still `runner`'s live lease (a renewal whose ack was
/// missed), `None` if it lapsed or is someone else's.
pub async fn held_by(bus: &Bus, key: &str, runner: &RunnerId) -> Result<Option<u64>, BusError> {
    let last = last_value(bus, subjects::BUCKET_LEASES, key).await?;
    Ok(last
        .filter(|l| l.value.as_deref() == Some(runner.as_str().as_bytes()))
        .map(|l| l.seq))
}

/// An attempt's lease, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Renewed within its TTL.
    Live,
    /// The server removed it when its TTL ran out, or the sweep took it away, at this time (by
    /// the server's clock): a marker is left.
    Lapsed(Timestamp),
    /// No trace of one: not written yet (a run's first heartbeat), or lapsed so long ago that
    /// its marker expired too. Only time tells which ([`turnpike_core::recovery::absent_lease`]).
    Absent,
}

/// `runner`'s lease on `attempt`. Only that runner writes it (the key names it), so a marker
/// means its lease lapsed (judged by the server: no clocks compared) or was taken away.
pub async fn state(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
    runner: &RunnerId,
) -> Result<Lease, BusError> {
    let key = subjects::lease_key(turn, attempt, runner);
    Ok(
        match last_value(bus, subjects::BUCKET_LEASES, &key).await? {
            Some(KvLast { value: Some(_), .. }) => Lease::Live,
            Some(KvLast { time, .. }) => Lease::Lapsed(time),
            None => Lease::Absent,
        },
    )
}

/// Leave a marker on attempt `attempt`'s lease key, held by `runner`, that expires after `ttl`:
/// a runner that could still write its first lease finds it and stops, and one whose lease came
/// back meanwhile loses it at its next renewal.
pub async fn mark_lost(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
    runner: &RunnerId,
    ttl: Duration,
) -> Result<(), BusError> {
    turnpike_jetstream::kv_delete(
        &bus.js,
        subjects::BUCKET_LEASES,
        &subjects::lease_key(turn, attempt, runner),
        Some(ttl),
    )
    .await
    .map(|_| ())
}
