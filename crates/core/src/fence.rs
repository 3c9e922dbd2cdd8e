//! The attempt fence: which attempt of a turn may land output, decided by the last marker on
//! `turnpike.fence.<turn>.>` (in the chat-out stream, beside the chat's messages; each writer
//! appends under its own name, `.runner.<id>` or `.service`).
//!
//! Every marker is appended with compare-and-set on that subject's last sequence, and every bot
//! message is published on the condition that the last marker is still the one its attempt took.
//! So the fence is a tiny replicated log with one writer at a time, and these functions decide,
//! from the last marker alone, what each writer does:
//! - a runner about to run attempt k [`take`]s the fence, unless the turn was killed or attempt k
//!   was already declared lost (a kill that lands before the runner's marker is never missed);
//! - an operator kill ([`kill`]) always wins: no attempt's output lands after it, and no attempt
//!   starts after it;
//! - declaring attempt k lost ([`lose`]) only moves a fence that attempt k could still hold, never
//!   one a later attempt took (a sweep acting on a stale record cannot fence out a healthy run);
//! - a running attempt checks on every heartbeat that the fence is still its own ([`check`]), so a
//!   kill or loss it missed on the wire still stops it.

use crate::ids::RunnerId;
pub use crate::wire::{FenceHolder, FenceMarker};

/// Who appended a marker, as its subject names it (see [`crate::subjects::fence_marker`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceWriter {
    /// A runner: it takes the fence for an attempt it claimed, or fences out one it ran.
    Runner(RunnerId),
    /// A coordinator or dispatcher: an attempt declared lost, a turn killed or cancelled.
    Service,
}

impl FenceWriter {
    /// May this writer have appended a marker that says `holder`? A runner speaks only for
    /// itself and never kills; only a service kills. A marker that claims more than its writer
    /// may is not believed: it reads as an unreadable marker.
    pub fn may_write(&self, holder: &FenceHolder) -> bool {
        match (self, holder) {
            (FenceWriter::Runner(me), FenceHolder::Runner { runner }) => me == runner,
            (FenceWriter::Runner(_), FenceHolder::Lost) => true,
            (FenceWriter::Runner(_), FenceHolder::Killed { .. }) => false,
            (FenceWriter::Service, FenceHolder::Runner { .. }) => false,
            (FenceWriter::Service, FenceHolder::Lost | FenceHolder::Killed { .. }) => true,
        }
    }
}

/// The last marker as read from the stream: its sequence, and its content if it decodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Last {
    /// Its stream sequence.
    pub seq: u64,
    /// The marker, `None` if it does not decode.
    pub marker: Option<FenceMarker>,
}

impl Last {
    fn killed(&self) -> bool {
        matches!(
            self.marker,
            Some(FenceMarker {
                holder: FenceHolder::Killed { .. },
                ..
            })
        )
    }
    fn attempt(&self) -> u32 {
        self.marker.as_ref().map_or(0, |m| m.attempt)
    }
}

/// What a runner that claimed `attempt` does with the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Take {
    /// Append our marker on the condition that the last sequence is still `expect`.
    Append {
        /// The fence subject's last sequence the append expects.
        expect: u64,
    },
    /// Our marker is already the last one (an earlier publish whose ack we did not see).
    AlreadyOurs {
        /// Where our marker is.
        seq: u64,
    },
    /// The turn was killed: do not run; report the attempt killed.
    Killed,
    /// The attempt was declared lost, or a later attempt holds the fence: do not run.
    Lost,
}

/// Decide what a runner that claimed `attempt` does with the fence, given its last marker.
pub fn take(last: Option<&Last>, attempt: u32, runner: &RunnerId) -> Take {
    let Some(last) = last else {
        return Take::Append { expect: 0 };
    };
    if last.killed() {
        return Take::Killed;
    }
    if last.attempt() > attempt {
        return Take::Lost;
    }
    match &last.marker {
        Some(m) if m.attempt == attempt => match &m.holder {
            FenceHolder::Runner { runner: r } if r == runner => Take::AlreadyOurs { seq: last.seq },
            // Another runner holding our claimed attempt cannot happen (claims are created once);
            // if it ever does, we must not run beside it.
            FenceHolder::Runner { .. } | FenceHolder::Lost | FenceHolder::Killed { .. } => {
                Take::Lost
            }
        },
        _ => Take::Append { expect: last.seq },
    }
}

/// What declaring `attempt` lost does with the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lose {
    /// Append a `Lost` marker expecting `expect`. `runner_seq`: the attempt's own marker, if it
    /// is the one being replaced (its output, if any, lies after it).
    Append {
        /// The fence subject's last sequence the append expects.
        expect: u64,
        /// The attempt's own marker, if it is the one being replaced.
        runner_seq: Option<u64>,
    },
    /// The last marker already fences the attempt out; its own marker, if any, is the one at
    /// `replaces` (see [`runner_seq`]).
    AlreadyFenced {
        /// The marker the fencing one replaced.
        replaces: u64,
    },
    /// A later attempt holds the fence: the record this decision was made from is stale.
    Stale {
        /// The attempt that holds the fence.
        current: u32,
    },
}

/// Decide what declaring `attempt` lost does with the fence, given its last marker.
pub fn lose(last: Option<&Last>, attempt: u32) -> Lose {
    let Some(last) = last else {
        return Lose::Append {
            expect: 0,
            runner_seq: None,
        };
    };
    let m = last.marker.as_ref();
    if last.killed() || m.is_some_and(|m| m.attempt == attempt && m.holder == FenceHolder::Lost) {
        return Lose::AlreadyFenced {
            replaces: m.map_or(0, |m| m.replaces),
        };
    }
    if last.attempt() > attempt {
        return Lose::Stale {
            current: last.attempt(),
        };
    }
    let runner_seq = m
        .filter(|m| m.attempt == attempt && matches!(m.holder, FenceHolder::Runner { .. }))
        .map(|_| last.seq);
    Lose::Append {
        expect: last.seq,
        runner_seq,
    }
}

/// The sequence of `attempt`'s own runner marker, given the marker found at a terminal marker's
/// `replaces` (none if the attempt never took the fence before it was fenced out).
pub fn runner_seq(replaced: Option<&Last>, attempt: u32) -> Option<u64> {
    replaced
        .filter(|l| {
            l.marker.as_ref().is_some_and(|m| {
                m.attempt == attempt && matches!(m.holder, FenceHolder::Runner { .. })
            })
        })
        .map(|l| l.seq)
}

/// What an operator kill does with the fence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kill {
    /// Append a `Killed` marker expecting the last sequence to be `expect`.
    Append {
        /// The fence subject's last sequence the append expects.
        expect: u64,
    },
    /// The turn is killed already.
    AlreadyKilled,
}

/// Decide what an operator kill does with the fence, given its last marker.
pub fn kill(last: Option<&Last>) -> Kill {
    match last {
        None => Kill::Append { expect: 0 },
        Some(l) if l.killed() => Kill::AlreadyKilled,
        Some(l) => Kill::Append { expect: l.seq },
    }
}

/// Why a running attempt must stop, seen from the fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// An operator killed the turn.
    Killed,
    /// The attempt was declared lost (or superseded).
    Lost,
}

/// Is the fence still the one the attempt took at `ours`? `None` while it is.
pub fn check(last: Option<&Last>, ours: u64) -> Option<Fenced> {
    match last {
        Some(l) if l.seq == ours => None,
        Some(l) if l.killed() => Some(Fenced::Killed),
        // Gone altogether (the stream was purged): nothing of ours can land any more either.
        _ => Some(Fenced::Lost),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TurnId, FORMAT_VERSION};

    fn t() -> TurnId {
        TurnId::new("t-1").expect("valid")
    }
    fn r(id: &str) -> RunnerId {
        RunnerId::new(id).expect("valid")
    }
    fn at(seq: u64, attempt: u32, holder: FenceHolder) -> Last {
        Last {
            seq,
            marker: Some(FenceMarker {
                v: FORMAT_VERSION,
                turn: t(),
                attempt,
                holder,
                replaces: seq.saturating_sub(1),
            }),
        }
    }
    fn runner(seq: u64, attempt: u32, id: &str) -> Last {
        at(seq, attempt, FenceHolder::Runner { runner: r(id) })
    }
    fn killed(seq: u64, attempt: u32) -> Last {
        at(seq, attempt, FenceHolder::Killed { by: "op".into() })
    }

    #[test]
    fn a_writer_is_believed_only_for_what_it_may_say() {
        let (a, b) = (r("a"), r("b"));
        let runner_a = FenceWriter::Runner(a.clone());
        assert!(runner_a.may_write(&FenceHolder::Runner { runner: a.clone() }));
        assert!(runner_a.may_write(&FenceHolder::Lost));
        assert!(!runner_a.may_write(&FenceHolder::Runner { runner: b }));
        assert!(!runner_a.may_write(&FenceHolder::Killed { by: "op".into() }));
        assert!(FenceWriter::Service.may_write(&FenceHolder::Lost));
        assert!(FenceWriter::Service.may_write(&FenceHolder::Killed { by: "op".into() }));
        assert!(!FenceWriter::Service.may_write(&FenceHolder::Runner { runner: a }));
    }

    #[test]
    fn a_runner_takes_a_fresh_fence_or_one_an_earlier_attempt_left() {
        let me = r("a");
        assert_eq!(take(None, 1, &me), Take::Append { expect: 0 });
        assert_eq!(
            take(Some(&runner(7, 1, "b")), 2, &me),
            Take::Append { expect: 7 }
        );
        assert_eq!(
            take(Some(&at(9, 1, FenceHolder::Lost)), 2, &me),
            Take::Append { expect: 9 }
        );
        // An unreadable marker blocks nothing, but the append is still conditional on it.
        let unreadable = Last {
            seq: 4,
            marker: None,
        };
        assert_eq!(take(Some(&unreadable), 1, &me), Take::Append { expect: 4 });
    }

    #[test]
    fn a_kill_that_landed_first_is_never_missed_by_the_runner() {
        let me = r("a");
        for attempt in 1..=3 {
            for kill_attempt in 0..=3 {
                assert_eq!(
                    take(Some(&killed(5, kill_attempt)), attempt, &me),
                    Take::Killed
                );
            }
        }
    }

    #[test]
    fn a_runner_never_runs_an_attempt_declared_lost_or_superseded() {
        let me = r("a");
        assert_eq!(take(Some(&at(3, 2, FenceHolder::Lost)), 2, &me), Take::Lost);
        assert_eq!(take(Some(&runner(3, 3, "b")), 2, &me), Take::Lost);
        assert_eq!(take(Some(&runner(3, 2, "b")), 2, &me), Take::Lost);
        assert_eq!(
            take(Some(&runner(3, 2, "a")), 2, &me),
            Take::AlreadyOurs { seq: 3 }
        );
    }

    #[test]
    fn losing_moves_only_a_fence_the_attempt_could_hold() {
        assert_eq!(
            lose(Some(&runner(8, 2, "a")), 2),
            Lose::Append {
                expect: 8,
                runner_seq: Some(8)
            }
        );
        // Claimed but never fenced: the fence is the previous attempt's.
        assert_eq!(
            lose(Some(&at(6, 1, FenceHolder::Lost)), 2),
            Lose::Append {
                expect: 6,
                runner_seq: None
            }
        );
        assert_eq!(
            lose(None, 1),
            Lose::Append {
                expect: 0,
                runner_seq: None
            }
        );
        // A stale record: attempt 3 runs now and must not be fenced out.
        assert_eq!(
            lose(Some(&runner(9, 3, "b")), 2),
            Lose::Stale { current: 3 }
        );
        assert_eq!(
            lose(Some(&at(9, 2, FenceHolder::Lost)), 2),
            Lose::AlreadyFenced { replaces: 8 }
        );
        assert_eq!(
            lose(Some(&killed(9, 2)), 2),
            Lose::AlreadyFenced { replaces: 8 }
        );
    }

    #[test]
    fn the_replaced_marker_tells_where_a_fenced_attempts_output_begins() {
        assert_eq!(runner_seq(Some(&runner(8, 2, "a")), 2), Some(8));
        assert_eq!(runner_seq(Some(&runner(8, 1, "a")), 2), None);
        assert_eq!(runner_seq(Some(&at(8, 2, FenceHolder::Lost)), 2), None);
        assert_eq!(runner_seq(None, 2), None);
    }

    #[test]
    fn a_kill_always_wins_and_only_once() {
        assert_eq!(kill(None), Kill::Append { expect: 0 });
        assert_eq!(kill(Some(&runner(4, 1, "a"))), Kill::Append { expect: 4 });
        assert_eq!(kill(Some(&killed(5, 1))), Kill::AlreadyKilled);
    }

    #[test]
    fn a_running_attempt_sees_any_move_of_its_fence() {
        assert_eq!(check(Some(&runner(4, 1, "a")), 4), None);
        assert_eq!(check(Some(&killed(5, 1)), 4), Some(Fenced::Killed));
        assert_eq!(
            check(Some(&at(5, 1, FenceHolder::Lost)), 4),
            Some(Fenced::Lost)
        );
        assert_eq!(check(None, 4), Some(Fenced::Lost));
    }
}
