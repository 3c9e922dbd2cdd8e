//! The dispatcher's steps for one inbound message: create the turn, join its chat, admit it.

use super::*;

pub(super) fn inbound_step(m: &Protocol, w: &mut World, p: ProcIx, t: Turn, phase: InboundPhase) {
    let next = |w: &mut World, phase| {
        w.procs[p].job = Some(Job::Inbound { turn: t, phase });
    };
    match phase {
        InboundPhase::Create => {
            // Into the live index first (a create: whether it was listed tells a replay whether
            // its end's effects may be owed), then the record (a create: a replay finds it).
            let listed_here = w.live.insert(t);
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
                next(
                    w,
                    InboundPhase::Taken {
                        unlist: listed_here,
                    },
                );
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
        InboundPhase::Taken { unlist } => {
            let c = w.chat.get_or_insert_with(|| chat::empty(&m.ids.chat));
            chat::inbound_taken(c, seq(t));
            // Not listed before the replay: its effects were carried out; unlisted again, or
            // the sweep would carry them out a second time.
            if unlist {
                w.live.remove(&t);
            }
            next(w, InboundPhase::Ack);
        }
        InboundPhase::Ack => {
            w.inbound[t] = Delivery::Acked;
            w.procs[p].job = None;
        }
    }
}

pub(super) fn new_turn(m: &Protocol, t: Turn) -> NewTurn {
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
