//! Turnpike's core: everything that decides what happens to a turn, with no IO.
//!
//! - [`lifecycle`]: the turn state machine, `apply(record, event, now) -> (record, effects)`.
//! - [`wire`]: every message that crosses NATS, and the turn record stored in KV.
//! - [`codec`]: JSON (default) and MessagePack, chosen by a `Content-Type` header.
//! - [`subjects`]: the one place subject, stream, bucket and dedup-id names are built.
//! - [`fence`]: which attempt may land output, from the fence subject's last marker.
//! - [`texts`]: the exact user-facing notices and the retry preamble.
//!
//! Nothing here reads a clock, a socket or a file: time is passed in as [`Timestamp`].

pub mod codec;
pub mod fence;
pub mod history;
pub mod ids;
pub mod lifecycle;
pub mod subjects;
pub mod texts;
pub mod time;
pub mod wire;

pub use ids::{ChatId, IdError, RunnerId, TurnId};
pub use lifecycle::{apply, Effect, Event, Step, TransitionError, TurnRecord, TurnState};
pub use time::Timestamp;

/// The format version written into every payload and KV value by this release.
pub const FORMAT_VERSION: u16 = 1;
