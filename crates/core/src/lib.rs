//! Turnpike's core: everything that decides what happens to a turn, with no IO.
//!
//! - [`lifecycle`]: the turn state machine, `apply(record, event, now) -> (record, effects)`.
//! - [`chat`]: per-chat order (one live turn, the rest waiting) and the history turns are given.
//! - [`wire`]: every message that crosses NATS, and the turn record stored in KV.
//! - [`codec`]: JSON (default) and MessagePack, chosen by a `Content-Type` header.
//! - [`subjects`]: the one place subject, stream, bucket and dedup-id names are built.
//! - [`exit`]: how a run ended, classified the same way for every backend.
//! - [`fence`]: which attempt may land output, from the fence subject's last marker.
//! - [`recovery`]: what the recovery sweep does with a turn no event will settle.
//! - [`texts`]: the exact user-facing notices and the retry preamble.
//! - [`backoff`]: the one doubling wait schedule every retry loop uses.
//! - [`sizes`]: sizes in encoded bytes, and the budgets that keep every payload within NATS's
//!   `max_payload`.
//!
//! Nothing here reads a clock, a socket or a file: time is passed in as [`Timestamp`].

#![warn(missing_docs)]

pub mod backoff;
pub mod chat;
pub mod codec;
pub mod exit;
pub mod fence;
pub mod history;
pub mod ids;
pub mod lifecycle;
pub mod record;
pub mod recovery;
pub mod sizes;
pub mod subjects;
pub mod texts;
pub mod time;
pub mod wire;

pub use ids::{ChatId, IdError, RunnerId, TurnId};
pub use lifecycle::{apply, Effect, Event, Step, TransitionError};
pub use record::{TurnRecord, TurnState};
pub use time::Timestamp;

/// The format version written into every payload and KV value by this release.
pub const FORMAT_VERSION: u16 = 1;
