//! Creating a turn and applying one event to it: the lifecycle table.

use crate::ids::TurnId;
use crate::record::{
    AttemptRecord, NoticeKind, NoticeRecord, Outcome, OutcomeReason, TurnRecord, TurnState,
};
use crate::texts;
use crate::time::Timestamp;
use crate::wire::{ChatErrorCause, ExitClass, HistoryEntry, InboundMessage, OperatorAction};
use crate::FORMAT_VERSION;
use std::time::Duration;

use super::{next_outbox, Effect, Event, Step, TransitionError, Unchanged};

/// What the dispatcher knows when it creates a turn.
#[derive(Debug, Clone)]
pub struct NewTurn {
    /// The new turn's id (derived from its message's).
    pub turn: TurnId,
    /// The message that makes the turn.
    pub message: InboundMessage,
    /// The chat's history when the turn was created.
    pub history: Vec<HistoryEntry>,
    /// `MAX_TURN_RETRY` now: fixed in the record for the turn's life.
    pub max_turn_retry: u32,
    /// The retry delay now: fixed in the record too.
    pub retry_delay: Duration,
    /// The turn this one re-runs, if an operator asked for a re-run.
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
    let handled = match event {
        Event::Admitted { history } => admitted(&mut r, history),
        Event::Started {
            attempt,
            runner,
            published_at,
        } => started(&mut r, *attempt, runner, *published_at, now)?,
        Event::MessageLanded {
            attempt,
            seq,
            stream_seq,
        } => message_landed(&mut r, *attempt, *seq, *stream_seq)?,
        Event::Exited { attempt, report } => exited(&mut r, *attempt, report, now)?,
        Event::KillRequested { action } => kill_requested(&mut r, action, now),
        Event::Abandoned { reason } => abandoned(&mut r, reason, now),
    };
    Ok(match handled {
        Handled::Unchanged(u) => Step::Unchanged(u),
        Handled::Changed(effects) => {
            r.updated_at = now;
            Step::Changed {
                record: Box::new(r),
                effects,
            }
        }
    })
}

/// What one event did to the record: changed it, owing these effects, or left it as it was.
enum Handled {
    Changed(Vec<Effect>),
    Unchanged(Unchanged),
}

/// The event is already reflected, or comes after the turn ended.
fn unchanged_for_state(state: TurnState) -> Handled {
    Handled::Unchanged(if state.is_terminal() {
        Unchanged::AlreadyEnded { state }
    } else {
        Unchanged::Duplicate
    })
}

/// The chat's turn before this one ended: this one may start, with the chat's history.
fn admitted(r: &mut TurnRecord, history: &[HistoryEntry]) -> Handled {
    if r.state != TurnState::Waiting {
        return unchanged_for_state(r.state);
    }
    r.history = history.to_vec();
    Handled::Changed(admit(r))
}

/// The current attempt's agent started on `runner`.
fn started(
    r: &mut TurnRecord,
    attempt: u32,
    runner: &crate::ids::RunnerId,
    published_at: Timestamp,
    now: Timestamp,
) -> Result<Handled, TransitionError> {
    if let Some(u) = fence(r, attempt)? {
        return Ok(Handled::Unchanged(u));
    }
    let a = r.current_attempt_mut();
    match &a.runner {
        Some(recorded) if recorded == runner => {
            return Ok(Handled::Unchanged(Unchanged::Duplicate))
        }
        Some(recorded) => {
            return Err(TransitionError::ConflictingRunner {
                attempt,
                recorded: recorded.clone(),
                claimed: runner.clone(),
            });
        }
        None => {}
    }
    a.runner = Some(runner.clone());
    a.started_at = Some(now);
    a.published_at = Some(published_at);
    Ok(running(r))
}

/// The current attempt is running: no retry is due any more.
fn running(r: &mut TurnRecord) -> Handled {
    r.state = TurnState::Running;
    r.next_attempt_due = None;
    Handled::Changed(Vec::new())
}

/// Bot message `seq` of the current attempt landed (sent by older runners of format version 1;
/// today's runners report the count in their exit; see docs/decisions.md).
fn message_landed(
    r: &mut TurnRecord,
    attempt: u32,
    seq: u32,
    stream_seq: Option<u64>,
) -> Result<Handled, TransitionError> {
    if seq == 0 {
        return Err(TransitionError::SeqZero);
    }
    if let Some(u) = fence(r, attempt)? {
        return Ok(Handled::Unchanged(u));
    }
    let a = r.current_attempt_mut();
    if a.messages_landed >= seq {
        return Ok(Handled::Unchanged(Unchanged::Duplicate));
    }
    a.messages_landed = seq;
    if let Some(at) = stream_seq {
        a.reply_span = Some(crate::wire::ReplySpan::with(a.reply_span, at));
    }
    Ok(running(r))
}

/// The current attempt ended as `report` says: done, retried, or given up ([`decide`]).
fn exited(
    r: &mut TurnRecord,
    attempt: u32,
    report: &crate::wire::ExitReport,
    now: Timestamp,
) -> Result<Handled, TransitionError> {
    if let Some(u) = fence(r, attempt)? {
        return Ok(Handled::Unchanged(u));
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
    let report = report.clone().bounded();
    a.exit = Some(report.clone());
    // The death is dated by `now`, the time of the event that reported it: the shells pass the
    // server's timestamp of that event, the same clock that fires the retry's schedule. The
    // runner's own `ended_at` is kept for operators, never used to decide.
    let mut effects = decide(r, report.class, now, now);
    // The workspace a run left is the chat's only when this exit, of the attempt that holds the
    // fence (`fence` above: never a superseded one), is clean and ends the turn answered or
    // silent: not killed (a kill moved the fence first), never a death (a retry starts from
    // what the first attempt saw).
    if let Some(object) = report.workspace {
        let clean_end = report.class == crate::wire::ExitClass::Clean
            && r.state == TurnState::Done
            && r.kill.is_none();
        if clean_end {
            let at = effects
                .iter()
                .position(|e| matches!(e, Effect::Ended { .. }))
                .unwrap_or(effects.len());
            // Before the turn ends: the chat's next turn is admitted with it.
            effects.insert(at, Effect::SaveWorkspace { attempt, object });
        }
    }
    Ok(Handled::Changed(effects))
}

/// An operator asked to kill the turn: a running attempt is fenced out and told; a turn not yet
/// running ends killed at once, its owed attempt cancelled.
fn kill_requested(r: &mut TurnRecord, action: &OperatorAction, now: Timestamp) -> Handled {
    match r.state {
        s if s.is_terminal() => unchanged_for_state(s),
        TurnState::Running => {
            if r.kill.is_some() {
                return Handled::Unchanged(Unchanged::Duplicate);
            }
            r.kill = Some(action.clone());
            Handled::Changed(vec![Effect::ForwardKill { attempt: r.attempt }])
        }
        TurnState::Waiting | TurnState::Queued | TurnState::PendingRetry => {
            r.kill = Some(action.clone());
            let mut effects = Vec::new();
            if r.attempt > 0 {
                effects.push(Effect::CancelAttempt { attempt: r.attempt });
            }
            let made = attempts_made(r);
            effects.extend(finish_after(
                r,
                TurnState::Killed,
                OutcomeReason::OperatorKilled,
                made,
                now,
            ));
            Handled::Changed(effects)
        }
        _ => unchanged_for_state(r.state),
    }
}

/// Attempts made so far: a pending retry's attempt is only scheduled, never made.
fn attempts_made(r: &TurnRecord) -> u32 {
    if r.state == TurnState::PendingRetry {
        r.attempt - 1
    } else {
        r.attempt
    }
}

/// A step of the turn failed in a way no retry changes: the turn ends failed, with `reason`.
fn abandoned(r: &mut TurnRecord, reason: &str, now: Timestamp) -> Handled {
    if r.state.is_terminal() {
        return unchanged_for_state(r.state);
    }
    let reason = crate::sizes::cut(reason, crate::sizes::REASON_MAX).into_owned();
    let mut effects = Vec::new();
    // Nothing of the turn may run or land from here on: an attempt that runs is fenced out and
    // told to stop; one owed is cancelled (its claim taken, its schedule dropped).
    match r.state {
        TurnState::Running => effects.push(Effect::ForwardKill { attempt: r.attempt }),
        TurnState::Queued | TurnState::PendingRetry => {
            effects.push(Effect::CancelAttempt { attempt: r.attempt })
        }
        _ => {}
    }
    let made = attempts_made(r);
    effects.extend(finish_after(
        r,
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
    Handled::Changed(effects)
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
