//! A runner's steps (runner/src/attempt.rs `run`, `run_fenced`, land.rs `Lander::message`,
//! events.rs `report_exit`, `report_orphan`; lease.rs), and the server's side of a bot message.

use crate::world::*;
use crate::Protocol;
use turnpike_core::exit::{self, RawExit, StopReason};
use turnpike_core::fence::{self, FenceHolder, Fenced, Lose, Take};
use turnpike_core::wire::ExitClass;

pub(crate) fn take(_m: &Protocol, w: &mut World, r: RunnerIx, msg: u8) -> bool {
    if w.runners[r] != Runner::Idle {
        return false;
    }
    let Some(m) = w
        .work
        .iter_mut()
        .find(|m| m.id == msg && m.held.is_none() && !m.delayed)
    else {
        return false;
    };
    m.held = Some(r);
    w.runners[r] = Runner::Claiming {
        msg,
        turn: m.turn,
        attempt: m.attempt,
    };
    true
}

// Each check and write is one request of the runner's, as the real one makes them.
#[allow(clippy::map_entry)]
pub(crate) fn advance(m: &Protocol, w: &mut World, r: RunnerIx) -> bool {
    match w.runners[r].clone() {
        Runner::Idle => false,
        // The claim; the lease comes a heartbeat later, from the run.
        Runner::Claiming { msg, turn, attempt } => {
            let key = (turn, attempt);
            if w.claims.contains_key(&key) {
                w.ack_work(msg);
                w.runners[r] = Runner::Idle;
            } else {
                w.claims.insert(key, Claim::Runner(r));
                w.runners[r] = Runner::Fencing {
                    msg,
                    turn,
                    attempt,
                    stop: None,
                };
            }
            true
        }
        // The claim's acknowledgement was lost: the claim as stored says whose it is. The one
        // this runner wrote (same runner, same delivery) is its own (runner/src/claim.rs,
        // store claims::create).
        Runner::ClaimUnsure {
            msg,
            turn,
            attempt,
            stop,
        } => {
            let ours = w.claims.get(&(turn, attempt)) == Some(&Claim::Runner(r));
            if ours && !m.bugs.lost_claim_ack_is_anothers {
                w.runners[r] = Runner::Fencing {
                    msg,
                    turn,
                    attempt,
                    stop,
                };
            } else {
                if ours {
                    w.ghost.walked_away = true;
                }
                w.ack_work(msg);
                w.runners[r] = Runner::Idle;
            }
            true
        }
        Runner::Fencing {
            msg,
            turn,
            attempt,
            stop,
        } => {
            let last = w.fence_last(turn);
            let taken = match fence::take(last.as_ref(), attempt, &m.ids.runners[r]) {
                Take::Append { expect } => w.fence_append(
                    turn,
                    &m.ids.turns[turn],
                    attempt,
                    FenceHolder::Runner {
                        runner: m.ids.runners[r].clone(),
                    },
                    expect,
                ),
                Take::AlreadyOurs { seq } => Some(seq),
                Take::Killed => {
                    w.ack_work(msg);
                    w.runners[r] = reporting(turn, attempt, ExitClass::OperatorKilled, 0, false);
                    return true;
                }
                Take::Lost => {
                    w.ack_work(msg);
                    w.runners[r] = reporting(turn, attempt, ExitClass::RunnerLost, 0, false);
                    return true;
                }
            };
            let Some(seq) = taken else {
                unreachable!("the model's fence append is atomic with its read")
            };
            w.ack_work(msg);
            w.runners[r] = Runner::Running(Run {
                turn,
                attempt,
                fence: seq,
                started: false,
                said: 0,
                awaiting: false,
                uncertain: false,
                stop,
                leased: false,
            });
            true
        }
        Runner::Running(run) => {
            let Some(why) = run.stop else {
                if run.leased {
                    return false;
                }
                // The lease, a heartbeat after the claim (a run that ends first writes none).
                // Only the claimant writes it; one the sweep gave up on has stopped by then.
                w.leases.insert((run.turn, run.attempt), r);
                if let Some(run) = running(w, r) {
                    run.leased = true;
                }
                return true;
            };
            // Stopped: the run ends (after any publish in progress is settled).
            if run.awaiting {
                return false;
            }
            let class = exit::classify(
                &RawExit {
                    stopped_by: Some(why),
                    exit_code: Some(137),
                    ..RawExit::default()
                },
                None,
                run.said > 0,
            );
            w.runners[r] = reporting(run.turn, run.attempt, class, run.said, run.uncertain);
            true
        }
        Runner::Reporting {
            turn,
            attempt,
            class,
            landed,
            uncertain,
        } => {
            let mut landed = landed;
            if uncertain && !m.bugs.trust_uncertain_count {
                // A publish whose outcome is unknown may still land: fence the attempt out first,
                // then count what landed, as the sweep does.
                if let Some(counted) = lose_and_count(m, w, turn, attempt) {
                    landed = counted;
                }
            }
            w.publish_event(turn, attempt, r, EventKind::Exited { class, landed });
            w.runners[r] = Runner::Idle;
            true
        }
        Runner::Down { orphan } => {
            // Restarted: a leftover agent of ours is reported lost, fenced out first.
            if let Some((turn, attempt)) = orphan {
                if let Some(landed) = lose_and_count(m, w, turn, attempt) {
                    w.publish_event(
                        turn,
                        attempt,
                        r,
                        EventKind::Exited {
                            class: ExitClass::RunnerLost,
                            landed,
                        },
                    );
                }
            }
            w.runners[r] = Runner::Idle;
            true
        }
    }
}

fn reporting(
    turn: Turn,
    attempt: Attempt,
    class: ExitClass,
    landed: u32,
    uncertain: bool,
) -> Runner {
    Runner::Reporting {
        turn,
        attempt,
        class,
        landed,
        uncertain,
    }
}

/// Fence `attempt` out (jetstream `fence::lose`) and count what it landed (`fence::landed`);
/// `None` when a later attempt holds the fence (nothing to report).
pub(crate) fn lose_and_count(
    m: &Protocol,
    w: &mut World,
    turn: Turn,
    attempt: Attempt,
) -> Option<u32> {
    let runner_seq = lose(m, w, turn, attempt)?;
    Some(count(w, turn, attempt, runner_seq))
}

pub(crate) fn lose(
    m: &Protocol,
    w: &mut World,
    turn: Turn,
    attempt: Attempt,
) -> Option<Option<u64>> {
    let last = w.fence_last(turn);
    match fence::lose(last.as_ref(), attempt) {
        Lose::Append { expect, runner_seq } => {
            w.fence_append(turn, &m.ids.turns[turn], attempt, FenceHolder::Lost, expect)?;
            Some(runner_seq)
        }
        Lose::AlreadyFenced { replaces } => {
            let replaced = w.fence_at(turn, replaces);
            Some(fence::runner_seq(replaced.as_ref(), attempt))
        }
        Lose::Stale { .. } => None,
    }
}

/// What the attempt landed, read after its own marker (nothing if it never took the fence).
pub(crate) fn count(w: &World, turn: Turn, attempt: Attempt, runner_seq: Option<u64>) -> u32 {
    runner_seq.map_or(0, |_| w.messages_of(turn, Some(attempt)))
}

fn running(w: &mut World, r: RunnerIx) -> Option<&mut Run> {
    match &mut w.runners[r] {
        Runner::Running(run) => Some(run),
        _ => None,
    }
}

pub(crate) fn start(m: &Protocol, w: &mut World, r: RunnerIx) -> bool {
    let Some(run) = running(w, r) else {
        return false;
    };
    if run.started || run.stop.is_some() {
        return false;
    }
    run.started = true;
    let (turn, attempt) = (run.turn, run.attempt);
    *w.ghost.starts.entry((turn, attempt)).or_insert(0) += 1;
    if m.started_events {
        w.publish_event(turn, attempt, r, EventKind::Started);
    }
    true
}

pub(crate) fn say(m: &Protocol, w: &mut World, r: RunnerIx) -> bool {
    let Some(run) = running(w, r) else {
        return false;
    };
    if !run.started || run.stop.is_some() || run.awaiting || run.said >= m.says {
        return false;
    }
    run.awaiting = true;
    let f = InFlight {
        turn: run.turn,
        attempt: run.attempt,
        runner: r,
        fence: run.fence,
    };
    w.inflight.insert(f);
    true
}

/// The server stores the message if the fence is still the one it expects, else refuses it.
pub(crate) fn land(w: &mut World, f: InFlight) -> bool {
    if !w.inflight.remove(&f) {
        return false;
    }
    let last = w.fence_last(f.turn);
    let ok = last.as_ref().map(|l| l.seq) == Some(f.fence);
    if ok {
        let t = f.turn;
        let superseded = w.record(t).is_some_and(|rec| rec.attempt > f.attempt);
        if w.has_final(t) {
            w.ghost
                .bad_landing
                .get_or_insert("a bot message landed after the turn's final status");
        } else if w.ghost.kill_acked.contains(&t) {
            w.ghost
                .bad_landing
                .get_or_insert("a bot message landed after its turn's kill was acknowledged");
        } else if superseded {
            w.ghost
                .bad_landing
                .get_or_insert("a bot message of a superseded attempt landed");
        }
        w.out.push(Out::Message {
            turn: t,
            attempt: f.attempt,
        });
    }
    let stop = fence::check(last.as_ref(), f.fence).map(stop_for);
    if let Some(run) = running(w, f.runner) {
        if run.awaiting && (run.turn, run.attempt) == (f.turn, f.attempt) {
            run.awaiting = false;
            if ok {
                // No event per message (the runner reports them with its exit).
                run.said += 1;
            } else {
                run.stop
                    .get_or_insert(stop.unwrap_or(StopReason::Superseded));
            }
        }
    }
    true
}

fn stop_for(f: Fenced) -> StopReason {
    match f {
        Fenced::Killed => StopReason::Operator,
        Fenced::Lost => StopReason::Superseded,
    }
}

pub(crate) fn exit(_m: &Protocol, w: &mut World, r: RunnerIx, oom: bool) -> bool {
    let Some(run) = running(w, r) else {
        return false;
    };
    if !run.started || run.stop.is_some() || run.awaiting {
        return false;
    }
    let raw = RawExit {
        exit_code: Some(if oom { 137 } else { 0 }),
        oom_killed: oom,
        ..RawExit::default()
    };
    let class = exit::classify(&raw, None, run.said > 0);
    let run = run.clone();
    w.runners[r] = reporting(run.turn, run.attempt, class, run.said, run.uncertain);
    true
}

pub(crate) fn hear_kill(w: &mut World, r: RunnerIx) -> bool {
    let kills = w.kills.clone();
    let Some(run) = running(w, r) else {
        return false;
    };
    if run.stop.is_some() || !kills.contains(&(run.turn, run.attempt)) {
        return false;
    }
    run.stop = Some(StopReason::Operator);
    true
}

pub(crate) fn check_fence(w: &mut World, r: RunnerIx) -> bool {
    let Some(run) = w.runners[r].clone().into_run() else {
        return false;
    };
    if run.stop.is_some() {
        return false;
    }
    let last = w.fence_last(run.turn);
    let Some(f) = fence::check(last.as_ref(), run.fence) else {
        return false;
    };
    if let Some(run) = running(w, r) {
        run.stop = Some(stop_for(f));
    }
    true
}

pub(crate) fn lapse(w: &mut World, turn: Turn, attempt: Attempt) -> bool {
    let Some(h) = w.leases.remove(&(turn, attempt)) else {
        return false;
    };
    // A runner cut off stops its agent by its own lease deadline, before the server's TTL.
    if let Some(run) = running(w, h) {
        if (run.turn, run.attempt) == (turn, attempt) {
            run.stop.get_or_insert(StopReason::LeaseLost);
        }
    }
    true
}

pub(crate) fn crash(w: &mut World, r: RunnerIx) -> bool {
    let orphan = match &w.runners[r] {
        Runner::Down { .. } => return false,
        Runner::Running(run) if run.started => Some((run.turn, run.attempt)),
        _ => None,
    };
    if let Some(msg) = w.runners[r].work_msg() {
        w.release_work(msg);
    }
    w.runners[r] = Runner::Down { orphan };
    true
}

pub(crate) fn lose_ack(w: &mut World, r: RunnerIx) -> bool {
    let Some(run) = running(w, r) else {
        return false;
    };
    if !run.awaiting {
        return false;
    }
    // The runner gave up on the acknowledgement; the message may still land.
    run.awaiting = false;
    run.uncertain = true;
    true
}

/// The claim is stored, but its runner does not hear so (a lost acknowledgement).
pub(crate) fn lose_claim_ack(w: &mut World, r: RunnerIx) -> bool {
    let Runner::Claiming { msg, turn, attempt } = w.runners[r] else {
        return false;
    };
    if w.claims.contains_key(&(turn, attempt)) {
        return false;
    }
    w.claims.insert((turn, attempt), Claim::Runner(r));
    w.runners[r] = Runner::ClaimUnsure {
        msg,
        turn,
        attempt,
        stop: None,
    };
    true
}

pub(crate) fn lose_report(w: &mut World, r: RunnerIx) -> bool {
    if !matches!(w.runners[r], Runner::Reporting { .. }) {
        return false;
    }
    w.runners[r] = Runner::Idle;
    true
}

impl Runner {
    fn into_run(self) -> Option<Run> {
        match self {
            Runner::Running(r) => Some(r),
            _ => None,
        }
    }
}
