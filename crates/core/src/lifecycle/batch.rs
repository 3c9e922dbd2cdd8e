//! A turn's events applied in order and stored in one write.

use crate::record::TurnRecord;
use crate::time::Timestamp;

use super::{apply, next_outbox, Effect, Event, Step, TransitionError, Unchanged};

/// What became of one event of a [`Batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventOutcome {
    /// It changed the record.
    Changed,
    /// It changed nothing, for this reason.
    Unchanged(Unchanged),
    /// It cannot be right for the turn (the shell dead-letters it).
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
