//! What operators count, per coordinator process (sum across coordinators for the cluster).
//! Exposed through the NATS service API: `$SRV.STATS.turnpike-coordinator` (each endpoint's
//! `data`) and the `turnpike.ops.stats` request, which adds the live counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use turnpike_core::lifecycle::Effect;
use turnpike_core::record::{NoticeKind, TurnState};
use turnpike_core::wire::HourCounts;

/// What `HourWindow` counts, by index.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    Done,
    Failed,
    GaveUp,
    Killed,
    Silent,
    Retry,
    RunnerLost,
}

/// Counts per minute over the last 60 minutes: a ring of (minute, counts), so the trailing hour
/// is a sum of 60 slots and memory stays constant.
#[derive(Debug)]
pub struct HourWindow {
    started_ms: u64,
    slots: Mutex<[(u64, [u64; 7]); 60]>,
}

impl HourWindow {
    pub fn new(started_ms: u64) -> Self {
        HourWindow {
            started_ms,
            slots: Mutex::new([(u64::MAX, [0; 7]); 60]),
        }
    }

    pub fn add(&self, kind: Kind, now_ms: u64) {
        let minute = now_ms / 60_000;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut slots[(minute % 60) as usize];
        if slot.0 != minute {
            *slot = (minute, [0; 7]);
        }
        slot.1[kind as usize] += 1;
    }

    /// The counts of the 60 minutes up to `now_ms` (this minute included), and where that
    /// window starts: an hour ago, or when this process started.
    pub fn last_hour(&self, now_ms: u64) -> (HourCounts, u64) {
        let minute = now_ms / 60_000;
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut sum = [0u64; 7];
        for (m, counts) in slots.iter() {
            if *m != u64::MAX && *m + 60 > minute && *m <= minute {
                for (s, c) in sum.iter_mut().zip(counts) {
                    *s += c;
                }
            }
        }
        let counts = HourCounts {
            turns_done: sum[Kind::Done as usize],
            turns_failed: sum[Kind::Failed as usize],
            turns_gave_up: sum[Kind::GaveUp as usize],
            turns_killed: sum[Kind::Killed as usize],
            silent_turns: sum[Kind::Silent as usize],
            retries_scheduled: sum[Kind::Retry as usize],
            runner_lost: sum[Kind::RunnerLost as usize],
        };
        let window_start = (minute.saturating_sub(59) * 60_000).max(self.started_ms);
        (counts, window_start)
    }
}

fn now_ms() -> u64 {
    turnpike_jetstream::now().millis()
}

impl Default for HourWindow {
    fn default() -> Self {
        HourWindow::new(now_ms())
    }
}

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
    pub timings: crate::timings::Timings,
    pub hour: HourWindow,
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
                } => self.count(&self.retries_scheduled, Kind::Retry),
                Effect::Notify {
                    kind: NoticeKind::SilentTurn,
                    ..
                } => self.count(&self.silent_turns, Kind::Silent),
                Effect::Ended { state } => match state {
                    TurnState::Done => self.count(&self.turns_done, Kind::Done),
                    TurnState::Failed => self.count(&self.turns_failed, Kind::Failed),
                    TurnState::GaveUp => self.count(&self.turns_gave_up, Kind::GaveUp),
                    TurnState::Killed => self.count(&self.turns_killed, Kind::Killed),
                    _ => {}
                },
                _ => {}
            }
        }
    }

    fn count(&self, total: &AtomicU64, kind: Kind) {
        inc(total);
        self.hour.add(kind, now_ms());
    }

    pub fn runner_lost(&self) {
        self.count(&self.runner_lost, Kind::RunnerLost);
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
        let (last_hour, window_start_ms) = self.hour.last_hour(now_ms());
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
            last_hour,
            window_start_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hour_window_counts_the_last_sixty_minutes_only() {
        let start = 1_000 * 60_000;
        let w = HourWindow::new(start);
        w.add(Kind::Done, start);
        w.add(Kind::GaveUp, start + 30 * 60_000);
        w.add(Kind::GaveUp, start + 30 * 60_000 + 1);
        let (c, from) = w.last_hour(start + 30 * 60_000);
        assert_eq!((c.turns_done, c.turns_gave_up), (1, 2));
        assert_eq!(from, start, "a young process counts since it started");
        // 61 minutes after the first: it has left the window, the later ones have not.
        let (c, from) = w.last_hour(start + 61 * 60_000);
        assert_eq!((c.turns_done, c.turns_gave_up), (0, 2));
        assert_eq!(from, start + 2 * 60_000);
        // A slot reused an hour later starts from zero.
        w.add(Kind::Done, start + 60 * 60_000);
        let (c, _) = w.last_hour(start + 60 * 60_000);
        assert_eq!(c.turns_done, 1);
    }

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
