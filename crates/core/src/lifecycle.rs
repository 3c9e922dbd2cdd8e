//! The turn lifecycle as a pure state machine: `apply(record, event, now) -> Step`.
//!
//! The record is the whole truth about a turn (the value in the `turnpike_turns` bucket). Shells turn
//! NATS and Docker IO into [`Event`]s and carry out the [`Effect`]s; nothing here does IO or reads a
//! clock. Invariants (checked by the property tests below):
//! - a turn never gets more than `max(MAX_TURN_RETRY, 1)` attempts;
//! - once terminal, a turn never changes state again, and it sends at most one notice;
//! - no attempt is dispatched after a bot message landed, after an operator kill, or after a clean exit;
//! - events that are duplicated, late, or for a superseded attempt change nothing.

use crate::ids::{RunnerId, TurnId};
pub use crate::record::*;
use crate::texts;
use crate::time::Timestamp;
use crate::wire::{
    ChatErrorCause, ExitClass, ExitReport, HistoryEntry, InboundMessage, OperatorAction,
};
use crate::FORMAT_VERSION;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What a shell tells the state machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The chat's earlier turn ended; this one may start. `history` is the chat's history as it is
    /// now (so it includes the earlier turn's reply): the snapshot every attempt will see.
    Admitted {
        #[serde(default)]
        history: Vec<HistoryEntry>,
    },
    /// A runner claimed the attempt and started it.
    Started {
        attempt: u32,
        runner: RunnerId,
        published_at: Timestamp,
    },
    /// A bot message of this attempt landed on the chat's outbound subject (`seq` from 1), stored
    /// at `stream_seq` of the outbound stream when the runner reported it.
    MessageLanded {
        attempt: u32,
        seq: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream_seq: Option<u64>,
    },
    /// The attempt ended (reported by its runner, or by the sweep as runner lost).
    Exited { attempt: u32, report: ExitReport },
    /// An operator asked to kill the turn.
    KillRequested { action: OperatorAction },
    /// A step of the turn failed in a way no retry can change (a payload NATS refuses as too
    /// large, a value it refuses as invalid, a message its chat cannot take): the turn ends
    /// failed, with the plain notice and its chat flagged, instead of being retried forever.
    Abandoned { reason: String },
}

/// What the state machine asks a shell to do. Every effect is idempotent (dedup ids derived from
/// turn and attempt), so carrying one out twice is harmless.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Effect {
    /// Publish the work item of `attempt`, now (`not_before` none) or scheduled at `not_before`.
    DispatchAttempt {
        attempt: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        not_before: Option<Timestamp>,
    },
    /// Send one notice to the chat.
    Notify {
        kind: NoticeKind,
        text: String,
        attempt: u32,
    },
    /// Flag the chat errored for operators.
    FlagChatErrored {
        reason: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<ChatErrorCause>,
    },
    /// Tell the runner of `attempt` to kill its container.
    ForwardKill { attempt: u32 },
    /// Make sure `attempt` never runs: cancel its schedule and take its claim.
    CancelAttempt { attempt: u32 },
    /// The turn reached a terminal state: drop it from the live index, let the chat's next turn go.
    Ended { state: TurnState },
}

impl Effect {
    /// Does `record` prove this effect carried out, or moot? Only an attempt that began proves
    /// its dispatch (its runner took the work item), or the turn's end makes it moot; only an
    /// attempt that exited makes its kill moot. Such effects leave the outbox with the next write of the record, so carrying out an
    /// outbox costs no write of its own; an ended turn's effects stay, and its removal from the
    /// live index is what says they were carried out.
    pub fn carried_out(&self, record: &TurnRecord) -> bool {
        let attempt = |n: u32| record.attempts.iter().find(|a| a.n == n);
        match self {
            // An ended turn runs no attempt: a dispatch still owed is moot (its attempt is
            // cancelled, or was never due).
            Effect::DispatchAttempt { .. } if record.state.is_terminal() => true,
            Effect::DispatchAttempt { attempt: n, .. } => attempt(*n)
                .is_some_and(|a| a.runner.is_some() || a.messages_landed > 0 || a.exit.is_some()),
            Effect::ForwardKill { attempt: n } => attempt(*n).is_some_and(|a| a.exit.is_some()),
            Effect::Notify { .. }
            | Effect::FlagChatErrored { .. }
            | Effect::CancelAttempt { .. }
            | Effect::Ended { .. } => false,
        }
    }
}

/// The outbox to store with `record` (the result of an apply): what is still owed of the
/// outbox it had, then `effects`.
pub fn next_outbox(record: &TurnRecord, effects: &[Effect]) -> Vec<Effect> {
    let mut outbox: Vec<Effect> = record
        .outbox
        .iter()
        .filter(|e| !e.carried_out(record))
        .cloned()
        .collect();
    outbox.extend(effects.iter().cloned());
    outbox
}

/// Why an event changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unchanged {
    /// Already applied.
    Duplicate,
    /// For an attempt that is no longer the current one.
    Superseded { attempt: u32, current: u32 },
    /// The turn had already ended.
    AlreadyEnded { state: TurnState },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Changed {
        record: Box<TurnRecord>,
        effects: Vec<Effect>,
    },
    Unchanged(Unchanged),
}

/// An event that cannot be right for this turn. The shell dead-letters it; the turn is untouched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("event for attempt {attempt}, but only attempt {current} was ever published")]
    FutureAttempt { attempt: u32, current: u32 },
    #[error("attempt numbers start at 1; got 0")]
    AttemptZero,
    #[error("event for attempt {attempt} while the turn is still waiting for its chat")]
    NotAdmitted { attempt: u32 },
    #[error("attempt {attempt} was started by runner {recorded}, but {claimed} claims it too")]
    ConflictingRunner {
        attempt: u32,
        recorded: RunnerId,
        claimed: RunnerId,
    },
    #[error("bot message sequence numbers start at 1; got 0")]
    SeqZero,
}

/// What the dispatcher knows when it creates a turn.
#[derive(Debug, Clone)]
pub struct NewTurn {
    pub turn: TurnId,
    pub message: InboundMessage,
    pub history: Vec<HistoryEntry>,
    pub max_turn_retry: u32,
    pub retry_delay: Duration,
    pub rerun_of: Option<TurnId>,
    /// The operator who asked for this turn (re-runs).
    pub created_by: Option<OperatorAction>,
    /// False when the chat has a live turn: the new one waits for [`Event::Admitted`].
    pub admit_now: bool,
}

/// Attempts a turn gets, the first included, under `MAX_TURN_RETRY`: 0 and 1 both mean one
/// attempt (retries off).
pub fn attempt_limit(max_turn_retry: u32) -> u32 {
    max_turn_retry.max(1)
}

/// A new turn record, and attempt 1 to dispatch if it may start now.
pub fn create(new: NewTurn, now: Timestamp) -> (TurnRecord, Vec<Effect>) {
    let max_attempts = attempt_limit(new.max_turn_retry);
    let mut record = TurnRecord {
        v: FORMAT_VERSION,
        turn: new.turn,
        chat: new.message.chat.clone(),
        message: new.message,
        history: new.history,
        max_turn_retry: new.max_turn_retry,
        max_attempts,
        retry_delay: new.retry_delay,
        created_at: now,
        updated_at: now,
        state: TurnState::Waiting,
        attempt: 0,
        retry_count: 0,
        next_attempt_due: None,
        attempts: Vec::new(),
        kill: None,
        outcome: None,
        notice: None,
        chat_flagged: false,
        rerun_of: new.rerun_of,
        created_by: new.created_by,
        rerun_request: None,
        outbox: Vec::new(),
    };
    let effects = if new.admit_now {
        admit(&mut record)
    } else {
        Vec::new()
    };
    (record, effects)
}

/// A new turn's record as created when its chat was idle at its join: the waiting record with
/// [`Event::Admitted`] applied (attempt 1 owed in its outbox), written once instead of twice.
/// Anything but a waiting record is returned as it is.
pub fn admitted_at_creation(record: &TurnRecord, history: Vec<HistoryEntry>) -> TurnRecord {
    match apply(record, &Event::Admitted { history }, record.created_at) {
        Ok(Step::Changed { record, effects }) => {
            let mut record = *record;
            record.outbox = next_outbox(&record, &effects);
            record
        }
        _ => record.clone(),
    }
}

fn admit(r: &mut TurnRecord) -> Vec<Effect> {
    r.state = TurnState::Queued;
    r.attempt = 1;
    r.attempts.push(AttemptRecord::new(1));
    vec![Effect::DispatchAttempt {
        attempt: 1,
        not_before: None,
    }]
}

/// Apply one event at `now`: the time the event happened by the one clock the shells use, the
/// server's (the coordinator passes the event message's stream timestamp). It stamps the record
/// and dates a death, from which the retry delay runs.
pub fn apply(record: &TurnRecord, event: &Event, now: Timestamp) -> Result<Step, TransitionError> {
    let mut r = record.clone();
    let effects = match event {
        Event::Admitted { history } => {
            if r.state != TurnState::Waiting {
                return Ok(unchanged_for_state(r.state));
            }
            r.history = history.clone();
            admit(&mut r)
        }
        Event::Started {
            attempt,
            runner,
            published_at,
        } => {
            if let Some(u) = fence(&r, *attempt)? {
                return Ok(Step::Unchanged(u));
            }
            let a = r.current_attempt_mut();
            match &a.runner {
                Some(recorded) if recorded == runner => {
                    return Ok(Step::Unchanged(Unchanged::Duplicate));
                }
                Some(recorded) => {
                    return Err(TransitionError::ConflictingRunner {
                        attempt: *attempt,
                        recorded: recorded.clone(),
                        claimed: runner.clone(),
                    });
                }
                None => {}
            }
            a.runner = Some(runner.clone());
            a.started_at = Some(now);
            a.published_at = Some(*published_at);
            r.state = TurnState::Running;
            r.next_attempt_due = None;
            Vec::new()
        }
        Event::MessageLanded {
            attempt,
            seq,
            stream_seq,
        } => {
            if *seq == 0 {
                return Err(TransitionError::SeqZero);
            }
            if let Some(u) = fence(&r, *attempt)? {
                return Ok(Step::Unchanged(u));
            }
            let a = r.current_attempt_mut();
            if a.messages_landed >= *seq {
                return Ok(Step::Unchanged(Unchanged::Duplicate));
            }
            a.messages_landed = *seq;
            if let Some(at) = stream_seq {
                a.reply_span = Some(crate::wire::ReplySpan::with(a.reply_span, *at));
            }
            r.state = TurnState::Running;
            r.next_attempt_due = None;
            Vec::new()
        }
        Event::Exited { attempt, report } => {
            if let Some(u) = fence(&r, *attempt)? {
                return Ok(Step::Unchanged(u));
            }
            let a = r.current_attempt_mut();
            // What landed is the larger of what we saw land and what the runner says landed.
            a.messages_landed = a.messages_landed.max(report.messages_landed);
            // Events are handled concurrently, so this report may come before the attempt's
            // MessageLanded events; both say truly where some of them are stored.
            a.reply_span = crate::wire::ReplySpan::union(a.reply_span, report.reply_span);
            if let (None, Some(start)) = (&a.runner, &report.started) {
                a.runner = Some(start.runner.clone());
                a.published_at = Some(start.published_at);
                a.started_at = start.started_at;
            }
            // Kept bounded whatever the runner sent: the record must fit NATS.
            a.exit = Some(report.clone().bounded());
            // The death is dated by `now`, the time of the event that reported it: the shells
            // pass the server's timestamp of that event, the same clock that fires the retry's
            // schedule. The runner's own `ended_at` is kept for operators, never used to decide.
            decide(&mut r, report.class, now, now)
        }
        Event::KillRequested { action } => match r.state {
            s if s.is_terminal() => return Ok(unchanged_for_state(s)),
            TurnState::Running => {
                if r.kill.is_some() {
                    return Ok(Step::Unchanged(Unchanged::Duplicate));
                }
                r.kill = Some(action.clone());
                vec![Effect::ForwardKill { attempt: r.attempt }]
            }
            TurnState::Waiting | TurnState::Queued | TurnState::PendingRetry => {
                r.kill = Some(action.clone());
                let mut effects = Vec::new();
                if r.attempt > 0 {
                    effects.push(Effect::CancelAttempt { attempt: r.attempt });
                }
                // A pending retry's attempt is only scheduled: it is cancelled, not made.
                let made = if r.state == TurnState::PendingRetry {
                    r.attempt - 1
                } else {
                    r.attempt
                };
                effects.extend(finish_after(
                    &mut r,
                    TurnState::Killed,
                    OutcomeReason::OperatorKilled,
                    made,
                    now,
                ));
                effects
            }
            _ => return Ok(unchanged_for_state(r.state)),
        },
        Event::Abandoned { reason } => {
            if r.state.is_terminal() {
                return Ok(unchanged_for_state(r.state));
            }
            let reason = crate::sizes::cut(reason, crate::sizes::REASON_MAX).into_owned();
            let mut effects = Vec::new();
            // Nothing of the turn may run or land from here on: an attempt that runs is fenced
            // out and told to stop; one owed is cancelled (its claim taken, its schedule
            // dropped). An attempt only scheduled was never made.
            let made = match r.state {
                TurnState::Running => {
                    effects.push(Effect::ForwardKill { attempt: r.attempt });
                    r.attempt
                }
                TurnState::Queued | TurnState::PendingRetry => {
                    effects.push(Effect::CancelAttempt { attempt: r.attempt });
                    if r.state == TurnState::PendingRetry {
                        r.attempt - 1
                    } else {
                        r.attempt
                    }
                }
                _ => r.attempt,
            };
            effects.extend(finish_after(
                &mut r,
                TurnState::Failed,
                OutcomeReason::PermanentError,
                made,
                now,
            ));
            if let Some(o) = r.outcome.as_mut() {
                o.error = Some(reason.clone());
            }
            for e in &mut effects {
                if let Effect::FlagChatErrored {
                    reason: flagged, ..
                } = e
                {
                    *flagged = reason.clone();
                }
            }
            effects
        }
    };
    r.updated_at = now;
    Ok(Step::Changed {
        record: Box::new(r),
        effects,
    })
}

/// What became of one event of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    Changed,
    Unchanged(Unchanged),
    Refused(TransitionError),
}

/// One turn's events applied in order, to be stored in one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The record after the last event that changed it, its outbox already the one to store
    /// ([`next_outbox`] after each step); `None` if no event changed it.
    pub record: Option<TurnRecord>,
    /// The effects the events added, in order.
    pub effects: Vec<Effect>,
    /// Each event's outcome, in the events' order.
    pub outcomes: Vec<EventOutcome>,
}

/// Apply `events` (each at its own time) one after another, as if each were written before the
/// next was applied. Stored in one write, a batch is the same as those writes with nobody
/// reading in between; the effects of an earlier event are carried out after the batch instead
/// of between its events, which changes nothing either: an effect leaves the outbox only when a
/// later event proves it carried out ([`Effect::carried_out`]).
pub fn apply_batch(record: &TurnRecord, events: &[(&Event, Timestamp)]) -> Batch {
    let mut batch = Batch {
        record: None,
        effects: Vec::new(),
        outcomes: Vec::with_capacity(events.len()),
    };
    for (event, now) in events {
        let current = batch.record.as_ref().unwrap_or(record);
        let outcome = match apply(current, event, *now) {
            Ok(Step::Changed {
                record: changed,
                effects,
            }) => {
                let mut changed = *changed;
                changed.outbox = next_outbox(&changed, &effects);
                batch.record = Some(changed);
                batch.effects.extend(effects);
                EventOutcome::Changed
            }
            Ok(Step::Unchanged(why)) => EventOutcome::Unchanged(why),
            Err(e) => EventOutcome::Refused(e),
        };
        batch.outcomes.push(outcome);
    }
    batch
}

fn unchanged_for_state(state: TurnState) -> Step {
    if state.is_terminal() {
        Step::Unchanged(Unchanged::AlreadyEnded { state })
    } else {
        Step::Unchanged(Unchanged::Duplicate)
    }
}

/// Fence an attempt-scoped event: `Some(reason)` when it must change nothing.
fn fence(r: &TurnRecord, attempt: u32) -> Result<Option<Unchanged>, TransitionError> {
    if attempt == 0 {
        return Err(TransitionError::AttemptZero);
    }
    if r.state == TurnState::Waiting {
        return Err(TransitionError::NotAdmitted { attempt });
    }
    if attempt > r.attempt {
        return Err(TransitionError::FutureAttempt {
            attempt,
            current: r.attempt,
        });
    }
    if r.state.is_terminal() {
        return Ok(Some(Unchanged::AlreadyEnded { state: r.state }));
    }
    if attempt < r.attempt {
        return Ok(Some(Unchanged::Superseded {
            attempt,
            current: r.attempt,
        }));
    }
    Ok(None)
}

/// The lifecycle table: how the current attempt's exit decides the turn.
fn decide(
    r: &mut TurnRecord,
    class: ExitClass,
    death_at: Timestamp,
    now: Timestamp,
) -> Vec<Effect> {
    let landed = r.any_landed();
    let killed = class == ExitClass::OperatorKilled
        || (r.kill.is_some() && (class.is_death() || class == ExitClass::CouldNotStart));
    if killed {
        return finish(r, TurnState::Killed, OutcomeReason::OperatorKilled, now);
    }
    match class {
        ExitClass::Clean if landed => finish(r, TurnState::Done, OutcomeReason::Replied, now),
        ExitClass::Clean => finish(r, TurnState::Done, OutcomeReason::SilentTurn, now),
        ExitClass::AgentFailed => finish(r, TurnState::Failed, OutcomeReason::AgentFailed, now),
        ExitClass::CouldNotStart if landed => {
            finish(r, TurnState::Failed, OutcomeReason::DiedAfterReply, now)
        }
        ExitClass::CouldNotStart => finish(r, TurnState::Failed, OutcomeReason::CouldNotStart, now),
        _ if landed => finish(r, TurnState::Failed, OutcomeReason::DiedAfterReply, now),
        _ if r.attempt < r.max_attempts => {
            let next = r.attempt + 1;
            let due = death_at.saturating_add(r.retry_delay);
            r.state = TurnState::PendingRetry;
            r.retry_count += 1;
            r.attempt = next;
            r.next_attempt_due = Some(due);
            let mut a = AttemptRecord::new(next);
            a.due_at = Some(due);
            a.preamble = Some(texts::retry_preamble(next, r.max_attempts));
            r.attempts.push(a);
            vec![Effect::DispatchAttempt {
                attempt: next,
                not_before: Some(due),
            }]
        }
        _ => finish(r, TurnState::GaveUp, OutcomeReason::BudgetSpent, now),
    }
}

/// Enter a terminal state: record the outcome, the one notice, the errored flag, and say so.
fn finish(
    r: &mut TurnRecord,
    state: TurnState,
    reason: OutcomeReason,
    now: Timestamp,
) -> Vec<Effect> {
    let made = r.attempt;
    finish_after(r, state, reason, made, now)
}

/// [`finish`], after `attempts` attempts were actually made.
fn finish_after(
    r: &mut TurnRecord,
    state: TurnState,
    reason: OutcomeReason,
    attempts: u32,
    now: Timestamp,
) -> Vec<Effect> {
    r.state = state;
    r.next_attempt_due = None;
    r.outcome = Some(Outcome {
        reason,
        at: now,
        attempts,
        error: None,
    });
    let notice = match reason {
        OutcomeReason::Replied | OutcomeReason::OperatorKilled => None,
        OutcomeReason::SilentTurn => {
            Some((NoticeKind::SilentTurn, texts::SILENT_TURN_NOTICE.to_owned()))
        }
        OutcomeReason::AgentFailed
        | OutcomeReason::CouldNotStart
        | OutcomeReason::DiedAfterReply
        | OutcomeReason::PermanentError => {
            Some((NoticeKind::Plain, texts::PLAIN_FAILURE_NOTICE.to_owned()))
        }
        OutcomeReason::BudgetSpent => Some((NoticeKind::GiveUp, texts::give_up_notice(attempts))),
    };
    let mut effects = Vec::new();
    if let Some((kind, text)) = notice {
        if r.notice.is_none() {
            r.notice = Some(NoticeRecord {
                kind,
                text: text.clone(),
                attempt: attempts,
                at: now,
            });
            effects.push(Effect::Notify {
                kind,
                text,
                attempt: attempts,
            });
        }
    }
    let flag = match reason {
        OutcomeReason::BudgetSpent => Some((
            ChatErrorCause::GaveUp,
            format!(
                "gave up after {}",
                crate::texts::count(attempts.into(), "attempt", "attempts")
            ),
        )),
        OutcomeReason::CouldNotStart => Some((
            ChatErrorCause::CouldNotStart,
            "agent could not start".to_owned(),
        )),
        // The reason is set by the caller ([`Event::Abandoned`]).
        OutcomeReason::PermanentError => {
            Some((ChatErrorCause::PermanentError, "permanent error".to_owned()))
        }
        _ => None,
    };
    if let Some((cause, reason)) = flag {
        r.chat_flagged = true;
        effects.push(Effect::FlagChatErrored {
            reason,
            cause: Some(cause),
        });
    }
    effects.push(Effect::Ended { state });
    effects
}

#[cfg(test)]
mod tests;
