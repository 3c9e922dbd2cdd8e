//! The coordinators, the sweep, the ops service and the dispatcher: each takes one job at a time
//! and carries out outboxes step by step (store/src/turns.rs `apply_event_at`, `run_outbox`,
//! `execute`, `admit`, `create_in_chat`; coordinator/src/sweep.rs; coordinator/src/ops.rs).

use crate::runner;
use crate::world::*;
use crate::Protocol;
use turnpike_core::chat::{self, Joined, Taken};
use turnpike_core::fence::{self, FenceHolder, Kill};
use turnpike_core::history::Budget;
use turnpike_core::lifecycle::{self, Effect, Event, NewTurn, Step, Unchanged};
use turnpike_core::recovery::{self, Plan};
use turnpike_core::wire::{ExitClass, ExitReport, HistoryEntry, InboundMessage, OperatorAction};
use turnpike_core::{Timestamp, TurnRecord};

const NOW: Timestamp = Timestamp(0);
const BUDGET: Budget = Budget {
    entries: 50,
    bytes: 1 << 20,
};

pub(crate) fn deliver(w: &mut World, p: ProcIx, ev: usize) -> bool {
    if w.procs[p].job.is_some()
        || w.events.get(ev).map(|e| e.delivery) != Some(EventDelivery::Pending)
    {
        return false;
    }
    w.events[ev].delivery = EventDelivery::Held(p);
    w.procs[p].job = Some(Job::Event { ev, applied: false });
    true
}

pub(crate) fn dispatch(m: &Protocol, w: &mut World, t: Turn) -> bool {
    let p = m.dispatcher();
    if w.procs[p].job.is_some() || w.inbound[t] != Delivery::Pending {
        return false;
    }
    if !m.bugs.ignore_chat_order {
        let taken = Taken::of(w.chat.as_ref());
        let next = match taken {
            Taken::UpTo(n) if (n as usize) < m.turns => Some(n + 1),
            _ => None,
        };
        if !chat::in_order(taken, next, seq(t)) {
            return false;
        }
    }
    w.inbound[t] = Delivery::Held;
    w.procs[p].job = Some(Job::Inbound {
        turn: t,
        phase: InboundPhase::Create,
    });
    true
}

fn seq(t: Turn) -> u64 {
    t as u64 + 1
}

pub(crate) fn sweep_turn(m: &Protocol, w: &mut World, t: Turn) -> bool {
    let p = m.sweep();
    if w.procs[p].job.is_some() || !w.live.contains(&t) {
        return false;
    }
    w.procs[p].job = Some(Job::Sweep {
        turn: t,
        phase: SweepPhase::Read,
    });
    true
}

pub(crate) fn kill(m: &Protocol, w: &mut World, t: Turn) -> bool {
    let p = m.operator();
    if w.procs[p].job.is_some() || w.ghost.kill_requested.contains(&t) || w.turns[t].is_none() {
        return false;
    }
    w.ghost.kill_requested.insert(t);
    w.procs[p].job = Some(Job::Kill {
        turn: t,
        applied: false,
    });
    true
}

pub(crate) fn crash(w: &mut World, p: ProcIx) -> bool {
    let proc = std::mem::take(&mut w.procs[p]);
    match proc.job {
        Some(Job::Event { ev, .. }) => w.events[ev].delivery = EventDelivery::Pending,
        Some(Job::Inbound { turn, .. }) => w.inbound[turn] = Delivery::Pending,
        Some(_) => {}
        None if proc.stack.is_empty() => return false,
        None => {}
    }
    true
}

/// Apply `event` with compare-and-set; the record as stored afterwards, or `None` (no record,
/// or an event that cannot be right: dead-lettered).
fn apply(w: &mut World, t: Turn, event: &Event) -> Option<(TurnRecord, Option<Unchanged>)> {
    let stored = w.turns[t].as_ref()?;
    let before = stored.record.state;
    match lifecycle::apply(&stored.record, event, NOW).ok()? {
        Step::Unchanged(why) => Some((stored.record.clone(), Some(why))),
        Step::Changed { record, effects } => {
            let mut record = *record;
            record.outbox.extend(effects);
            if before == turnpike_core::TurnState::Waiting && record.state != before {
                // Per-chat order: every earlier turn of the chat has ended.
                if (0..t).any(|u| w.record(u).is_none_or(|r| !r.state.is_terminal())) {
                    w.ghost.out_of_order = true;
                }
            }
            w.turns[t] = Some(Stored {
                record: record.clone(),
            });
            w.note_record(t);
            Some((record, None))
        }
    }
}

fn outbox(turn: Turn, snapshot: TurnRecord) -> Frame {
    Frame::Outbox {
        turn,
        snapshot,
        i: 0,
        sub: 0,
    }
}

pub(crate) fn step(m: &Protocol, w: &mut World, p: ProcIx, choice: bool) -> bool {
    // Only the sweep's plan step has a choice to make.
    let chooses = matches!(
        w.procs[p],
        Proc {
            job: Some(Job::Sweep {
                phase: SweepPhase::Read,
                ..
            }),
            ref stack,
        } if stack.is_empty()
    );
    if choice && !chooses {
        return false;
    }
    if let Some(frame) = w.procs[p].stack.last().cloned() {
        return frame_step(m, w, p, frame);
    }
    let Some(job) = w.procs[p].job.clone() else {
        return false;
    };
    match job {
        Job::Event { ev, applied: false } => {
            let e = w.events[ev].clone();
            let claimant = w.claims.get(&(e.turn, e.attempt)) == Some(&Claim::Runner(e.runner));
            let event = match e.kind {
                EventKind::Started => Event::Started {
                    attempt: e.attempt,
                    runner: m.ids.runners[e.runner].clone(),
                    published_at: NOW,
                },
                EventKind::Landed(seq) => Event::MessageLanded {
                    attempt: e.attempt,
                    seq,
                    stream_seq: None,
                },
                EventKind::Exited { class, landed } => Event::Exited {
                    attempt: e.attempt,
                    report: report(class, landed),
                },
            };
            // Only the attempt's claimant speaks for it; anything else is dead-lettered.
            let applied = if claimant {
                apply(w, e.turn, &event)
            } else {
                None
            };
            if let Some((current, _)) = applied {
                w.procs[p].stack.push(outbox(e.turn, current));
            }
            w.procs[p].job = Some(Job::Event { ev, applied: true });
        }
        Job::Event { ev, applied: true } => {
            w.events[ev].delivery = EventDelivery::Acked;
            w.procs[p].job = None;
        }
        Job::Kill {
            turn,
            applied: false,
        } => {
            let event = Event::KillRequested {
                action: OperatorAction {
                    by: "op".into(),
                    at: NOW,
                },
            };
            if let Some((current, _)) = apply(w, turn, &event) {
                w.procs[p].stack.push(outbox(turn, current));
            }
            w.procs[p].job = Some(Job::Kill {
                turn,
                applied: true,
            });
        }
        Job::Kill {
            turn,
            applied: true,
        } => {
            // The ops service answers the operator: the kill took effect.
            if w.record(turn).is_some_and(|r| r.kill.is_some()) {
                w.ghost.kill_acked.insert(turn);
            }
            w.procs[p].job = None;
        }
        Job::Inbound { turn, phase } => inbound_step(m, w, p, turn, phase),
        Job::Sweep { turn, phase } => sweep_step(m, w, p, turn, phase, choice),
    }
    true
}

fn report(class: ExitClass, landed: u32) -> ExitReport {
    let mut r = ExitReport::without_output(class, "model", NOW);
    r.error = None;
    r.messages_landed = landed;
    r
}

fn inbound_step(m: &Protocol, w: &mut World, p: ProcIx, t: Turn, phase: InboundPhase) {
    let next = |w: &mut World, phase| {
        w.procs[p].job = Some(Job::Inbound { turn: t, phase });
    };
    match phase {
        InboundPhase::Create => {
            // Into the live index first, then the record (a create: a replay finds it).
            w.live.insert(t);
            if w.turns[t].is_none() {
                let (record, _) = lifecycle::create(new_turn(m, t), NOW);
                w.turns[t] = Some(Stored { record });
            }
            let Some(record) = w.record(t).cloned() else {
                unreachable!("just stored")
            };
            if record.state.is_terminal() {
                // A replay of a message whose turn ended (killed before it joined): it must not
                // hold its chat (admitting an ended turn releases it).
                w.procs[p].stack.push(Frame::Admit {
                    turn: t,
                    history: Vec::new(),
                });
                w.procs[p].stack.push(outbox(t, record));
                next(w, InboundPhase::Taken);
            } else {
                next(w, InboundPhase::Join);
            }
        }
        InboundPhase::Join => {
            let c = w.chat.get_or_insert_with(|| chat::empty(&m.ids.chat));
            if let (_, Joined::Live(history)) = chat::join(c, &m.ids.turns[t], Some(seq(t))) {
                w.procs[p].stack.push(Frame::Admit { turn: t, history });
            }
            next(w, InboundPhase::Ack);
        }
        InboundPhase::Taken => {
            let c = w.chat.get_or_insert_with(|| chat::empty(&m.ids.chat));
            chat::inbound_taken(c, seq(t));
            next(w, InboundPhase::Ack);
        }
        InboundPhase::Ack => {
            w.inbound[t] = Delivery::Acked;
            w.procs[p].job = None;
        }
    }
}

fn new_turn(m: &Protocol, t: Turn) -> NewTurn {
    NewTurn {
        turn: m.ids.turns[t].clone(),
        message: InboundMessage {
            v: turnpike_core::FORMAT_VERSION,
            id: format!("m{t}"),
            chat: m.ids.chat.clone(),
            text: format!("q{t}"),
            sender: None,
            attachments: Vec::new(),
        },
        history: Vec::new(),
        max_turn_retry: m.max_turn_retry,
        retry_delay: std::time::Duration::from_secs(10),
        rerun_of: None,
        created_by: None,
        admit_now: false,
    }
}

fn sweep_step(m: &Protocol, w: &mut World, p: ProcIx, t: Turn, phase: SweepPhase, choice: bool) {
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
            if leftovers {
                w.procs[p].stack.push(outbox(t, snapshot.clone()));
            }
            set(w, SweepPhase::Judge { snapshot });
        }
        SweepPhase::Judge { snapshot } => match recovery::plan(&snapshot, false).1 {
            Plan::Nothing => done(w),
            Plan::Finish => {
                w.procs[p].stack.push(outbox(t, snapshot));
                set(w, SweepPhase::Unlist);
            }
            Plan::CheckAttempt { attempt } => judge_attempt(m, w, p, t, attempt),
            Plan::CheckRetry { attempt } => {
                let key = (t, attempt);
                let claimed = w.claims.contains_key(&key);
                if claimed && m.bugs.trust_any_retry_claim {
                    return done(w);
                }
                let scheduled = w.schedules.contains(&key);
                let queued = w.work.iter().any(|m| (m.turn, m.attempt) == key);
                match recovery::judge_retry(claimed, scheduled, queued) {
                    recovery::Retry::CheckAttempt => judge_attempt(m, w, p, t, attempt),
                    recovery::Retry::OnItsWay => done(w),
                    recovery::Retry::Reschedule => {
                        w.schedules.insert(key);
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
            if let Some((current, _)) = apply(w, t, &event) {
                w.procs[p].stack.push(outbox(t, current));
            }
            done(w);
        }
        SweepPhase::Unlist => {
            w.live.remove(&t);
            done(w);
        }
    }
}

/// Is the current attempt alive? Claim, then lease, then whether its exit was reported.
fn judge_attempt(m: &Protocol, w: &mut World, p: ProcIx, t: Turn, attempt: Attempt) {
    let key = (t, attempt);
    let claim = match w.claims.get(&key) {
        None => recovery::Claim::None,
        Some(Claim::Cancelled) => recovery::Claim::Cancelled,
        Some(Claim::Runner(_)) => recovery::Claim::Runner,
    };
    let lease = if w.leases.contains_key(&key) {
        recovery::Lease::Live
    } else {
        recovery::Lease::Lapsed
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

fn frame_step(m: &Protocol, w: &mut World, p: ProcIx, frame: Frame) -> bool {
    let top = w.procs[p].stack.len() - 1;
    match frame {
        Frame::Admit { turn, history } => {
            let admitted = apply(w, turn, &Event::Admitted { history });
            w.procs[p].stack[top] = match admitted {
                None => return pop(w, p),
                Some((record, Some(Unchanged::AlreadyEnded { .. }))) => {
                    // Ended before it joined (killed): let the chat go to its next turn.
                    if m.bugs.keep_ended_turn_live {
                        return pop(w, p);
                    }
                    match release(m, w, &record) {
                        Some((next, history)) if next != turn => Frame::Admit {
                            turn: next,
                            history,
                        },
                        _ => return pop(w, p),
                    }
                }
                Some((record, _)) => outbox(turn, record),
            };
            true
        }
        Frame::Outbox {
            turn,
            snapshot,
            i,
            sub,
        } => {
            let Some(effect) = snapshot.outbox.get(i).cloned() else {
                if i > snapshot.outbox.len() {
                    // Cleared: an ended turn leaves the live index.
                    w.live.remove(&turn);
                    return pop(w, p);
                }
                // All carried out: clear them from the stored outbox (compare-and-set, retried).
                let mut cleared = false;
                if let Some(stored) = w.turns[turn].as_mut() {
                    let before = stored.record.outbox.len();
                    stored
                        .record
                        .outbox
                        .retain(|e| !snapshot.outbox.contains(e));
                    cleared = stored.record.outbox.len() != before;
                }
                let ended = snapshot
                    .outbox
                    .iter()
                    .any(|e| matches!(e, Effect::Ended { .. }));
                if !(cleared && ended) {
                    return pop(w, p);
                }
                w.procs[p].stack[top] = Frame::Outbox {
                    turn,
                    snapshot,
                    i: i + 1,
                    sub: 0,
                };
                return true;
            };
            let mut sub_next = 0;
            match &effect {
                Effect::DispatchAttempt {
                    attempt,
                    not_before: None,
                } => w.publish_work(turn, *attempt, true),
                Effect::DispatchAttempt { attempt, .. } => {
                    w.schedules.insert((turn, *attempt));
                }
                Effect::Notify { kind, .. } => {
                    let dup = w
                        .out
                        .iter()
                        .any(|o| matches!(o, Out::Notice { turn: u, .. } if *u == turn));
                    if !dup {
                        w.out.push(Out::Notice { turn, kind: *kind });
                    }
                }
                Effect::FlagChatErrored { .. } => {}
                Effect::ForwardKill { attempt } => {
                    if !m.bugs.kill_without_fence {
                        kill_fence(m, w, turn, *attempt);
                    }
                    w.kills.insert((turn, *attempt));
                }
                Effect::CancelAttempt { attempt } => {
                    let key = (turn, *attempt);
                    w.schedules.remove(&key);
                    let claimed = w.claims.contains_key(&key);
                    if !claimed {
                        w.claims.insert(key, Claim::Cancelled);
                    }
                    kill_fence(m, w, turn, *attempt);
                    if claimed {
                        w.kills.insert(key);
                    }
                }
                Effect::Ended { state } => match sub {
                    0 => {
                        if !w.has_final(turn) {
                            w.out.push(Out::Final {
                                turn,
                                state: *state,
                            });
                        }
                        sub_next = 1;
                    }
                    _ => {
                        if let Some((next, history)) = release(m, w, &snapshot) {
                            if next != turn {
                                w.procs[p].stack.push(Frame::Admit {
                                    turn: next,
                                    history,
                                });
                            }
                        }
                    }
                },
            }
            let (i, sub) = if sub_next == 0 {
                (i + 1, 0)
            } else {
                (i, sub_next)
            };
            w.procs[p].stack[top] = Frame::Outbox {
                turn,
                snapshot,
                i,
                sub,
            };
            true
        }
    }
}

fn pop(w: &mut World, p: ProcIx) -> bool {
    w.procs[p].stack.pop();
    true
}

fn kill_fence(m: &Protocol, w: &mut World, turn: Turn, attempt: Attempt) {
    let last = w.fence_last(turn);
    if let Kill::Append { expect } = fence::kill(last.as_ref()) {
        let holder = FenceHolder::Killed { by: "op".into() };
        w.fence_append(turn, &m.ids.turns[turn], attempt, holder, expect);
    }
}

/// Release an ended turn from its chat; the chat's live turn afterwards, to admit.
fn release(m: &Protocol, w: &mut World, record: &TurnRecord) -> Option<(Turn, Vec<HistoryEntry>)> {
    let t = m.ids.turns.iter().position(|id| *id == record.turn)?;
    let replies = vec!["reply".to_owned(); w.messages_of(t, None) as usize];
    let c = w.chat.as_mut()?;
    let released = chat::release(c, record, &replies, BUDGET);
    let (next, history) = released.next?;
    let next = m.ids.turns.iter().position(|id| *id == next)?;
    Some((next, history))
}
