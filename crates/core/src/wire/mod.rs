//! Every payload that crosses NATS. Each carries `v`, the format version, so a later release can
//! still read what this one wrote; readers refuse a version newer than they know, with a clear error.
//!
//! The chat boundary ([`InboundMessage`], [`OutboundItem`]) is a public contract for chat adapters
//! in any language; `docs/protocol.md` documents it field by field.

use crate::ids::{ChatId, RunnerId, TurnId};
use crate::record::TurnState;
use crate::time::Timestamp;
use crate::FORMAT_VERSION;
use serde::{Deserialize, Serialize};

mod attempt;
mod chat;
mod fence;
mod ops;

pub use attempt::{
    AgentInput, AgentLine, AgentStatus, AttemptStart, ClaimHolder, ClaimRecord, ExitClass,
    ExitReport, Landed, ProfileUsed, ReplySpan, RunnerEvent, RunnerEventKind, RunnerPresence,
    WorkItem, PROFILE_NAME_MAX, WORKSPACE_OBJECT_MAX,
};
pub use chat::{
    Attachment, ChatError, ChatErrorCause, ChatRecord, ChatWorkspace, HistoryEntry, InboundLimits,
    InboundMessage, OutboundItem, OutboundKind, Refusal, Role,
};
pub use fence::{FenceHolder, FenceMarker};
pub use ops::{
    CountersSnapshot, ErroredChat, ErroredPage, ErroredQuery, KillRequest, LivePage, LiveQuery,
    LiveTurn, OperatorAction, OpsReply, OpsRequest, OpsStats, TurnCounts,
};

fn v1() -> u16 {
    FORMAT_VERSION
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Implemented by every versioned payload so the codec can check `v` in one place.
pub trait Versioned {
    /// The payload's format version.
    fn version(&self) -> u16;
}

macro_rules! versioned {
    ($($t:ty),* $(,)?) => {
        $(impl Versioned for $t {
            fn version(&self) -> u16 { self.v }
        })*
    };
}

versioned!(
    OpsRequest,
    OpsReply,
    KillRequest,
    FenceMarker,
    InboundMessage,
    WorkItem,
    RunnerEvent,
    OutboundItem,
    ChatRecord,
    ClaimRecord,
    RunnerPresence,
    LiveQuery,
    LivePage,
    ErroredQuery,
    ErroredPage,
);

impl Versioned for AgentInput {
    fn version(&self) -> u16 {
        self.work.v
    }
}

#[cfg(test)]
mod tests;
