//! A turn's events, applied in batches. This coordinator applies one turn's events one batch at
//! a time: the first event to arrive leads, and applies itself together with whatever else of
//! the turn arrived meanwhile in one compare-and-set (`turns::apply_events_from`, the same record
//! as a write per event), then the next batch, until none is left. Other coordinators still race
//! through compare-and-set, as before.
//!
//! A fast attempt's Started and Exited arrive milliseconds apart. With `event_batch_wait` set (it
//! is off by default), a Started event's leader waits that long for more of its turn before it
//! writes, so such an attempt costs one record write instead of two. The wait delays when the
//! record first says "running" and names its runner: the exit report carries both, so no
//! decision needs them earlier, but a watcher may see the reply first (the fault suite's case 9
//! reads the runner from the record as soon as the reply is visible, so the default is 0s).

use async_nats::jetstream::Message;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use turnpike_core::lifecycle::Event;
use turnpike_core::{Timestamp, TurnId};

/// One event, waiting to be applied with its turn's batch; its message is acked (or not) by the
/// leader once the batch is applied.
pub(crate) struct Queued {
    /// Its runner and attempt (their claim is checked before it is applied).
    pub(crate) sender: crate::Sender,
    pub(crate) event: Event,
    pub(crate) at: Timestamp,
    pub(crate) msg: Message,
    /// The event's own span (its runner and attempt), for what is logged when it is settled.
    pub(crate) span: tracing::Span,
}

/// The turns with a batch being gathered or applied here, each with what waits for it (`T`:
/// a [`Queued`] event).
pub(crate) struct Batches<T>(Mutex<HashMap<TurnId, Queue<T>>>);

impl<T> Default for Batches<T> {
    fn default() -> Self {
        Batches(Mutex::default())
    }
}

struct Queue<T> {
    waiting: Vec<T>,
    arrived: Arc<Notify>,
}

/// What the event that joins a turn's queue does next.
pub(crate) enum Joined {
    /// Lead: apply batches of the turn until none is left (`arrived` is woken by followers).
    Lead { arrived: Arc<Notify> },
    /// Follow: the turn's leader applies it; nothing more to do.
    Follow,
}

impl<T> Batches<T> {
    /// Queue `q` for its turn; the first to arrive at a turn with no leader leads. A follower
    /// that `wakes` ends its leader's wait for more.
    pub(crate) fn join(&self, turn: &TurnId, q: T, wakes: bool) -> Joined {
        let mut turns = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(queue) = turns.get_mut(turn) {
            queue.waiting.push(q);
            if wakes {
                queue.arrived.notify_one();
            }
            return Joined::Follow;
        }
        let arrived = Arc::new(Notify::new());
        turns.insert(
            turn.clone(),
            Queue {
                waiting: vec![q],
                arrived: arrived.clone(),
            },
        );
        Joined::Lead { arrived }
    }

    /// The leader's next batch: everything queued for the turn, in arrival order; `None` (and the
    /// turn has no leader any more) once nothing is left.
    pub(crate) fn next_batch(&self, turn: &TurnId) -> Option<Vec<T>> {
        let mut turns = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let queue = turns.get_mut(turn)?;
        if queue.waiting.is_empty() {
            turns.remove(turn);
            return None;
        }
        Some(std::mem::take(&mut queue.waiting))
    }
}

/// A turn's leadership, let go if its leader stops before its queue is empty (a panic in a task
/// is caught, and the coordinator goes on): what was queued is dropped unacknowledged, so
/// JetStream delivers it again, and the turn's next event leads instead of waiting for ever.
pub(crate) struct Leading<'a, T> {
    batches: &'a Batches<T>,
    turn: &'a TurnId,
    done: bool,
}

impl<'a, T> Leading<'a, T> {
    pub(crate) fn new(batches: &'a Batches<T>, turn: &'a TurnId) -> Self {
        Leading {
            batches,
            turn,
            done: false,
        }
    }

    /// The next batch; once there is none, the leadership is over.
    pub(crate) fn next_batch(&mut self) -> Option<Vec<T>> {
        let batch = self.batches.next_batch(self.turn);
        self.done = batch.is_none();
        batch
    }
}

impl<T> Drop for Leading<'_, T> {
    fn drop(&mut self) {
        if !self.done {
            let mut turns = self.batches.0.lock().unwrap_or_else(|p| p.into_inner());
            turns.remove(self.turn);
        }
    }
}

/// Should a batch led by `event` wait for more of its turn? Only a start: the exit that ends a
/// fast attempt is then on its way, and anything else is better written at once.
pub(crate) fn lingers(event: &Event) -> bool {
    matches!(event, Event::Started { .. })
}

/// Does `event` end the wait of a start for more of its turn? An exit: what a start waits for.
pub(crate) fn wakes(event: &Event) -> bool {
    matches!(event, Event::Exited { .. })
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    fn turn(id: &str) -> TurnId {
        TurnId::new(id).expect("turn id")
    }

    #[test]
    fn a_turns_events_wait_for_its_leader_and_go_in_one_batch() {
        let batches = Batches::default();
        let (t1, t2) = (turn("chat-m1"), turn("chat-m2"));
        let Joined::Lead { arrived } = batches.join(&t1, 1, false) else {
            panic!("the first event of a turn leads");
        };
        assert!(
            arrived.notified().now_or_never().is_none(),
            "woken with nothing arrived"
        );
        assert!(matches!(batches.join(&t1, 2, false), Joined::Follow));
        assert!(
            arrived.notified().now_or_never().is_none(),
            "woken by an event that does not end the wait"
        );
        assert!(matches!(batches.join(&t1, 3, true), Joined::Follow));
        assert!(
            arrived.notified().now_or_never().is_some(),
            "the leader is not woken by the event it waits for"
        );
        // Another turn is not held up.
        assert!(matches!(batches.join(&t2, 10, false), Joined::Lead { .. }));
        assert_eq!(batches.next_batch(&t1), Some(vec![1, 2, 3]));
        // Arriving while that batch is applied: the next one.
        assert!(matches!(batches.join(&t1, 4, true), Joined::Follow));
        assert_eq!(batches.next_batch(&t1), Some(vec![4]));
        assert_eq!(batches.next_batch(&t1), None);
        // The leader has let go: the next event leads.
        assert!(matches!(batches.join(&t1, 5, false), Joined::Lead { .. }));
        assert_eq!(batches.next_batch(&t2), Some(vec![10]));
    }

    #[test]
    fn a_leader_that_stops_half_way_lets_its_turn_go() {
        let batches = Batches::default();
        let t = turn("chat-m1");
        assert!(matches!(batches.join(&t, 1, false), Joined::Lead { .. }));
        {
            let mut leading = Leading::new(&batches, &t);
            assert_eq!(leading.next_batch(), Some(vec![1]));
            assert!(matches!(batches.join(&t, 2, true), Joined::Follow));
            // Dropped here with event 2 queued, as a panicking leader would be.
        }
        assert!(
            matches!(batches.join(&t, 3, false), Joined::Lead { .. }),
            "the turn's events wait for a leader that is gone"
        );
        let mut leading = Leading::new(&batches, &t);
        assert_eq!(leading.next_batch(), Some(vec![3]));
        assert_eq!(leading.next_batch(), None);
        // A leader that finished leaves the queue of the one after it alone.
        assert!(matches!(batches.join(&t, 4, false), Joined::Lead { .. }));
        drop(leading);
        assert!(matches!(batches.join(&t, 5, false), Joined::Follow));
    }
}
