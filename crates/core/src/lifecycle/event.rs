//! What shells tell the state machine, and what it answers when an event changes nothing or
//! cannot be right.

use crate::ids::RunnerId;
use crate::record::{TurnRecord, TurnState};
use crate::time::Timestamp;
use crate::wire::{ExitReport, HistoryEntry, OperatorAction};
use serde::{Deserialize, Serialize};

use super::Effect;

/// What a shell tells the state machine.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The chat's earlier turn ended; this one may start. `history` is the chat's history as it is
    /// now (so it includes the earlier turn's reply): the snapshot every attempt will see.
    Admitted {
        /// The chat's history now.
        #[serde(default)]
        history: Vec<HistoryEntry>,
    },
    /// A runner claimed the attempt and started it.
    Started {
        /// The attempt.
        attempt: u32,
        /// The runner that started it.
        runner: RunnerId,
        /// When its work item was stored in the work stream.
        published_at: Timestamp,
    },
    /// A bot message of this attempt landed on the chat's outbound subject (`seq` from 1), stored
    /// at `stream_seq` of the outbound stream when the runner reported it.
    MessageLanded {
        /// The attempt.
        attempt: u32,
        /// The message's number in the attempt, from 1.
        seq: u32,
        /// Where the outbound stream stored it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream_seq: Option<u64>,
    },
    /// The attempt ended (reported by its runner, or by the sweep as runner lost).
    Exited {
        /// The attempt.
        attempt: u32,
        /// How it ended.
        report: ExitReport,
    },
    /// An operator asked to kill the turn.
    KillRequested {
        /// Who asked, and when.
        action: OperatorAction,
    },
    /// A step of the turn failed in a way no retry can change (a payload NATS refuses as too
    /// large, a value it refuses as invalid, a message its chat cannot take): the turn ends
    /// failed, with the plain notice and its chat flagged, instead of being retried forever.
    Abandoned {
        /// What failed, for the record and the chat's flag.
        reason: String,
    },
}

/// Why an event changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unchanged {
    /// Already applied.
    Duplicate,
    /// For an attempt that is no longer the current one.
    Superseded {
        /// The event's attempt.
        attempt: u32,
        /// The turn's current attempt.
        current: u32,
    },
    /// The turn had already ended.
    AlreadyEnded {
        /// How it ended.
        state: TurnState,
    },
}

/// What applying one event came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The record changed.
    Changed {
        /// The record after the event.
        record: Box<TurnRecord>,
        /// The effects the event owes.
        effects: Vec<Effect>,
    },
    /// Nothing changed, for this reason.
    Unchanged(Unchanged),
}

/// An event that cannot be right for this turn. The shell dead-letters it; the turn is untouched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// For an attempt never published.
    #[error("event for attempt {attempt}, but only attempt {current} was ever published")]
    FutureAttempt {
        /// The event's attempt.
        attempt: u32,
        /// The turn's latest attempt.
        current: u32,
    },
    /// An attempt number of 0.
    #[error("attempt numbers start at 1; got 0")]
    AttemptZero,
    /// For an attempt while the turn waits for its chat (it has none yet).
    #[error("event for attempt {attempt} while the turn is still waiting for its chat")]
    NotAdmitted {
        /// The event's attempt.
        attempt: u32,
    },
    /// A second runner says it started the attempt.
    #[error("attempt {attempt} was started by runner {recorded}, but {claimed} claims it too")]
    ConflictingRunner {
        /// The attempt.
        attempt: u32,
        /// The runner the record has.
        recorded: RunnerId,
        /// The runner the event is from.
        claimed: RunnerId,
    },
    /// A bot message number of 0.
    #[error("bot message sequence numbers start at 1; got 0")]
    SeqZero,
}
