//! An exhaustive model check of the fence protocol, driven by the real decisions in
//! `turnpike_core::fence`. Every interleaving is explored (breadth first, every state once) of:
//! - runner 1 running attempt 1, and runner 2 running attempt 2 once it is dispatched: each reads
//!   the fence, appends its marker by compare-and-set, lands up to two bot messages (each
//!   conditional on its marker still being the last), checks its fence on a heartbeat, and may
//!   stop (crash) at any point;
//! - the sweep declaring attempt 1 lost, as often as it likes and from a record that may be stale
//!   (after attempt 2 started): read, compare-and-set a `lost` marker, count what attempt 1
//!   landed, then dispatch attempt 2;
//! - an operator kill at any moment: read, compare-and-set a `killed` marker;
//! - a lost ack on any marker append (the append happened, its writer did not hear of it).
//!
//! Safety, checked in every reachable state:
//! 1. nothing lands after a kill, and no attempt takes the fence after it;
//! 2. nothing of an attempt lands after it was declared lost or a later attempt took the fence;
//! 3. declaring attempt 1 lost never fences out attempt 2;
//! 4. the count the sweep takes once attempt 1 is fenced out is final.

use std::collections::{HashSet, VecDeque};
use turnpike_core::fence::{self, FenceHolder, FenceMarker, Last};
use turnpike_core::{RunnerId, TurnId, FORMAT_VERSION};

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Entry {
    Runner(u32),
    Lost(u32),
    Killed,
    /// A bot message of this attempt (on the chat subject: it does not move the fence).
    Msg(u32),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Run {
    NotDispatched,
    /// Claimed: about to read the fence.
    Claimed,
    Appending {
        expect: u64,
    },
    Holding {
        seq: u64,
        sent: u8,
    },
    Stopped,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Sweep {
    Idle,
    Appending {
        expect: u64,
    },
    /// Attempt 1 is fenced out; `count` of its messages had landed.
    Fenced {
        count: usize,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Kill {
    Idle,
    Appending { expect: u64 },
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    /// The chat-out stream: fence markers and bot messages, in stream order.
    log: Vec<Entry>,
    runs: [Run; 2],
    sweep: Sweep,
    kill: Kill,
}

fn turn() -> TurnId {
    TurnId::new("t-model").expect("valid")
}

fn runner_id(attempt: u32) -> RunnerId {
    RunnerId::new(format!("r{attempt}")).expect("valid")
}

impl State {
    /// The fence subject's last marker, as the stream answers it: sequence = stream position.
    fn last(&self) -> Option<Last> {
        let (i, e) = self
            .log
            .iter()
            .enumerate()
            .rev()
            .find(|(_, e)| !matches!(e, Entry::Msg(_)))?;
        let (attempt, holder) = match e {
            Entry::Runner(a) => (
                *a,
                FenceHolder::Runner {
                    runner: runner_id(*a),
                },
            ),
            Entry::Lost(a) => (*a, FenceHolder::Lost),
            Entry::Killed => (0, FenceHolder::Killed { by: "op".into() }),
            Entry::Msg(_) => unreachable!("filtered out"),
        };
        Some(Last {
            seq: i as u64 + 1,
            marker: Some(FenceMarker {
                v: FORMAT_VERSION,
                turn: turn(),
                attempt,
                holder,
                replaces: 0,
            }),
        })
    }

    fn last_seq(&self) -> u64 {
        self.last().map_or(0, |l| l.seq)
    }

    /// Compare-and-set append to the fence subject.
    fn cas(&mut self, expect: u64, e: Entry) -> Option<u64> {
        (self.last_seq() == expect).then(|| {
            self.log.push(e);
            self.log.len() as u64
        })
    }

    fn landed(&self, attempt: u32) -> usize {
        self.log
            .iter()
            .filter(|e| **e == Entry::Msg(attempt))
            .count()
    }
}

fn successors(s: &State) -> Vec<State> {
    let mut out = Vec::new();
    for i in 0..2 {
        let attempt = i as u32 + 1;
        match s.runs[i].clone() {
            Run::NotDispatched | Run::Stopped => {}
            Run::Claimed => {
                let mut n = s.clone();
                n.runs[i] = match fence::take(s.last().as_ref(), attempt, &runner_id(attempt)) {
                    fence::Take::Append { expect } => Run::Appending { expect },
                    fence::Take::AlreadyOurs { seq } => Run::Holding { seq, sent: 0 },
                    fence::Take::Killed | fence::Take::Lost => Run::Stopped,
                };
                out.push(n);
            }
            Run::Appending { expect } => {
                let mut n = s.clone();
                n.runs[i] = match n.cas(expect, Entry::Runner(attempt)) {
                    Some(seq) => Run::Holding { seq, sent: 0 },
                    None => Run::Claimed,
                };
                out.push(n);
                // The append happened, but its ack was lost: the runner reads again.
                let mut n = s.clone();
                if n.cas(expect, Entry::Runner(attempt)).is_some() {
                    n.runs[i] = Run::Claimed;
                    out.push(n);
                }
            }
            Run::Holding { seq, sent } => {
                if sent < 2 {
                    // A bot message, published on the condition that the fence is still ours.
                    let mut n = s.clone();
                    if n.last_seq() == seq {
                        n.log.push(Entry::Msg(attempt));
                        n.runs[i] = Run::Holding {
                            seq,
                            sent: sent + 1,
                        };
                    } else {
                        n.runs[i] = Run::Stopped;
                    }
                    out.push(n);
                }
                // The heartbeat's fence check.
                if fence::check(s.last().as_ref(), seq).is_some() {
                    let mut n = s.clone();
                    n.runs[i] = Run::Stopped;
                    out.push(n);
                }
            }
        }
        // Any runner may crash at any point.
        if !matches!(s.runs[i], Run::NotDispatched | Run::Stopped) {
            let mut n = s.clone();
            n.runs[i] = Run::Stopped;
            out.push(n);
        }
    }
    match s.sweep.clone() {
        Sweep::Idle => {
            let mut n = s.clone();
            match fence::lose(s.last().as_ref(), 1) {
                fence::Lose::Append { expect, .. } => n.sweep = Sweep::Appending { expect },
                fence::Lose::AlreadyFenced { .. } => n.sweep = Sweep::Fenced { count: s.landed(1) },
                // A stale record: the sweep changes nothing.
                fence::Lose::Stale { .. } => {}
            }
            if n != *s {
                out.push(n);
            }
        }
        Sweep::Appending { expect } => {
            let mut n = s.clone();
            n.sweep = match n.cas(expect, Entry::Lost(1)) {
                Some(_) => Sweep::Fenced { count: n.landed(1) },
                None => Sweep::Idle,
            };
            out.push(n);
            let mut n = s.clone();
            if n.cas(expect, Entry::Lost(1)).is_some() {
                n.sweep = Sweep::Idle;
                out.push(n);
            }
        }
        Sweep::Fenced { .. } => {
            let mut n = s.clone();
            if s.runs[1] == Run::NotDispatched {
                // The retry: attempt 2 is dispatched (and claimed by runner 2).
                n.runs[1] = Run::Claimed;
            } else {
                // Another sweep, from a record still saying attempt 1 runs (stale).
                n.sweep = Sweep::Idle;
            }
            out.push(n);
        }
    }
    match s.kill.clone() {
        Kill::Idle => {
            let mut n = s.clone();
            n.kill = match fence::kill(s.last().as_ref()) {
                fence::Kill::Append { expect } => Kill::Appending { expect },
                fence::Kill::AlreadyKilled => Kill::Done,
            };
            out.push(n);
        }
        Kill::Appending { expect } => {
            let mut n = s.clone();
            n.kill = match n.cas(expect, Entry::Killed) {
                Some(_) => Kill::Done,
                None => Kill::Idle,
            };
            out.push(n);
            let mut n = s.clone();
            if n.cas(expect, Entry::Killed).is_some() {
                n.kill = Kill::Idle;
                out.push(n);
            }
        }
        Kill::Done => {}
    }
    out
}

fn check(s: &State) -> Result<(), String> {
    let mut killed = false;
    let mut fenced_out = [false; 3]; // by attempt: lost, or a later attempt took the fence
    for (i, e) in s.log.iter().enumerate() {
        match e {
            Entry::Killed => killed = true,
            Entry::Runner(a) => {
                if killed {
                    return Err(format!("attempt {a} took the fence after a kill"));
                }
                if fenced_out[*a as usize] {
                    return Err(format!(
                        "attempt {a} took the fence after it was fenced out"
                    ));
                }
                for b in 1..*a {
                    fenced_out[b as usize] = true;
                }
            }
            Entry::Lost(a) => {
                if s.log[..i].contains(&Entry::Runner(a + 1)) {
                    return Err(format!("declaring {a} lost fenced out attempt {}", a + 1));
                }
                fenced_out[*a as usize] = true;
            }
            Entry::Msg(a) => {
                if killed {
                    return Err(format!("a message of attempt {a} landed after the kill"));
                }
                if fenced_out[*a as usize] {
                    return Err(format!(
                        "a message of attempt {a} landed after it was fenced out"
                    ));
                }
            }
        }
    }
    if let Sweep::Fenced { count } = s.sweep {
        if s.landed(1) != count {
            return Err(format!(
                "the sweep counted {count} messages of attempt 1, but {} landed",
                s.landed(1)
            ));
        }
    }
    Ok(())
}

#[test]
fn no_interleaving_breaks_the_fence() {
    let init = State {
        log: Vec::new(),
        runs: [Run::Claimed, Run::NotDispatched],
        sweep: Sweep::Idle,
        kill: Kill::Idle,
    };
    let mut seen = HashSet::new();
    let mut queue = VecDeque::from([(init.clone(), Vec::<State>::new())]);
    seen.insert(init);
    let mut messages_landed_by_two = false;
    let mut killed_after_landing = false;
    let mut stale_sweep_seen = false;
    while let Some((s, path)) = queue.pop_front() {
        if let Err(why) = check(&s) {
            panic!(
                "counterexample: {why}\nfinal state: {s:#?}\npath ({} steps): {path:#?}",
                path.len()
            );
        }
        messages_landed_by_two |= s.landed(2) > 0;
        killed_after_landing |= s.landed(1) > 0 && s.log.contains(&Entry::Killed);
        stale_sweep_seen |= s.sweep == Sweep::Idle
            && s.log.last() == Some(&Entry::Runner(2))
            && matches!(fence::lose(s.last().as_ref(), 1), fence::Lose::Stale { .. });
        for n in successors(&s) {
            // Bounded: a correct protocol never writes this many entries; a wrong one may loop.
            if n.log.len() > 12 {
                continue;
            }
            if seen.insert(n.clone()) {
                let mut p = path.clone();
                p.push(s.clone());
                queue.push_back((n, p));
            }
        }
    }
    // The model is not vacuous: the interesting cases are reachable.
    assert!(messages_landed_by_two, "attempt 2 never landed anything");
    assert!(
        killed_after_landing,
        "a kill after a reply was never explored"
    );
    assert!(
        stale_sweep_seen,
        "a sweep on a stale record was never explored"
    );
    assert!(seen.len() > 500, "only {} states", seen.len());
    eprintln!("fence model: {} states, no counterexample", seen.len());
}

/// The checker finds a real violation when a decision is wrong: a runner that ignores a kill
/// marker (takes the fence whatever the last marker says) lands output after the kill.
#[test]
fn the_checker_catches_a_runner_that_ignores_kills() {
    let mut s = State {
        log: vec![Entry::Killed],
        runs: [Run::Claimed, Run::NotDispatched],
        sweep: Sweep::Idle,
        kill: Kill::Done,
    };
    // What the old runner did: publish its marker unconditionally, then land its reply.
    s.log.push(Entry::Runner(1));
    s.log.push(Entry::Msg(1));
    assert!(check(&s).is_err());
    // And what the real decision does from the same point.
    assert_eq!(
        fence::take(
            State {
                log: vec![Entry::Killed],
                ..s.clone()
            }
            .last()
            .as_ref(),
            1,
            &runner_id(1)
        ),
        fence::Take::Killed
    );
}
