//! The effect executor: carrying out what core decided for a turn (the effects in its outbox:
//! dispatch, notices, kills, the chat's next turn). Every effect is idempotent, so the sweep may
//! carry out an outbox again after a crash.
//!
//! Carrying out an outbox writes nothing to the record: an effect leaves the outbox with the
//! record's next write once the record proves it done (`Effect::carried_out`: a dispatch when
//! its attempt began), and an ended turn's outbox stays as it is, its removal from the live
//! index saying its effects were carried out (the sweep reads only listed turns).

use crate::turns::{
    apply_event, apply_event_from, compact, encode, Applied, ApplyError, Versioned,
};
use crate::Bus;
use bytes::Bytes;
use tracing::{debug, warn};
use turnpike_core::lifecycle::{Effect, Event, Unchanged};
use turnpike_core::subjects::{self, msg_id};
use turnpike_core::wire::{ClaimHolder, ClaimRecord, KillRequest, OutboundItem, OutboundKind};
use turnpike_core::{TurnId, TurnRecord, FORMAT_VERSION};
use turnpike_jetstream::{now, BusError, Publish};

/// Carry out every effect in the record's outbox; if the turn ended, then drop it from the live
/// index.
///
/// Ending a turn releases its chat; the chat's next turn is admitted and its outbox carried out
/// before this turn leaves the index, so a crash in between leaves this turn's `Ended` to be
/// carried out again (by the sweep), which releases the next turn again: never a chat left
/// waiting. The chain of turns is walked in a loop ([`admit_chain`]), not by recursing from an
/// effect.
pub async fn run_outbox(bus: &Bus, current: Versioned) -> Result<Versioned, ApplyError> {
    let mut next = Vec::new();
    for effect in &current.record.outbox {
        match carry_out(bus, &current.record, effect).await? {
            Carried::Done(released) => next.extend(released.map(|n| *n)),
            Carried::Abandon(reason) => {
                admit_chain(bus, next).await?;
                return Box::pin(abandon(bus, &current.record.turn, &reason)).await;
            }
        }
    }
    admit_chain(bus, next).await?;
    if current.record.state.is_terminal() {
        crate::live::unlist(bus, &current.record.turn).await?;
    }
    Ok(current)
}

/// Carry out what an apply left owed: the outbox of a record it changed; of one it did not
/// change, too (a writer may have died after its write), unless the turn ended and has left the
/// live index, whose effects were carried out already: a late duplicate event must not send its
/// notice again once the stream's duplicate window is past.
pub async fn run_owed(bus: &Bus, applied: Applied) -> Result<Versioned, ApplyError> {
    let current = match applied {
        Applied::Changed { current, .. } => return run_outbox(bus, current).await,
        Applied::Unchanged(_, current) => current,
    };
    if current.record.state.is_terminal()
        && !crate::live::is_listed(bus, &current.record.turn).await?
    {
        return Ok(current);
    }
    run_outbox(bus, current).await
}

/// The chat's next turn, released by a turn's end, to be admitted with the chat's history.
#[derive(Debug)]
struct NextTurn {
    turn: TurnId,
    history: Vec<turnpike_core::wire::HistoryEntry>,
    /// Its record as last written, if this process wrote it (the admission then needs no read).
    known: Option<Versioned>,
}

/// Let a waiting turn start, with the chat's history as it is now, and carry out its outbox
/// (and, if it ends at once, the same for the chat's turns after it). Idempotent: an admitted
/// turn ignores it. `known`: the turn's record as the caller last wrote it, if it did.
pub async fn admit(
    bus: &Bus,
    turn: &TurnId,
    history: Vec<turnpike_core::wire::HistoryEntry>,
    known: Option<Versioned>,
) -> Result<(), BusError> {
    admit_chain(
        bus,
        vec![NextTurn {
            turn: turn.clone(),
            history,
            known,
        }],
    )
    .await
}

/// Admit each released turn and carry out its outbox; a turn that ends on the way releases the
/// next, which joins the work list. A failure of one turn's own (not the bus) is logged: it must
/// not stop the chat's order for the others.
async fn admit_chain(bus: &Bus, mut work: Vec<NextTurn>) -> Result<(), BusError> {
    while let Some(NextTurn {
        turn,
        history,
        known,
    }) = work.pop()
    {
        let Some(admitted) = admit_one(bus, turn, history, known).await? else {
            continue;
        };
        for effect in &admitted.record.outbox {
            match carry_out(bus, &admitted.record, effect).await? {
                Carried::Done(released) => work.extend(released.map(|n| *n)),
                Carried::Abandon(reason) => {
                    let turn = &admitted.record.turn;
                    match Box::pin(abandon(bus, turn, &reason)).await {
                        Ok(_) => {}
                        Err(ApplyError::Bus(e)) => return Err(e),
                        Err(e) => warn!(turn_id = %turn, error = %e, "could not end the turn"),
                    }
                    break;
                }
            }
        }
    }
    Ok(())
}

/// What became of one effect.
enum Carried {
    /// Carried out (or, failing for good, skipped); the chat's next turn, if it released one.
    Done(Option<Box<NextTurn>>),
    /// The turn's next attempt cannot be published, ever: the turn is to be ended.
    Abandon(String),
}

/// Carry out one effect. A transient failure is the caller's to retry; one that no retry
/// changes (a payload NATS refuses) never loops: a dispatch that can never be published ends
/// the turn, and any other effect is skipped, logged (a notice, a flag, a kill message: the turn
/// is decided, and the chat moves on).
async fn carry_out(bus: &Bus, record: &TurnRecord, effect: &Effect) -> Result<Carried, BusError> {
    match execute_own(bus, record, effect).await {
        Ok(released) => Ok(Carried::Done(released.map(Box::new))),
        Err(e) if e.is_transient() => Err(e),
        Err(e) => match effect {
            Effect::DispatchAttempt { attempt, .. } if !record.state.is_terminal() => Ok(
                Carried::Abandon(format!("attempt {attempt} cannot be dispatched: {e}")),
            ),
            _ => {
                tracing::error!(turn_id = %record.turn, ?effect, error = %e, "an effect of the turn failed for good; skipped");
                Ok(Carried::Done(None))
            }
        },
    }
}

/// Apply `Admitted` to the chat's next turn; if that turn had already ended, release it and
/// try the one after. Returns the record of the turn admitted, whose outbox is to be carried out.
async fn admit_one(
    bus: &Bus,
    mut turn: TurnId,
    mut history: Vec<turnpike_core::wire::HistoryEntry>,
    mut known: Option<Versioned>,
) -> Result<Option<Versioned>, BusError> {
    loop {
        let admitted = Event::Admitted { history };
        let applied = match apply_event_from(bus, &turn, &admitted, now(), known.take()).await {
            Ok(a) => a,
            Err(ApplyError::Bus(e)) => return Err(e),
            Err(e) => {
                warn!(turn_id = %turn, error = %e, "could not admit the chat's next turn");
                return Ok(None);
            }
        };
        let Applied::Unchanged(Unchanged::AlreadyEnded { .. }, current) = &applied else {
            return Ok(Some(applied.current().clone()));
        };
        // Ended before it could start (killed between its creation and its joining the chat):
        // it must not hold its chat. Let it go, and admit the chat's next turn instead.
        debug!(turn_id = %turn, "the chat's next turn had already ended; releasing it");
        match crate::chats::release(bus, &current.record).await? {
            Some((next, h)) if next != turn => {
                turn = next;
                history = h;
            }
            _ => return Ok(None),
        }
    }
}

/// Who a kill of the turn's attempt is by: the operator who asked, or Turnpike itself when the
/// turn was ended for a permanent error.
fn killed_by(record: &TurnRecord) -> &str {
    match (&record.kill, &record.outcome) {
        (Some(k), _) => k.by.as_str(),
        (None, Some(o)) if o.reason == turnpike_core::record::OutcomeReason::PermanentError => {
            "turnpike"
        }
        (None, _) => "operator",
    }
}

async fn send_kill(bus: &Bus, record: &TurnRecord, attempt: u32) -> Result<(), BusError> {
    let turn = &record.turn;
    let kill = KillRequest {
        v: FORMAT_VERSION,
        turn: turn.clone(),
        attempt,
        by: killed_by(record).to_owned(),
    };
    bus.client
        .publish(subjects::kill(turn), Bytes::from(kill.to_json()))
        .await
        .map_err(|e| BusError::publish(subjects::kill(turn), e))
}

/// Carry out one effect of `record` (and, if it ends the turn, start the chat's next turn).
/// Idempotent: dedup ids, one schedule subject per attempt, CAS writes.
pub async fn execute(bus: &Bus, record: &TurnRecord, effect: &Effect) -> Result<(), BusError> {
    let next = execute_own(bus, record, effect).await?;
    admit_chain(bus, next.into_iter().collect()).await
}

/// Carry out one effect of `record`; returns the chat's next turn if ending this one released it.
async fn execute_own(
    bus: &Bus,
    record: &TurnRecord,
    effect: &Effect,
) -> Result<Option<NextTurn>, BusError> {
    match effect {
        Effect::DispatchAttempt {
            attempt,
            not_before,
        } => dispatch(bus, record, *attempt, *not_before).await?,
        Effect::Notify { text, attempt, .. } => notify(bus, record, *attempt, text).await?,
        Effect::FlagChatErrored { reason, cause } => {
            crate::chats::flag_errored(bus, record, reason, *cause).await?
        }
        Effect::ForwardKill { attempt } => {
            // The fence move is the kill: durable, and from it on nothing of the turn lands. The
            // plain message only makes the runner stop at once instead of at its next heartbeat.
            crate::fence::kill(bus, &record.turn, *attempt, killed_by(record)).await?;
            send_kill(bus, record, *attempt).await?;
        }
        Effect::CancelAttempt { attempt } => cancel(bus, record, *attempt).await?,
        Effect::SaveWorkspace { attempt, object } => {
            crate::workspaces::save(bus, record, *attempt, object).await?
        }
        Effect::Ended { state } => return end(bus, record, *state).await,
    }
    Ok(None)
}

/// Publish attempt `attempt` to the work stream: at once, or scheduled for `not_before`.
async fn dispatch(
    bus: &Bus,
    record: &TurnRecord,
    attempt: u32,
    not_before: Option<turnpike_core::Timestamp>,
) -> Result<(), BusError> {
    let turn = &record.turn;
    let mut work = record.work_item(attempt);
    // The chat's profile now, at this attempt's dispatch: a retry runs with what an operator
    // moved the chat to since its first attempt. (A name too long for any profile is cut; the
    // runner refuses a name it does not know.)
    work.profile = crate::profiles::of_chat(bus, &record.chat)
        .await?
        .map(|name| {
            turnpike_core::sizes::cut(&name, turnpike_core::wire::PROFILE_NAME_MAX).into_owned()
        });
    // Where the chat's workspace is (the same for every attempt of the turn: a chat runs one
    // turn at a time, and only its clean end saves another). Read only where profiles give
    // workspaces.
    if bus.workspaces_used {
        work.workspace = crate::workspaces::of_chat(bus, &record.chat)
            .await?
            .map(|w| w.current);
    }
    let run_subject = subjects::work_run(turn);
    let publish = match not_before {
        // A scheduled message loses its Nats-Msg-Id when it fires; the per-attempt claim stops
        // a second run instead.
        Some(at) => Publish::new(bus.codec, subjects::work_schedule(turn, attempt), &work)?
            .schedule_at(at, &run_subject),
        None => Publish::new(bus.codec, run_subject, &work)?.msg_id(&msg_id::work(turn, attempt)),
    };
    publish
        .header(subjects::HDR_TURN, turn.as_str())
        .header(subjects::HDR_ATTEMPT, &attempt.to_string())
        .send(&bus.js)
        .await?;
    Ok(())
}

/// Tell the chat `text` (a retry's or a give-up's notice): once per turn, by its dedup id.
async fn notify(bus: &Bus, record: &TurnRecord, attempt: u32, text: &str) -> Result<(), BusError> {
    let item = OutboundItem {
        v: FORMAT_VERSION,
        kind: OutboundKind::Notice,
        chat: record.chat.clone(),
        turn: record.turn.clone(),
        attempt,
        text: text.to_owned(),
        status_id: None,
        r#final: false,
    };
    publish_out(bus, &item, &msg_id::notice(&record.turn)).await
}

/// Drop attempt `attempt`'s schedule if it has not fired, and take its claim so no runner starts
/// it; a runner that holds it already is fenced out and told.
async fn cancel(bus: &Bus, record: &TurnRecord, attempt: u32) -> Result<(), BusError> {
    let turn = &record.turn;
    let stream = bus
        .js
        .get_stream(subjects::STREAM_WORK)
        .await
        .map_err(|e| BusError::kv("open work stream", e))?;
    stream
        .purge()
        .filter(subjects::work_schedule(turn, attempt))
        .await
        .map_err(|e| BusError::kv(format!("purge schedule of {turn}.{attempt}"), e))?;
    let claim = ClaimRecord {
        v: FORMAT_VERSION,
        turn: turn.clone(),
        attempt,
        holder: ClaimHolder::Cancelled,
        at: now(),
        token: None,
    };
    // A cancellation found cancelled already (its own, written before a crash, or another's) is
    // as good as one written now.
    let claimed = matches!(
        crate::claims::create(bus, &claim).await?,
        crate::claims::Created::Held(ClaimRecord {
            holder: ClaimHolder::Runner { .. },
            ..
        })
    );
    // A runner may hold the claim already, before or after taking the fence: the fence move
    // stops it either way (it takes the fence by compare-and-set).
    crate::fence::kill(bus, turn, attempt, killed_by(record)).await?;
    if claimed {
        debug!(%turn, attempt, "cancelled attempt was already claimed; its fence is moved and its runner told");
        send_kill(bus, record, attempt).await?;
    }
    Ok(())
}

/// The turn ended in `state`: close its live-progress message and release its chat. Returns
/// the chat's next turn, which the caller admits (no recursion into apply here).
async fn end(
    bus: &Bus,
    record: &TurnRecord,
    state: turnpike_core::TurnState,
) -> Result<Option<NextTurn>, BusError> {
    let turn = &record.turn;
    let last = OutboundItem {
        v: FORMAT_VERSION,
        kind: OutboundKind::Status,
        chat: record.chat.clone(),
        turn: turn.clone(),
        attempt: record.attempt,
        text: state.to_string(),
        status_id: Some(subjects::status_id(turn)),
        r#final: true,
    };
    publish_out(bus, &last, &msg_id::status_final(turn)).await?;
    Ok(match crate::chats::release(bus, record).await? {
        Some((next, history)) if &next != turn => Some(NextTurn {
            turn: next,
            history,
            known: None,
        }),
        _ => None,
    })
}

/// Publish `item` on its chat's output, with its dedup id and the headers readers filter by.
async fn publish_out(bus: &Bus, item: &OutboundItem, dedup: &str) -> Result<(), BusError> {
    Publish::new(bus.codec, subjects::chat_out(&item.chat), item)?
        .msg_id(dedup)
        .header(subjects::HDR_TURN, item.turn.as_str())
        .header(subjects::HDR_KIND, item.kind.as_str())
        .send(&bus.js)
        .await?;
    Ok(())
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
