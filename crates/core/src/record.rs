//! The turn record: the value in the `turnpike_turns` bucket, everything that decides a turn.
//!
//! Data only; [`crate::lifecycle`] decides how it changes.

use crate::ids::{ChatId, RunnerId, TurnId};
use crate::time::{duration_ms, Timestamp};
use crate::wire::{
    ChatErrorCause, ExitReport, HistoryEntry, InboundMessage, OperatorAction, WorkItem,
};
use crate::FORMAT_VERSION;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Where a turn is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TurnState {
    /// Created, waiting for its chat's earlier turn to end (per-chat order).
    Waiting,
    /// The current attempt is published; no runner has reported starting it.
    Queued,
    /// A runner runs the current attempt.
    Running,
    /// The last attempt died empty-handed; the next one is scheduled for `next_attempt_due`.
    PendingRetry,
    /// Terminal: the run ended cleanly (with a reply, or with the silent-turn notice).
    Done,
    /// Terminal: failed and not retried (agent failure, could not start, died after replying).
    Failed,
    /// Terminal: every attempt died without a bot message.
    GaveUp,
    /// Terminal: an operator killed it.
    Killed,
}

impl TurnState {
    /// Ended: done, failed, gave up, or killed.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TurnState::Done | TurnState::Failed | TurnState::GaveUp | TurnState::Killed
        )
    }

    /// The state as the wire (and `nats kv get`) spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnState::Waiting => "waiting",
            TurnState::Queued => "queued",
            TurnState::Running => "running",
            TurnState::PendingRetry => "pending_retry",
            TurnState::Done => "done",
            TurnState::Failed => "failed",
            TurnState::GaveUp => "gave_up",
            TurnState::Killed => "killed",
        }
    }

    /// Every state, in lifecycle order.
    pub const ALL: [TurnState; 8] = [
        TurnState::Waiting,
        TurnState::Queued,
        TurnState::Running,
        TurnState::PendingRetry,
        TurnState::Done,
        TurnState::Failed,
        TurnState::GaveUp,
        TurnState::Killed,
    ];
}

impl std::fmt::Display for TurnState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is no turn state (an operator's filter, a command-line argument).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown turn state {0:?}; expected one of {names}", names = TurnState::names())]
pub struct UnknownTurnState(pub String);

impl TurnState {
    fn names() -> String {
        let all: Vec<_> = TurnState::ALL.iter().map(|s| s.as_str()).collect();
        all.join(", ")
    }
}

impl std::str::FromStr for TurnState {
    type Err = UnknownTurnState;
    fn from_str(s: &str) -> Result<Self, UnknownTurnState> {
        TurnState::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownTurnState(s.to_owned()))
    }
}

/// Why a terminal turn ended as it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeReason {
    /// The agent exited cleanly and a bot message landed.
    Replied,
    /// The agent exited cleanly without a bot message: done, not retried, the chat told so.
    SilentTurn,
    /// The agent reported failure cleanly (not retried).
    AgentFailed,
    /// The agent could not be started, for a reason no retry changes.
    CouldNotStart,
    /// The attempt died after a bot message had landed (not retried: a partial reply stands).
    DiedAfterReply,
    /// Every attempt died without a bot message: the budget is spent.
    BudgetSpent,
    /// An operator killed the turn.
    OperatorKilled,
    /// A step of the turn failed in a way no retry can change (a payload NATS refuses as too
    /// large, a value it refuses as invalid): the turn ended failed rather than retry forever.
    PermanentError,
}

impl OutcomeReason {
    /// The reason as the wire (and `nats kv get`) spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeReason::Replied => "replied",
            OutcomeReason::SilentTurn => "silent_turn",
            OutcomeReason::AgentFailed => "agent_failed",
            OutcomeReason::CouldNotStart => "could_not_start",
            OutcomeReason::DiedAfterReply => "died_after_reply",
            OutcomeReason::BudgetSpent => "budget_spent",
            OutcomeReason::OperatorKilled => "operator_killed",
            OutcomeReason::PermanentError => "permanent_error",
        }
    }
}

impl std::fmt::Display for OutcomeReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a terminal turn ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Outcome {
    /// Why.
    pub reason: OutcomeReason,
    /// When, by the server's clock.
    pub at: Timestamp,
    /// Attempts actually made.
    pub attempts: u32,
    /// For [`OutcomeReason::PermanentError`]: what failed, cut to
    /// [`crate::sizes::REASON_MAX`] encoded bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Which notice the chat got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NoticeKind {
    /// `⚠ Agent couldn't complete this request after N attempts.`
    GiveUp,
    /// The plain failure notice (a turn that failed after replying, or could not start).
    Plain,
    /// The notice of a turn that ended silent.
    SilentTurn,
}

/// The notice a turn sent its chat.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NoticeRecord {
    /// Which one.
    pub kind: NoticeKind,
    /// Its text, as sent.
    pub text: String,
    /// The attempt it followed.
    pub attempt: u32,
    /// When it was decided.
    pub at: Timestamp,
}

/// One attempt's history, kept in the turn record for operators (`turnpike turns show`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Its number, from 1.
    pub n: u32,
    /// When a retry was due (death time + retry delay); none for attempt 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_at: Option<Timestamp>,
    /// When the work item was stored in the work stream (for a retry: when its schedule fired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub published_at: Option<Timestamp>,
    /// When its agent started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// The runner that ran it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<RunnerId>,
    /// How it ended, as its runner (or the sweep) reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<ExitReport>,
    /// Bot messages it landed.
    pub messages_landed: u32,
    /// Where this attempt's bot messages are stored on the outbound stream (the first and last
    /// stream sequence), as their runner reported them: the turn's replies are read back from
    /// that range. Without it (a lost event) readers scan the chat's outbound subject instead.
    /// (Older records list every sequence, as `replies`; read as their span.)
    #[serde(
        default,
        alias = "replies",
        deserialize_with = "crate::wire::ReplySpan::deserialize_lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub reply_span: Option<crate::wire::ReplySpan>,
    /// The retry preamble its prompt began with (attempt 2 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preamble: Option<String>,
}

impl AttemptRecord {
    pub(crate) fn new(n: u32) -> Self {
        AttemptRecord {
            n,
            due_at: None,
            published_at: None,
            started_at: None,
            runner: None,
            exit: None,
            messages_landed: 0,
            reply_span: None,
            preamble: None,
        }
    }
}

/// The value in the `turnpike_turns` bucket: everything that decides a turn.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TurnRecord {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The turn's id.
    pub turn: TurnId,
    /// Its chat.
    pub chat: ChatId,
    /// The message that made it.
    pub message: InboundMessage,
    /// Conversation history as it was when the turn was created; every attempt sees the same.
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    /// `MAX_TURN_RETRY` when the turn was created.
    pub max_turn_retry: u32,
    /// `max(max_turn_retry, 1)`: attempts this turn may get. Fixed at creation, so a config change
    /// never alters a turn in flight.
    pub max_attempts: u32,
    /// The delay before a retry (`retry_delay`), fixed at creation.
    #[serde(with = "duration_ms", rename = "retry_delay_ms")]
    pub retry_delay: Duration,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
    /// Where it is in its life.
    pub state: TurnState,
    /// The current attempt: the latest one published or scheduled (0 while waiting).
    pub attempt: u32,
    /// Retries scheduled so far.
    pub retry_count: u32,
    /// When a pending retry is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_due: Option<Timestamp>,
    /// Every attempt made or scheduled, in order.
    #[serde(default)]
    pub attempts: Vec<AttemptRecord>,
    /// The operator's kill, if one was asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill: Option<OperatorAction>,
    /// How it ended, once it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<Outcome>,
    /// The notice sent to the chat, if one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notice: Option<NoticeRecord>,
    /// Whether the chat was flagged errored for it.
    #[serde(default)]
    pub chat_flagged: bool,
    /// The turn this one re-runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_of: Option<TurnId>,
    /// Set when an operator created the turn (a re-run): who and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<OperatorAction>,
    /// The id of the operator's request that created this re-run: the same request again finds
    /// this turn instead of making another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rerun_request: Option<String>,
    /// Effects decided but not yet confirmed carried out (transactional outbox). A shell that finds
    /// effects here carries them out again; each is idempotent by its dedup id.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outbox: Vec<Effect>,
}

impl crate::wire::Versioned for TurnRecord {
    fn version(&self) -> u16 {
        self.v
    }
}

fn v1() -> u16 {
    FORMAT_VERSION
}

/// Encoded bytes of the message text and of each error a compacted record keeps.
pub const COMPACT_TEXT_MAX: usize = 1024;
/// Attachments a compacted record lists.
pub const COMPACT_ATTACHMENTS: usize = 4;
impl TurnRecord {
    /// The current attempt's record.
    pub fn current_attempt(&self) -> Option<&AttemptRecord> {
        self.attempts.iter().find(|a| a.n == self.attempt)
    }

    pub(crate) fn current_attempt_mut(&mut self) -> &mut AttemptRecord {
        let n = self.attempt;
        if let Some(i) = self.attempts.iter().position(|a| a.n == n) {
            &mut self.attempts[i]
        } else {
            self.attempts.push(AttemptRecord::new(n));
            let last = self.attempts.len() - 1;
            &mut self.attempts[last]
        }
    }

    /// Did any bot message of this turn land, in any attempt?
    pub fn any_landed(&self) -> bool {
        self.attempts.iter().any(|a| a.messages_landed > 0)
    }

    /// The record made small enough to be stored whatever NATS accepts, for a turn that is ended
    /// because its full record could not be (a server or bucket with a lower limit than
    /// configured): the history is left out, the message text cut to [`COMPACT_TEXT_MAX`], the
    /// attachment list to its first [`COMPACT_ATTACHMENTS`], every error to [`COMPACT_TEXT_MAX`].
    /// What decides the turn (state, attempts, outcome, outbox) is kept.
    pub fn compacted(&self) -> TurnRecord {
        let cut = |text: &str| crate::sizes::cut(text, COMPACT_TEXT_MAX).into_owned();
        let mut r = self.clone();
        r.history = vec![crate::wire::HistoryEntry {
            role: crate::wire::Role::Note,
            text: "[history left out: the turn record had to be made smaller]".into(),
        }];
        r.message.text = cut(&r.message.text);
        r.message.attachments.truncate(COMPACT_ATTACHMENTS);
        for a in &mut r.attempts {
            a.preamble = None;
            if let Some(error) = a.exit.as_mut().and_then(|e| e.error.as_mut()) {
                *error = cut(error);
            }
        }
        r
    }

    /// The work item for `attempt`: the same message and history every time, the preamble from 2 on.
    pub fn work_item(&self, attempt: u32) -> WorkItem {
        WorkItem {
            v: FORMAT_VERSION,
            turn: self.turn.clone(),
            chat: self.chat.clone(),
            attempt,
            max_attempts: self.max_attempts,
            message: self.message.clone(),
            history: self.history.clone(),
            profile: None,
            workspace: None,
        }
    }
}

/// What the state machine asks a shell to do. Every effect is idempotent (dedup ids derived from
/// turn and attempt), so carrying one out twice is harmless.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Effect {
    /// Publish the work item of `attempt`, now (`not_before` none) or scheduled at `not_before`.
    DispatchAttempt {
        /// The attempt.
        attempt: u32,
        /// When to publish it (a retry's due time); now if none.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        not_before: Option<Timestamp>,
    },
    /// Send one notice to the chat.
    Notify {
        /// Which notice.
        kind: NoticeKind,
        /// Its text.
        text: String,
        /// The attempt it follows.
        attempt: u32,
    },
    /// Flag the chat errored for operators.
    FlagChatErrored {
        /// Why, for operators.
        reason: String,
        /// The kind of failure, for programs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cause: Option<ChatErrorCause>,
    },
    /// Tell the runner of `attempt` to kill its container.
    ForwardKill {
        /// The attempt to stop.
        attempt: u32,
    },
    /// Make sure `attempt` never runs: cancel its schedule and take its claim.
    CancelAttempt {
        /// The attempt that must never run.
        attempt: u32,
    },
    /// The attempt that ended the turn cleanly left `object`: make it the chat's workspace (the
    /// one it replaces becomes the previous). Only ever owed for the turn's current attempt, by
    /// the exit that ended the turn: a superseded, killed or dead attempt never saves.
    SaveWorkspace {
        /// The attempt that left it.
        attempt: u32,
        /// Its object in `turnpike_workspaces`.
        object: String,
    },
    /// The turn reached a terminal state: drop it from the live index, let the chat's next turn go.
    Ended {
        /// How it ended.
        state: TurnState,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_parses_from_its_name_and_a_wrong_name_lists_them_all() {
        for state in TurnState::ALL {
            assert_eq!(state.as_str().parse::<TurnState>(), Ok(state));
        }
        let err = "finished".parse::<TurnState>().expect_err("no such state");
        assert_eq!(err, UnknownTurnState("finished".into()));
        let message = err.to_string();
        for state in TurnState::ALL {
            assert!(message.contains(state.as_str()), "{message}");
        }
    }
}
