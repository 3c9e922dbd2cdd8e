//! What operators count, per coordinator process (sum across coordinators for the cluster).
//! Exposed through the NATS service API: `$SRV.STATS.turnpike-coordinator` (each endpoint's
//! `data`) and the `turnpike.ops.stats` request, which adds the live counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use turnpike_core::lifecycle::Effect;
use turnpike_core::record::{NoticeKind, TurnState};
use turnpike_core::wire::{CountersSnapshot, TurnCounts};

/// One of the [`TurnCounts`], as a counter to bump.
type TurnCount = fn(&mut TurnCounts) -> &mut u64;

/// Counts per minute over the last 60 minutes: a ring of (minute, counts), so the trailing hour
/// is a sum of 60 slots and memory stays constant.
#[derive(Debug)]
pub struct HourWindow {
    started_ms: u64,
    slots: Mutex<[(u64, TurnCounts); 60]>,
}

impl HourWindow {
    /// A window of a process that started at `started_ms`.
    pub fn new(started_ms: u64) -> Self {
        HourWindow {
            started_ms,
            slots: Mutex::new([(u64::MAX, TurnCounts::default()); 60]),
        }
    }

    /// Count one of `count` at `now_ms`.
    pub fn add(&self, count: TurnCount, now_ms: u64) {
        let minute = now_ms / 60_000;
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let slot = &mut slots[(minute % 60) as usize];
        if slot.0 != minute {
            *slot = (minute, TurnCounts::default());
        }
        *count(&mut slot.1) += 1;
    }

    /// The counts of the 60 minutes up to `now_ms` (this minute included), and where that
    /// window starts: an hour ago, or when this process started.
    pub fn last_hour(&self, now_ms: u64) -> (TurnCounts, u64) {
        let minute = now_ms / 60_000;
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        let mut sum = TurnCounts::default();
        for (m, counts) in slots.iter() {
            if *m != u64::MAX && *m + 60 > minute && *m <= minute {
                sum.add(counts);
            }
        }
        let window_start = (minute.saturating_sub(59) * 60_000).max(self.started_ms);
        (sum, window_start)
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

/// This process's counters: the wire's [`CountersSnapshot`] as it is being counted.
#[derive(Debug, Default)]
pub struct Counters {
    turns: Mutex<TurnCounts>,
    /// Inputs refused as dead letters (bumped where they are refused).
    pub dead_lettered: AtomicU64,
    queued_long: AtomicU64,
    events_applied: AtomicU64,
    events_unchanged: AtomicU64,
    /// Attempts' durations and retries' lateness, for `/metrics`.
    pub timings: crate::timings::Timings,
    hour: HourWindow,
}

fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    /// Count what a transition decided.
    pub fn effects(&self, effects: &[Effect]) {
        for e in effects {
            let count: TurnCount = match e {
                Effect::DispatchAttempt {
                    not_before: Some(_),
                    ..
                } => |c| &mut c.retries_scheduled,
                Effect::Notify {
                    kind: NoticeKind::SilentTurn,
                    ..
                } => |c| &mut c.silent_turns,
                Effect::Ended { state } => match state {
                    TurnState::Done => |c| &mut c.turns_done,
                    TurnState::Failed => |c| &mut c.turns_failed,
                    TurnState::GaveUp => |c| &mut c.turns_gave_up,
                    TurnState::Killed => |c| &mut c.turns_killed,
                    _ => continue,
                },
                _ => continue,
            };
            self.count(count);
        }
    }

    /// Count one in total and in this minute of the hour.
    fn count(&self, count: TurnCount) {
        *count(&mut self.turns.lock().unwrap_or_else(|p| p.into_inner())) += 1;
        self.hour.add(count, now_ms());
    }

    /// An attempt was declared lost with its runner.
    pub fn runner_lost(&self) {
        self.count(|c| &mut c.runner_lost);
    }

    /// A turn was found queued far longer than expected.
    pub fn queued_long(&self) {
        inc(&self.queued_long);
    }

    /// A runner event was applied: it `changed` the turn, or not.
    pub fn applied(&self, changed: bool) {
        inc(if changed {
            &self.events_applied
        } else {
            &self.events_unchanged
        });
    }

    /// The counters as they stand.
    pub fn snapshot(&self) -> CountersSnapshot {
        let (last_hour, window_start_ms) = self.hour.last_hour(now_ms());
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CountersSnapshot {
            turns: *self.turns.lock().unwrap_or_else(|p| p.into_inner()),
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
        w.add(|c| &mut c.turns_done, start);
        w.add(|c| &mut c.turns_gave_up, start + 30 * 60_000);
        w.add(|c| &mut c.turns_gave_up, start + 30 * 60_000 + 1);
        let (c, from) = w.last_hour(start + 30 * 60_000);
        assert_eq!((c.turns_done, c.turns_gave_up), (1, 2));
        assert_eq!(from, start, "a young process counts since it started");
        // 61 minutes after the first: it has left the window, the later ones have not.
        let (c, from) = w.last_hour(start + 61 * 60_000);
        assert_eq!((c.turns_done, c.turns_gave_up), (0, 2));
        assert_eq!(from, start + 2 * 60_000);
        // A slot reused an hour later starts from zero.
        w.add(|c| &mut c.turns_done, start + 60 * 60_000);
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
        let s = c.snapshot().turns;
        assert_eq!(s.retries_scheduled, 1);
        assert_eq!(s.silent_turns, 1);
        assert_eq!(s.turns_done, 1);
        assert_eq!(s.turns_gave_up, 1);
        assert_eq!(s.turns_failed, 0);
    }
}
