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
