//! The dispatcher's steps for one inbound message: create the turn, join its chat, admit it.

use super::*;

/// `choice`: the order check's read of the chat is stale, so joining an idle chat first fails
/// its compare-and-set (nothing written) and the turn takes the way a busy chat's does.
pub(super) fn inbound_step(
    m: &Protocol,
    w: &mut World,
    p: ProcIx,
    t: Turn,
    phase: InboundPhase,
    choice: bool,
) {
    let next = |w: &mut World, phase| {
        w.procs[p].job = Some(Job::Inbound { turn: t, phase });
    };
    match phase {
        InboundPhase::Create => {
            // Into the live index first (a create: whether it was listed tells a replay whether
            // its end's effects may be owed).
            let listed_here = w.live.insert(t);
            // An idle chat's new message joins first, with one compare-and-set at the order
            // check's read, and its record is created admitted (store `chats::join_if_idle`).
            // Anything else, or a failed compare-and-set, writes nothing to the chat here.
            let mut c = w.chat.clone().unwrap_or_else(|| chat::empty(&m.ids.chat));
            let joined = if m.bugs.join_before_create {
                // The bug joins whatever the chat's state.
                Some(match chat::join(&mut c, &m.ids.turns[t], Some(seq(t))).1 {
                    Joined::Live(history) => Some(history),
                    Joined::Waiting | Joined::Left | Joined::Full { .. } => None,
                })
            } else if choice {
                None
            } else {
                chat::join_if_idle(&mut c, &m.ids.turns[t], seq(t)).map(Some)
            };
            if let Some(history) = joined {
                w.chat = Some(c);
                return next(
                    w,
                    InboundPhase::CreateAdmitted {
                        history,
                        listed_here,
                    },
                );
            }
            create(m, w, p, t, None, listed_here);
        }
        InboundPhase::CreateAdmitted { history: None, .. } if w.turns[t].is_none() => {
            // Only the bug joins a busy chat first; it takes the turn's join as done.
            let (record, _) = lifecycle::create(new_turn(m, t), NOW);
            w.turns[t] = Some(Stored { record });
            next(w, InboundPhase::Ack);
        }
        InboundPhase::CreateAdmitted {
            history,
            listed_here,
        } => create(m, w, p, t, history, listed_here),
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

/// Create the turn's record (a create: a replay finds it), admitted if its chat was idle when it
/// joined (`history`), then go on: an admitted new turn's outbox dispatches attempt 1; a replay's
/// or a waiting turn's join comes next.
fn create(
    m: &Protocol,
    w: &mut World,
    p: ProcIx,
    t: Turn,
    history: Option<Vec<turnpike_core::wire::HistoryEntry>>,
    listed_here: bool,
) {
    let next = |w: &mut World, phase| {
        w.procs[p].job = Some(Job::Inbound { turn: t, phase });
    };
    if w.turns[t].is_none() {
        let (record, _) = lifecycle::create(new_turn(m, t), NOW);
        if let Some(history) = history {
            let record = lifecycle::admitted_at_creation(&record, history);
            check_order(w, t);
            w.turns[t] = Some(Stored {
                record: record.clone(),
            });
            w.procs[p].stack.push(outbox(t, record));
            return next(w, InboundPhase::Ack);
        }
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
