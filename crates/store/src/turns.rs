//! Turn records in the `turnpike_turns` bucket: read, create, apply an event with compare-and-set
//! (the effects it adds go to the record's outbox, which [`crate::outbox`] carries out). Shared by
//! the dispatcher (which creates turns) and the coordinator (which applies runner events).

use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};
use bytes::Bytes;
use tracing::debug;
use turnpike_core::chat::Joined;
use turnpike_core::lifecycle::{self, Effect, Event, EventOutcome, TransitionError, Unchanged};
use turnpike_core::{TurnId, TurnRecord};
use turnpike_jetstream::{decode_kv, now, Bus, BusError};

pub use crate::outbox::{admit, execute, is_listed, run_outbox, run_owed, unlist_live};

/// A record and the KV revision it was read at.
#[derive(Debug, Clone)]
pub struct Versioned {
    pub record: TurnRecord,
    pub revision: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("turn {0} is not in the turns bucket")]
    UnknownTurn(TurnId),
    #[error("turn record {turn} cannot be read: {source}")]
    BadRecord {
        turn: TurnId,
        #[source]
        source: turnpike_core::codec::CodecError,
    },
    #[error(transparent)]
    Transition(#[from] TransitionError),
    #[error("event from runner {runner} for {turn} attempt {attempt}, whose claim is {holder}")]
    NotClaimant {
        turn: TurnId,
        attempt: u32,
        runner: turnpike_core::RunnerId,
        holder: String,
    },
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
        current: Versioned,
        effects: Vec<Effect>,
    },
    Unchanged(Unchanged, Versioned),
}

impl Applied {
    pub fn current(&self) -> &Versioned {
        match self {
            Applied::Changed { current, .. } | Applied::Unchanged(_, current) => current,
        }
    }
}

pub(crate) const CAS_ATTEMPTS: usize = 50;

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

/// Create a turn in its chat: the live index, the record (waiting), then its place in the chat's
/// order; if it is the chat's live turn it is admitted at once (attempt 1 dispatched). Every step
/// is idempotent, so a replayed inbound message (or a crash half-way) only completes what is
/// missing. Returns the record and whether this call created it.
///
/// `known_chat`: the chat record as the caller last read it, if it did (the join then writes
/// without reading it again).
pub async fn create_in_chat(
    bus: &Bus,
    record: TurnRecord,
    inbound_seq: Option<u64>,
    known_chat: Option<crate::chats::Snapshot>,
) -> Result<(Versioned, bool), ApplyError> {
    let turn = record.turn.clone();
    let chat = record.chat.clone();
    // Into the live index first: a turn is never live without being findable by the sweep. A
    // create, not a put: whether the turn was listed already tells a replay below whether its
    // end's effects may still be owed.
    let listed_here = match bus
        .live
        .create(turn.as_str(), Bytes::from(chat.to_string()))
        .await
    {
        Ok(_) => true,
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => false,
        Err(e) => return Err(BusError::kv(format!("index live turn {turn}"), e).into()),
    };
    // An idle chat's new message: joined first, so the record is created admitted (one write
    // where creating it waiting and admitting it took two). A dispatcher that dies after the
    // join leaves the chat's live turn without a record: the replay of its message, not acked,
    // finds the chat busy and takes the path below, which creates and admits it.
    let fast = match (inbound_seq, &known_chat) {
        (Some(seq), Some(snapshot)) => {
            crate::chats::join_if_idle(bus, &chat, &turn, seq, snapshot).await?
        }
        _ => None,
    };
    let joined_first = fast.is_some();
    let known_chat = if joined_first { None } else { known_chat };
    let (current, created) = match fast {
        Some(history) => create(bus, lifecycle::admitted_at_creation(&record, history)).await?,
        None => create(bus, record).await?,
    };
    if created && joined_first {
        return Ok((run_outbox(bus, current).await?, true));
    }
    if current.record.state.is_terminal() {
        // A replay of a message whose turn already ended: nothing more to do, but to make sure
        // it does not hold its chat, and to count its message taken (it may never have joined:
        // killed first), so the chat's next ones go. Found by the model checker: killed before
        // its join, joined, the dispatcher died before admitting it, and the replay left the
        // ended turn the chat's live one for good. `admit` of an ended turn releases it.
        admit(bus, &turn, Vec::new(), None).await?;
        if let Some(seq) = inbound_seq {
            crate::chats::inbound_taken(bus, &chat, seq).await?;
        }
        // Its end's effects: if it was still listed, they may be owed, and whoever unlists it
        // carries them out (the sweep, if its coordinator died). If it was not, they were
        // carried out: unlist it again, or the sweep would carry them out a second time.
        if listed_here {
            unlist_live(bus, &turn).await?;
        }
        return Ok((current, created));
    }
    match crate::chats::join(bus, &chat, &turn, inbound_seq, known_chat).await? {
        // Admitted at the revision just written: no read before the write.
        Joined::Live(history) => admit(bus, &turn, history, Some(current.clone())).await?,
        Joined::Waiting | Joined::Left => {}
        // The chat's queue filled up since the dispatcher looked: the turn cannot wait in it.
        Joined::Full { waiting } => {
            let reason = turnpike_core::wire::Refusal::QueueFull {
                waiting,
                max: bus.chat_queue,
            };
            let ended = abandon(bus, &turn, &reason.to_string()).await?;
            return Ok((ended, created));
        }
    }
    Ok((current, created))
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

/// End a turn that cannot go on because a step failed in a way no retry changes (a payload
/// NATS refuses, a queue that is full): [`Event::Abandoned`] (failed, the plain notice, the chat
/// flagged, the reason kept), and its effects carried out. If the record itself no longer fits
/// what NATS accepts, it is first stored [compacted](TurnRecord::compacted). A turn already
/// ended is left as it is.
pub async fn abandon(bus: &Bus, turn: &TurnId, reason: &str) -> Result<Versioned, ApplyError> {
    tracing::warn!(turn_id = %turn, reason = %turnpike_core::sizes::quote(reason), "ending the turn: a step failed for good");
    let event = Event::Abandoned {
        reason: reason.to_owned(),
    };
    let applied = match apply_event(bus, turn, &event).await {
        Err(ApplyError::Bus(e)) if !e.is_transient() => {
            compact(bus, turn).await?;
            apply_event(bus, turn, &event).await?
        }
        other => other?,
    };
    if let Applied::Changed { current, .. } = &applied {
        // For operators: the turn and why, beside every other input Turnpike gave up on.
        let record = encode(bus, &current.record).unwrap_or_default();
        turnpike_jetstream::dead_letter(
            &bus.js,
            "turn",
            reason,
            &format!("$KV.{}.{turn}", turnpike_core::subjects::BUCKET_TURNS),
            None,
            record,
        )
        .await;
    }
    run_owed(bus, applied).await
}

/// A turn whose record can never be created (NATS refuses it for good): it leaves its chat
/// (which an idle chat's message joins before its record is created) and the live index, and
/// the chat's next turn goes. `record` is the record that could not be created.
pub async fn withdraw(bus: &Bus, record: &TurnRecord) -> Result<(), ApplyError> {
    if let Some((next, history)) = crate::chats::release(bus, record, bus.history).await? {
        if next != record.turn {
            admit(bus, &next, history, None).await?;
        }
    }
    unlist_live(bus, &record.turn).await?;
    Ok(())
}

/// Store the turn's record [compacted](TurnRecord::compacted), by compare-and-set.
async fn compact(bus: &Bus, turn: &TurnId) -> Result<(), ApplyError> {
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
