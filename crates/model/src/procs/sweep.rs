//! The coordinator's recovery sweep, step by step: leftovers, lost attempts, lost schedules.

use super::*;

pub(super) fn sweep_step(
    m: &Protocol,
    w: &mut World,
    p: ProcIx,
    t: Turn,
    phase: SweepPhase,
    choice: bool,
) {
    let set = |w: &mut World, phase| {
        w.procs[p].job = Some(Job::Sweep { turn: t, phase });
    };
    let done = |w: &mut World| w.procs[p].job = None;
    match phase {
        SweepPhase::Read => match w.record(t).cloned() {
            // `choice`: the record was last written more than a heartbeat ago.
            Some(snapshot) => set(
                w,
                SweepPhase::Plan {
                    snapshot,
                    stale: choice,
                },
            ),
            None => done(w),
        },
        SweepPhase::Plan { snapshot, stale } => {
            let (leftovers, _) = recovery::plan(&snapshot, stale);
            if !leftovers.is_empty() {
                let mut owed = snapshot.clone();
                owed.outbox = leftovers;
                w.procs[p].stack.push(outbox(t, owed));
            }
            set(w, SweepPhase::Judge { snapshot });
        }
        SweepPhase::Judge { snapshot } => match recovery::plan(&snapshot, false).1 {
            Plan::Nothing => done(w),
            Plan::Finish => {
                // Carried out, an ended turn leaves the live index (the outbox frame's last step).
                done(w);
                w.procs[p].stack.push(outbox(t, snapshot));
            }
            Plan::CheckAttempt { attempt } => judge_attempt(m, w, p, t, attempt, choice),
            Plan::CheckDispatched { attempt } => {
                let key = (t, attempt);
                let claimed = w.claims.contains_key(&key);
                if claimed && m.bugs.trust_any_retry_claim {
                    return done(w);
                }
                let scheduled = w.schedules.contains(&key);
                let queued = w.work.iter().any(|m| (m.turn, m.attempt) == key);
                match recovery::judge_retry(claimed, scheduled, queued) {
                    recovery::Retry::CheckAttempt => judge_attempt(m, w, p, t, attempt, choice),
                    recovery::Retry::OnItsWay => done(w),
                    recovery::Retry::Reschedule => {
                        // Attempt 1 under its dedup id; a retry for its due time.
                        if snapshot.next_attempt_due.is_none() {
                            w.publish_work(t, attempt, true);
                        } else {
                            w.schedules.insert(key);
                        }
                        done(w);
                    }
                }
            }
        },
        SweepPhase::Lose { attempt, counted } => match runner::lose(m, w, t, attempt) {
            Some(runner_seq) => set(
                w,
                SweepPhase::Report {
                    attempt,
                    runner_seq,
                    counted,
                },
            ),
            // A later attempt holds the fence: the record was stale.
            None => done(w),
        },
        SweepPhase::Report {
            attempt,
            runner_seq,
            counted,
        } => {
            let landed = counted.unwrap_or_else(|| runner::count(w, t, attempt, runner_seq));
            let event = Event::Exited {
                attempt,
                report: report(ExitClass::RunnerLost, landed),
            };
            if let Some(frame) = apply(w, t, &event).and_then(|a| owed(w, t, a)) {
                w.procs[p].stack.push(frame);
            }
            done(w);
        }
    }
}

/// Is the current attempt alive? Claim, then lease, then whether its exit was reported.
///
/// `long_absent`: no lease has been seen for a whole lease since the sweep first found none
/// (`recovery::absent_lease`; the model has no time, so either may hold). By then a runner
/// still running the attempt without a lease is past its own deadline: it stopped its run
/// (`LeaseLost`), as a runner cut off does before its lease's TTL.
pub(super) fn judge_attempt(
    m: &Protocol,
    w: &mut World,
    p: ProcIx,
    t: Turn,
    attempt: Attempt,
    long_absent: bool,
) {
    let key = (t, attempt);
    let claim = match w.claims.get(&key) {
        None => recovery::Claim::None,
        Some(Claim::Cancelled) => recovery::Claim::Cancelled,
        Some(Claim::Runner(_)) => recovery::Claim::Runner,
    };
    let lease = if w.leases.contains_key(&key) {
        recovery::Lease::Live
    } else if long_absent || m.bugs.absent_lease_lost_at_once {
        if !m.bugs.absent_lease_lost_at_once {
            for r in &mut w.runners {
                match r {
                    Runner::Running(run) if (run.turn, run.attempt) == key && !run.leased => {
                        run.stop.get_or_insert(StopReason::LeaseLost);
                    }
                    // Claimed, its agent not started yet: the deadline runs from the claim all
                    // the same, and the runner never starts an agent once its run is stopped.
                    Runner::Fencing {
                        turn,
                        attempt,
                        stop,
                        ..
                    }
                    | Runner::ClaimUnsure {
                        turn,
                        attempt,
                        stop,
                        ..
                    } if (*turn, *attempt) == key => {
                        stop.get_or_insert(StopReason::LeaseLost);
                    }
                    _ => {}
                }
            }
        }
        recovery::Lease::Lapsed
    } else {
        recovery::Lease::NotYet
    };
    let reported = lease == recovery::Lease::Lapsed
        && w.events
            .iter()
            .any(|e| (e.turn, e.attempt) == key && matches!(e.kind, EventKind::Exited { .. }));
    w.procs[p].job = match recovery::judge_attempt(claim, lease, reported) {
        recovery::Attempt::Lost => Some(Job::Sweep {
            turn: t,
            phase: SweepPhase::Lose {
                attempt,
                counted: m
                    .bugs
                    .count_before_fence
                    .then(|| w.messages_of(t, Some(attempt))),
            },
        }),
        _ => None,
    };
}
