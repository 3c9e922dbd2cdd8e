//! The coordinators, the sweep, the ops service and the dispatcher: each takes one job at a time
//! and carries out outboxes step by step (store/src/turns.rs `apply_event_at`, `create_in_chat`;
//! store/src/outbox.rs `run_outbox`, `execute`, `admit`; coordinator/src/sweep.rs and ops.rs).

use crate::runner;
use crate::world::*;
use crate::Protocol;
use turnpike_core::chat::{self, Joined, Taken};
use turnpike_core::exit::StopReason;
use turnpike_core::fence::{self, FenceHolder, Kill};
use turnpike_core::history::Budget;
use turnpike_core::lifecycle::{self, Effect, Event, EventOutcome, NewTurn, Unchanged};
use turnpike_core::recovery::{self, Plan};
use turnpike_core::wire::{ExitClass, ExitReport, HistoryEntry, InboundMessage, OperatorAction};
use turnpike_core::{Timestamp, TurnRecord};

mod inbound;
mod outbox;
mod sweep;

use inbound::*;
use outbox::*;
use sweep::*;

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
    w.procs[p].job = Some(Job::Event {
        evs: vec![ev],
        applied: false,
    });
    true
}

pub(crate) fn batch(w: &mut World, p: ProcIx, ev: usize) -> bool {
    let Some(Job::Event {
        evs,
        applied: false,
    }) = &mut w.procs[p].job
    else {
        return false;
    };
    let same_turn = w.events.get(evs[0]).map(|e| e.turn) == w.events.get(ev).map(|e| e.turn);
    if !same_turn || w.events[ev].delivery != EventDelivery::Pending || evs.contains(&ev) {
        return false;
    }
    evs.push(ev);
    w.events[ev].delivery = EventDelivery::Held(p);
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
        Some(Job::Event { evs, .. }) => {
            for ev in evs {
                w.events[ev].delivery = EventDelivery::Pending;
            }
        }
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
    apply_all(w, t, &[event])
}

/// Apply `events` in order with one compare-and-set (store/src/turns.rs `apply_events_from`):
/// the record as stored afterwards, and why nothing changed if nothing did; `None` if there is
/// no record or every event was refused (dead-lettered).
fn apply_all(w: &mut World, t: Turn, events: &[&Event]) -> Option<(TurnRecord, Option<Unchanged>)> {
    let stored = w.turns[t].as_ref()?;
    let before = stored.record.state;
    let timed: Vec<(&Event, Timestamp)> = events.iter().map(|e| (*e, NOW)).collect();
    let batch = lifecycle::apply_batch(&stored.record, &timed);
    let Some(record) = batch.record else {
        let why = batch.outcomes.into_iter().rev().find_map(|o| match o {
            EventOutcome::Unchanged(why) => Some(why),
            _ => None,
        })?;
        return Some((stored.record.clone(), Some(why)));
    };
    if before == turnpike_core::TurnState::Waiting && record.state != before {
        check_order(w, t);
    }
    w.turns[t] = Some(Stored {
        record: record.clone(),
    });
    w.note_record(t);
    Some((record, None))
}

/// Turn `t` leaves waiting: per-chat order says every earlier turn of the chat has ended.
fn check_order(w: &mut World, t: Turn) {
    if (0..t).any(|u| w.record(u).is_none_or(|r| !r.state.is_terminal())) {
        w.ghost.out_of_order = true;
    }
}

/// What an apply leaves to carry out (store/src/outbox.rs `run_owed`): nothing for an ended
/// turn that has left the live index (its effects were carried out).
fn owed(w: &World, turn: Turn, applied: (TurnRecord, Option<Unchanged>)) -> Option<Frame> {
    let (record, unchanged) = applied;
    if unchanged.is_some() && record.state.is_terminal() && !w.live.contains(&turn) {
        return None;
    }
    Some(outbox(turn, record))
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
    // Only the sweep's plan and judge steps and the dispatcher's first step have a choice to
    // make.
    let chooses = matches!(
        w.procs[p],
        Proc {
            job: Some(Job::Sweep {
                phase: SweepPhase::Read | SweepPhase::Judge { .. },
                ..
            } | Job::Inbound {
                phase: InboundPhase::Create,
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
        Job::Event {
            evs,
            applied: false,
        } => {
            let turn = w.events[evs[0]].turn;
            // Only the attempt's claimant speaks for it; anything else is dead-lettered.
            let believed: Vec<Event> = evs
                .iter()
                .map(|ev| &w.events[*ev])
                .filter(|e| w.claims.get(&(e.turn, e.attempt)) == Some(&Claim::Runner(e.runner)))
                .map(|e| match e.kind {
                    EventKind::Started => Event::Started {
                        attempt: e.attempt,
                        runner: m.ids.runners[e.runner].clone(),
                        published_at: NOW,
                    },
                    EventKind::Exited { class, landed } => Event::Exited {
                        attempt: e.attempt,
                        report: report(class, landed),
                    },
                })
                .collect();
            let applied = if believed.is_empty() {
                None
            } else if m.bugs.batch_judged_on_the_read_record {
                let read = w.turns[turn].clone();
                let mut last = None;
                for event in &believed {
                    w.turns[turn].clone_from(&read);
                    last = apply(w, turn, event).or(last);
                }
                last
            } else {
                apply_all(w, turn, &believed.iter().collect::<Vec<_>>())
            };
            if let Some(frame) = applied.and_then(|a| owed(w, turn, a)) {
                w.procs[p].stack.push(frame);
            }
            w.procs[p].job = Some(Job::Event { evs, applied: true });
        }
        Job::Event { evs, applied: true } => {
            for ev in evs {
                w.events[ev].delivery = EventDelivery::Acked;
            }
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
            if let Some(frame) = apply(w, turn, &event).and_then(|a| owed(w, turn, a)) {
                w.procs[p].stack.push(frame);
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
        Job::Inbound { turn, phase } => inbound_step(m, w, p, turn, phase, choice),
        Job::Sweep { turn, phase } => sweep_step(m, w, p, turn, phase, choice),
    }
    true
}

fn report(class: ExitClass, landed: u32) -> ExitReport {
    let mut r = ExitReport::without_output(class, "model", NOW);
    r.error = None;
    r.messages_landed = landed;
    // Every clean run leaves a workspace; whether it becomes the chat's is the protocol's call.
    if class == ExitClass::Clean {
        r.workspace = Some("ws".into());
    }
    r
}

fn pop(w: &mut World, p: ProcIx) -> bool {
    w.procs[p].stack.pop();
    true
}
