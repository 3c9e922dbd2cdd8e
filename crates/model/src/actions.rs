//! The steps of the model: every [`Action`] a process or the server can take, which of them are
//! enabled in a state (`untimed`, `timers`), and what each does to the world (`apply`).

use crate::world::*;
use crate::{procs, runner, Protocol};

/// One step of one process, or of the server.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A work message given back comes back to the consumer.
    Due {
        msg: u8,
    },
    /// A runner takes a work message.
    Take {
        runner: RunnerIx,
        msg: u8,
    },
    /// A runner's next request (claim, fence, lease, report, restart), or its run's end once stopped.
    Advance(RunnerIx),
    Start(RunnerIx),
    Say(RunnerIx),
    /// The agent exits by itself: cleanly or killed by the OOM killer.
    Exit {
        runner: RunnerIx,
        oom: bool,
    },
    HearKill(RunnerIx),
    CheckFence(RunnerIx),
    /// The server stores or refuses a bot message.
    Land(InFlight),
    /// A coordinator takes an event.
    Deliver {
        proc: ProcIx,
        ev: usize,
    },
    /// A coordinator that took an event and has not written it yet takes another event of the
    /// same turn into the same write (coordinator/src/batches.rs).
    Batch {
        proc: ProcIx,
        ev: usize,
    },
    /// The dispatcher takes an inbound message.
    Dispatch(Turn),
    SweepTurn(Turn),
    Kill(Turn),
    /// A process's next step; `choice` is the sweep's "was the record written long ago?" or
    /// "has a lease been absent for a whole lease?", or the dispatcher's "is its read of the
    /// chat stale?".
    Step {
        proc: ProcIx,
        choice: bool,
    },
    Fire {
        turn: Turn,
        attempt: Attempt,
    },
    Lapse {
        turn: Turn,
        attempt: Attempt,
    },
    // Faults.
    CrashRunner(RunnerIx),
    CrashProc(ProcIx),
    Redeliver {
        msg: u8,
    },
    LoseAck(RunnerIx),
    LoseClaimAck(RunnerIx),
    LoseReport(RunnerIx),
}

impl Protocol {
    /// Does taking `a` in `w` spend the fault budget?
    pub fn is_fault(&self, w: &World, a: &Action) -> bool {
        match a {
            Action::CrashRunner(_)
            | Action::CrashProc(_)
            | Action::Redeliver { .. }
            | Action::LoseAck(_)
            | Action::LoseClaimAck(_)
            | Action::LoseReport(_) => true,
            Action::Lapse { turn, attempt } => w
                .leases
                .get(&(*turn, *attempt))
                .is_some_and(|h| w.runners[*h].attempt() == Some((*turn, *attempt))),
            _ => false,
        }
    }
}

impl Protocol {
    /// Nothing can happen but faults.
    pub(crate) fn quiet(&self, w: &World, actions: &[Action]) -> bool {
        actions.iter().all(|a| self.is_fault(w, a))
    }

    pub(crate) fn is_timer(&self, w: &World, a: &Action) -> bool {
        match a {
            Action::SweepTurn(_) | Action::Fire { .. } | Action::Due { .. } => true,
            Action::Lapse { .. } => !self.is_fault(w, a),
            _ => false,
        }
    }

    /// Lapses of leases whose holder still renews them (`faults`: a runner cut off), or of
    /// the others (a timer).
    fn lapses(&self, w: &World, faults: bool, out: &mut Vec<Action>) {
        out.extend(
            w.leases
                .keys()
                .map(|(turn, attempt)| Action::Lapse {
                    turn: *turn,
                    attempt: *attempt,
                })
                .filter(|a| self.is_fault(w, a) == faults),
        );
    }

    pub(crate) fn timers(&self, w: &World, out: &mut Vec<Action>) {
        out.extend(
            w.work
                .iter()
                .filter(|m| m.delayed)
                .map(|m| Action::Due { msg: m.id }),
        );
        if w.procs[self.sweep()].job.is_none() {
            out.extend(w.live.iter().map(|t| Action::SweepTurn(*t)));
        }
        out.extend(w.schedules.iter().map(|(turn, attempt)| Action::Fire {
            turn: *turn,
            attempt: *attempt,
        }));
        self.lapses(w, false, out);
    }

    pub(crate) fn untimed(&self, w: &World, out: &mut Vec<Action>) {
        let faults = w.ghost.faults_left > 0;
        for r in 0..self.runners {
            match &w.runners[r] {
                Runner::Idle => {
                    for m in w.work.iter().filter(|m| m.held.is_none() && !m.delayed) {
                        out.push(Action::Take {
                            runner: r,
                            msg: m.id,
                        });
                    }
                }
                Runner::Running(_) => {
                    out.extend([
                        Action::Advance(r),
                        Action::Start(r),
                        Action::Say(r),
                        Action::Exit {
                            runner: r,
                            oom: false,
                        },
                        Action::Exit {
                            runner: r,
                            oom: true,
                        },
                        Action::HearKill(r),
                        Action::CheckFence(r),
                    ]);
                    if faults {
                        out.push(Action::LoseAck(r));
                    }
                }
                Runner::Reporting { .. } => {
                    out.push(Action::Advance(r));
                    if faults {
                        out.push(Action::LoseReport(r));
                    }
                }
                Runner::Claiming { .. } => {
                    out.push(Action::Advance(r));
                    if faults {
                        out.push(Action::LoseClaimAck(r));
                    }
                }
                _ => out.push(Action::Advance(r)),
            }
            if faults && !matches!(w.runners[r], Runner::Down { .. }) {
                out.push(Action::CrashRunner(r));
            }
        }
        out.extend(w.inflight.iter().map(|f| Action::Land(*f)));
        for p in 0..self.coordinators {
            let pending = w
                .events
                .iter()
                .enumerate()
                .filter(|(_, e)| e.delivery == EventDelivery::Pending);
            match &w.procs[p].job {
                None => out.extend(pending.map(|(ev, _)| Action::Deliver { proc: p, ev })),
                Some(Job::Event {
                    evs,
                    applied: false,
                }) if evs.len() == 1 && self.batches => {
                    let turn = w.events[evs[0]].turn;
                    out.extend(
                        pending
                            .filter(|(_, e)| e.turn == turn)
                            .map(|(ev, _)| Action::Batch { proc: p, ev }),
                    );
                }
                Some(_) => {}
            }
        }
        if w.procs[self.dispatcher()].job.is_none() {
            out.extend(
                (0..self.turns)
                    .filter(|t| w.inbound[*t] == Delivery::Pending)
                    .map(Action::Dispatch),
            );
        }
        if w.procs[self.operator()].job.is_none() {
            out.extend(
                self.killable
                    .iter()
                    .filter(|t| !w.ghost.kill_requested.contains(t))
                    .map(|t| Action::Kill(*t)),
            );
        }
        for (p, proc) in w.procs.iter().enumerate() {
            if proc.job.is_some() || !proc.stack.is_empty() {
                out.push(Action::Step {
                    proc: p,
                    choice: false,
                });
                out.push(Action::Step {
                    proc: p,
                    choice: true,
                });
                if faults {
                    out.push(Action::CrashProc(p));
                }
            }
        }
        if faults {
            // A runner cut off: its lease lapses while it still holds it.
            self.lapses(w, true, out);
            out.extend(
                w.work
                    .iter()
                    .filter(|m| m.held.is_some())
                    .map(|m| Action::Redeliver { msg: m.id }),
            );
        }
    }

    pub(crate) fn apply(&self, mut w: World, a: Action) -> Option<World> {
        let done = match a {
            Action::Due { msg } => {
                let m = w.work.iter_mut().find(|m| m.id == msg && m.delayed)?;
                m.delayed = false;
                true
            }
            Action::Take { runner, msg } => runner::take(self, &mut w, runner, msg),
            Action::Advance(r) => runner::advance(self, &mut w, r),
            Action::Start(r) => runner::start(self, &mut w, r),
            Action::Say(r) => runner::say(self, &mut w, r),
            Action::Exit { runner, oom } => runner::exit(self, &mut w, runner, oom),
            Action::HearKill(r) => runner::hear_kill(&mut w, r),
            Action::CheckFence(r) => runner::check_fence(&mut w, r),
            Action::Land(f) => runner::land(&mut w, f),
            Action::Deliver { proc, ev } => procs::deliver(&mut w, proc, ev),
            Action::Batch { proc, ev } => procs::batch(&mut w, proc, ev),
            Action::Dispatch(t) => procs::dispatch(self, &mut w, t),
            Action::SweepTurn(t) => procs::sweep_turn(self, &mut w, t),
            Action::Kill(t) => procs::kill(self, &mut w, t),
            Action::Step { proc, choice } => procs::step(self, &mut w, proc, choice),
            Action::Fire { turn, attempt } => {
                w.schedules.remove(&(turn, attempt));
                // A fired schedule loses its message id: no dedup, the claim stops a second run.
                w.publish_work(turn, attempt, false);
                true
            }
            Action::Lapse { turn, attempt } => runner::lapse(&mut w, turn, attempt),
            Action::CrashRunner(r) => runner::crash(&mut w, r),
            Action::CrashProc(p) => procs::crash(&mut w, p),
            Action::Redeliver { msg } => {
                let m = w
                    .work
                    .iter()
                    .find(|m| m.id == msg && m.held.is_some())
                    .copied()?;
                let id = w.next_work_id;
                w.next_work_id = w.next_work_id.wrapping_add(1);
                w.work.push(WorkMsg {
                    id,
                    held: None,
                    delayed: false,
                    ..m
                });
                true
            }
            Action::LoseAck(r) => runner::lose_ack(&mut w, r),
            Action::LoseClaimAck(r) => runner::lose_claim_ack(&mut w, r),
            Action::LoseReport(r) => runner::lose_report(&mut w, r),
        };
        done.then_some(w)
    }
}
