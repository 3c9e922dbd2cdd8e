//! Turn records in the `turnpike_turns` bucket: read, create, apply an event with compare-and-set
//! (the effects it adds go to the record's outbox, which `outbox` carries out; a new turn joins
//! its chat through `admission`). Shared by the dispatcher (which creates turns) and the
//! coordinator (which applies runner events).

use crate::Bus;
use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};
use bytes::Bytes;
use tracing::debug;
use turnpike_core::lifecycle::{self, Effect, Event, EventOutcome, TransitionError, Unchanged};
use turnpike_core::{TurnId, TurnRecord};
use turnpike_jetstream::{decode_kv, now, BusError};

/// A record and the KV revision it was read at.
#[derive(Debug, Clone)]
pub struct Versioned {
    /// The record.
    pub record: TurnRecord,
    /// Its revision: a compare-and-set write expects it.
    pub revision: u64,
}

/// Why an event could not be applied to a turn.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// No record of the turn (never created, or expired after it ended).
    #[error("turn {0} is not in the turns bucket")]
    UnknownTurn(TurnId),
    /// A record that does not decode: its turn waits until it is repaired.
    #[error("turn record {turn} cannot be read: {source}")]
    BadRecord {
        /// The turn.
        turn: TurnId,
        /// The underlying error.
        #[source]
        source: turnpike_core::codec::CodecError,
    },
    /// The event is wrong for the turn (core's lifecycle refused it).
    #[error(transparent)]
    Transition(#[from] TransitionError),
    /// An event from a runner that does not hold the attempt's claim.
    #[error("event from runner {runner} for {turn} attempt {attempt}, whose claim is {holder}")]
    NotClaimant {
        /// The turn.
        turn: TurnId,
        /// The attempt.
        attempt: u32,
        /// Who sent the event.
        runner: turnpike_core::RunnerId,
        /// Who holds the claim, as stored.
        holder: String,
    },
    /// Reading or writing failed.
    #[error(transparent)]
    Bus(#[from] BusError),
}

impl ApplyError {
    /// May applying the same event succeed later (NAK and redeliver), or never (refuse it)?
    pub fn is_transient(&self) -> bool {
        matches!(self, ApplyError::Bus(e) if e.is_transient())
    }

    /// Did storing or carrying out the turn's own state fail for good (a payload NATS refuses,
    /// a request it finds invalid)? Then the turn is [abandoned](abandon), not retried forever.
    /// An event that is wrong for the turn is not: the event is refused, the turn goes on.
    pub fn ends_the_turn(&self) -> bool {
        matches!(self, ApplyError::Bus(e) if !e.is_transient())
    }
}

/// What applying an event did.
#[derive(Debug)]
pub enum Applied {
    /// The record changed; `effects` are the ones this event added to the outbox.
    Changed {
        /// The record as written.
        current: Versioned,
        /// The effects the event added.
        effects: Vec<Effect>,
    },
    /// The record was left as it was, for this reason; as read.
    Unchanged(Unchanged, Versioned),
}

impl Applied {
    /// The record as it stands after the event.
    pub fn current(&self) -> &Versioned {
        match self {
            Applied::Changed { current, .. } | Applied::Unchanged(_, current) => current,
        }
    }
}

pub(crate) const CAS_ATTEMPTS: usize = 50;

/// The turn's record and its revision, read from the bucket's leader; `None` if there is none.
pub async fn load(bus: &Bus, turn: &TurnId) -> Result<Option<Versioned>, ApplyError> {
    let entry = bus
        .turns
        .entry(turn.as_str())
        .await
        .map_err(|e| BusError::kv(format!("read turn {turn}"), e))?;
    let Some(entry) = entry else { return Ok(None) };
    if entry.value.is_empty() {
        // A delete or purge marker.
        return Ok(None);
    }
    let record = decode_kv::<TurnRecord>(&entry.value).map_err(|e| ApplyError::BadRecord {
        turn: turn.clone(),
        source: e,
    })?;
    Ok(Some(Versioned {
        record,
        revision: entry.revision,
    }))
}

pub(crate) fn encode(bus: &Bus, record: &TurnRecord) -> Result<Bytes, BusError> {
    Ok(Bytes::from(bus.codec.encode(record)?))
}

/// Write `record` if the turn is still at `revision`: its new revision, or `None` if another
/// writer was first. An ended turn's record is written with a TTL of `retention_turns`; until
/// then it has none (the bucket has no age limit), so a turn waiting in its chat, however long,
/// never expires while it waits.
async fn write(bus: &Bus, record: &TurnRecord, revision: u64) -> Result<Option<u64>, BusError> {
    let turn = &record.turn;
    let value = encode(bus, record)?;
    let written = if record.state.is_terminal() {
        turnpike_jetstream::kv_put(
            &bus.js,
            turnpike_core::subjects::BUCKET_TURNS,
            turn.as_str(),
            value,
            Some(revision),
            Some(bus.keep.ended_turns),
        )
        .await
    } else {
        match bus.turns.update(turn.as_str(), value, revision).await {
            Ok(r) => Ok(r),
            Err(e)
                if e.kind() == UpdateErrorKind::WrongLastRevision
                    || turnpike_jetstream::lost_cas(&e) =>
            {
                return Ok(None)
            }
            Err(e) => Err(BusError::kv(format!("update turn {turn}"), e)),
        }
    };
    match written {
        Ok(r) => Ok(Some(r)),
        Err(BusError::Fenced { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Store the turn's record [compacted](TurnRecord::compacted), by compare-and-set.
pub(crate) async fn compact(bus: &Bus, turn: &TurnId) -> Result<(), ApplyError> {
    for _ in 0..CAS_ATTEMPTS {
        let current = load(bus, turn)
            .await?
            .ok_or_else(|| ApplyError::UnknownTurn(turn.clone()))?;
        let small = current.record.compacted();
        if write(bus, &small, current.revision).await?.is_some() {
            return Ok(());
        }
    }
    Err(BusError::kv(format!("compact turn {turn}"), "still conflicting").into())
}

/// Create a turn record; if it exists already (a replayed inbound message), return the stored one.
pub async fn create(bus: &Bus, record: TurnRecord) -> Result<(Versioned, bool), ApplyError> {
    match bus
        .turns
        .create(record.turn.as_str(), encode(bus, &record)?)
        .await
    {
        Ok(revision) => Ok((Versioned { record, revision }, true)),
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            let existing = load(bus, &record.turn)
                .await?
                .ok_or_else(|| ApplyError::UnknownTurn(record.turn.clone()))?;
            Ok((existing, false))
        }
        Err(e) => Err(BusError::kv(format!("create turn {}", record.turn), e).into()),
    }
}

/// Apply `event` with compare-and-set: on a conflicting write, re-read and apply again. New
/// effects join whatever is still in the outbox, so a concurrent writer's effects are never lost.
pub async fn apply_event(bus: &Bus, turn: &TurnId, event: &Event) -> Result<Applied, ApplyError> {
    apply_event_from(bus, turn, event, now(), None).await
}

/// [`apply_event`] for an event that happened at `at` by the server's clock (a runner event's
/// stream timestamp, a lease's lapse): deaths are dated, and retries scheduled, by that clock.
pub async fn apply_event_at(
    bus: &Bus,
    turn: &TurnId,
    event: &Event,
    at: turnpike_core::Timestamp,
) -> Result<Applied, ApplyError> {
    apply_event_from(bus, turn, event, at, None).await
}

/// [`apply_event_at`] starting from `known`, the record at the revision the caller last wrote or
/// read: the write needs no read first, and a stale revision only fails it (then it reads, as
/// after any conflict). Every decision that writes nothing is made on a record read here, never
/// on `known`: a stale record could call a current event stale, and the event would be dropped.
pub async fn apply_event_from(
    bus: &Bus,
    turn: &TurnId,
    event: &Event,
    at: turnpike_core::Timestamp,
    known: Option<Versioned>,
) -> Result<Applied, ApplyError> {
    let batch = apply_events_from(bus, turn, &[(event, at)], known).await?;
    match (batch.outcomes.into_iter().next(), batch.applied) {
        (Some(EventOutcome::Refused(e)), _) => Err(e.into()),
        (_, Some(applied)) => Ok(applied),
        // Not reached: one event not refused leaves a record, changed or not.
        (_, None) => Err(ApplyError::UnknownTurn(turn.clone())),
    }
}

/// What applying a batch of one turn's events did.
#[derive(Debug)]
pub struct AppliedBatch {
    /// Each event's outcome, in order (a refused one is for the caller to dead-letter).
    pub outcomes: Vec<EventOutcome>,
    /// The record and what the batch added to its outbox; `None` if every event was refused.
    pub applied: Option<Applied>,
}

/// [`apply_event_from`] for several events of one turn, in order, stored in one write
/// ([`lifecycle::apply_batch`]: the same record and outcomes as a write per event).
pub async fn apply_events_from(
    bus: &Bus,
    turn: &TurnId,
    events: &[(&Event, turnpike_core::Timestamp)],
    mut known: Option<Versioned>,
) -> Result<AppliedBatch, ApplyError> {
    for _ in 0..CAS_ATTEMPTS {
        let (current, from_known) = match known.take() {
            Some(v) => (v, true),
            None => (
                load(bus, turn)
                    .await?
                    .ok_or_else(|| ApplyError::UnknownTurn(turn.clone()))?,
                false,
            ),
        };
        let batch = lifecycle::apply_batch(&current.record, events);
        // Refusals, too, only on a record read here.
        if from_known && batch.outcomes.iter().any(|o| *o != EventOutcome::Changed) {
            continue;
        }
        let Some(record) = batch.record else {
            let why = batch.outcomes.iter().rev().find_map(|o| match o {
                EventOutcome::Unchanged(why) => Some(why.clone()),
                _ => None,
            });
            return Ok(AppliedBatch {
                applied: why.map(|why| Applied::Unchanged(why, current)),
                outcomes: batch.outcomes,
            });
        };
        match write(bus, &record, current.revision).await? {
            Some(revision) => {
                return Ok(AppliedBatch {
                    outcomes: batch.outcomes,
                    applied: Some(Applied::Changed {
                        current: Versioned { record, revision },
                        effects: batch.effects,
                    }),
                })
            }
            None => {
                debug!(%turn, "turn record changed under us; re-reading");
                continue;
            }
        }
    }
    Err(BusError::kv(
        format!("update turn {turn}"),
        format!("still conflicting after {CAS_ATTEMPTS} tries"),
    )
    .into())
}
