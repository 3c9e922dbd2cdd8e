//! The turn lifecycle as a pure state machine: `apply(record, event, now) -> Step`.
//!
//! The record is the whole truth about a turn (the value in the `turnpike_turns` bucket). Shells turn
//! NATS and Docker IO into [`Event`]s and carry out the [`Effect`]s; nothing here does IO or reads a
//! clock. Invariants (checked by the property tests in `lifecycle/tests.rs`):
//! - a turn never gets more than `max(MAX_TURN_RETRY, 1)` attempts;
//! - once terminal, a turn never changes state again, and it sends at most one notice;
//! - no attempt is dispatched after a bot message landed, after an operator kill, or after a clean exit;
//! - events that are duplicated, late, or for a superseded attempt change nothing.
//!
//! Its parts: [`Event`] and what an event may come to ([`Step`], [`Unchanged`],
//! [`TransitionError`]) in `event`; [`Effect`] and the outbox in `effect`; creating a turn and
//! the lifecycle table ([`create`], [`apply`]) in `apply`; [`apply_batch`] in `batch`. The record
//! itself is [`crate::record`].

mod apply;
mod batch;
mod effect;
mod event;

/// The effects are data kept in the record's outbox, so they are defined beside it.
pub use crate::record::Effect;
pub use apply::{admitted_at_creation, apply, attempt_limit, create, NewTurn};
pub use batch::{apply_batch, Batch, EventOutcome};
pub use effect::next_outbox;
pub use event::{Event, Step, TransitionError, Unchanged};

#[cfg(test)]
mod tests;
