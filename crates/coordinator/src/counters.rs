//! What operators count, per coordinator process (sum across coordinators for the cluster).
//! Exposed through the NATS service API: `$SRV.STATS.turnpike-coordinator` (each endpoint's
//! `data`) and the `turnpike.ops.stats` request, which adds the live counts.

use std::sync::atomic::{AtomicU64, Ordering};
use turnpike_core::lifecycle::{Effect, NoticeKind, TurnState};

#[derive(Debug, Default)]
pub struct Counters {
    pub turns_done: AtomicU64,
    pub turns_failed: AtomicU64,
    pub turns_gave_up: AtomicU64,
    pub turns_killed: AtomicU64,
    pub silent_turns: AtomicU64,
    pub retries_scheduled: AtomicU64,
    pub runner_lost: AtomicU64,
    pub dead_lettered: AtomicU64,
    pub queued_long: AtomicU64,
    pub events_applied: AtomicU64,
    pub events_unchanged: AtomicU64,
    pub timings: crate::metrics::Timings,
}

pub use turnpike_core::wire::CountersSnapshot;

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    /// Count what a transition decided.
    pub fn effects(&self, effects: &[Effect]) {
        for e in effects {
            match e {
                Effect::DispatchAttempt {
                    not_before: Some(_),
                    ..
                } => inc(&self.retries_scheduled),
                Effect::Notify {
                    kind: NoticeKind::SilentTurn,
                    ..
                } => inc(&self.silent_turns),
                Effect::Ended { state } => match state {
                    TurnState::Done => inc(&self.turns_done),
                    TurnState::Failed => inc(&self.turns_failed),
                    TurnState::GaveUp => inc(&self.turns_gave_up),
                    TurnState::Killed => inc(&self.turns_killed),
                    _ => {}
                },
                _ => {}
            }
        }
    }

    pub fn runner_lost(&self) {
        inc(&self.runner_lost);
    }
    pub fn dead_lettered(&self) {
        inc(&self.dead_lettered);
    }
    pub fn queued_long(&self) {
        inc(&self.queued_long);
    }
    pub fn applied(&self, changed: bool) {
        inc(if changed {
            &self.events_applied
        } else {
            &self.events_unchanged
        });
    }

    pub fn snapshot(&self) -> CountersSnapshot {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersSnapshot {
            turns_done: g(&self.turns_done),
            turns_failed: g(&self.turns_failed),
            turns_gave_up: g(&self.turns_gave_up),
            turns_killed: g(&self.turns_killed),
            silent_turns: g(&self.silent_turns),
            retries_scheduled: g(&self.retries_scheduled),
            runner_lost: g(&self.runner_lost),
            dead_lettered: g(&self.dead_lettered),
            queued_long: g(&self.queued_long),
            events_applied: g(&self.events_applied),
            events_unchanged: g(&self.events_unchanged),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effects_are_counted_by_kind() {
        let c = Counters::default();
        c.effects(&[
            Effect::DispatchAttempt {
                attempt: 2,
                not_before: Some(turnpike_core::Timestamp(1)),
            },
            Effect::DispatchAttempt {
                attempt: 1,
                not_before: None,
            },
        ]);
        c.effects(&[
            Effect::Notify {
                kind: NoticeKind::SilentTurn,
                text: String::new(),
                attempt: 1,
            },
            Effect::Ended {
                state: TurnState::Done,
            },
        ]);
        c.effects(&[Effect::Ended {
            state: TurnState::GaveUp,
        }]);
        let s = c.snapshot();
        assert_eq!(s.retries_scheduled, 1);
        assert_eq!(s.silent_turns, 1);
        assert_eq!(s.turns_done, 1);
        assert_eq!(s.turns_gave_up, 1);
        assert_eq!(s.turns_failed, 0);
    }
}
