//! Per-chat order as a pure state machine over the chat record: one live turn, the rest waiting
//! in arrival order, and the history each new turn is given. The shells read the record, call one
//! of these, and write the result back with compare-and-set; every function is idempotent, so a
//! replay after a crash only completes what is missing.
//!
//! Each returns whether the record changed (write it) and what the caller does next.

use crate::history::{self, Budget};
use crate::ids::{ChatId, TurnId};
use crate::record::TurnRecord;
use crate::wire::{ChatRecord, HistoryEntry, Role};
use crate::FORMAT_VERSION;

/// The record of a chat that has none yet.
pub fn empty(chat: &ChatId) -> ChatRecord {
    ChatRecord {
        workspace: None,
        v: FORMAT_VERSION,
        chat: chat.clone(),
        live: None,
        waiting: Vec::new(),
        history: Vec::new(),
        history_dropped: 0,
        inbound_seq: 0,
        errored: None,
        cleared: Vec::new(),
    }
}

/// What joining its chat did to a new turn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Joined {
    /// It is the chat's live turn: admit it with this history.
    Live(Vec<HistoryEntry>),
    /// It waits for the chat's live turn to end.
    Waiting,
    /// Its message was taken before and the turn has since left the chat (a replay after a
    /// dispatcher died between the join and the acknowledgement): nothing to do.
    Left,
    /// The chat has its whole queue waiting already (`chat_queue_max`): the turn does not join,
    /// its message is counted taken, and its caller ends it (the chat record must stay within
    /// what NATS carries).
    Full {
        /// Turns waiting in the chat already.
        waiting: usize,
    },
}

/// A new turn joins its chat: it becomes the live turn if there is none, else it queues in
/// arrival order. `inbound_seq` (the inbound message's stream sequence) is recorded as taken.
/// Returns `(changed, joined)`.
pub fn join(c: &mut ChatRecord, turn: &TurnId, inbound_seq: Option<u64>) -> (bool, Joined) {
    join_bounded(c, turn, inbound_seq, usize::MAX)
}

/// [`join`], with at most `queue_max` turns waiting: one more is [`Joined::Full`].
pub fn join_bounded(
    c: &mut ChatRecord,
    turn: &TurnId,
    inbound_seq: Option<u64>,
    queue_max: usize,
) -> (bool, Joined) {
    if c.live.as_ref() == Some(turn) {
        return (false, Joined::Live(c.history.clone()));
    }
    if c.waiting.contains(turn) {
        return (false, Joined::Waiting);
    }
    if inbound_seq.is_some_and(|seq| seq <= c.inbound_seq) {
        // Its message was taken already and it is neither live nor waiting: it has left.
        return (false, Joined::Left);
    }
    if let Some(seq) = inbound_seq {
        c.inbound_seq = c.inbound_seq.max(seq);
    }
    if c.live.is_none() {
        c.live = Some(turn.clone());
        (true, Joined::Live(c.history.clone()))
    } else if c.waiting.len() >= queue_max {
        let waiting = c.waiting.len();
        (inbound_seq.is_some(), Joined::Full { waiting })
    } else {
        c.waiting.push(turn.clone());
        (true, Joined::Waiting)
    }
}

/// A new turn joins its chat only if the chat is idle (no live turn, nobody waiting) and its
/// message at `seq` was not taken before: then it is the live turn, and this is its history.
/// Otherwise nothing changes. The dispatcher's fast path (one write to the chat, the turn's
/// record created already admitted); anything else goes through [`join`] after the record exists.
pub fn join_if_idle(c: &mut ChatRecord, turn: &TurnId, seq: u64) -> Option<Vec<HistoryEntry>> {
    if c.live.is_some() || !c.waiting.is_empty() || seq <= c.inbound_seq {
        return None;
    }
    match join(c, turn, Some(seq)).1 {
        Joined::Live(history) => Some(history),
        Joined::Waiting | Joined::Left | Joined::Full { .. } => None,
    }
}

/// An operator clears the chat's errored flag: recorded with who and when (the newest
/// [`crate::sizes::CLEARED_KEPT`] kept). `false` (nothing changed) if the chat is not flagged.
pub fn clear_errored(c: &mut ChatRecord, by: crate::wire::OperatorAction) -> bool {
    if c.errored.take().is_none() {
        return false;
    }
    c.cleared.push(by);
    let excess = c.cleared.len().saturating_sub(crate::sizes::CLEARED_KEPT);
    c.cleared.drain(..excess);
    true
}

/// The inbound message at `seq` was taken without joining (refused, or its turn had already
/// ended): later messages may go. Returns whether the record changed.
pub fn inbound_taken(c: &mut ChatRecord, seq: u64) -> bool {
    if c.inbound_seq >= seq {
        return false;
    }
    c.inbound_seq = seq;
    true
}

/// Where the chat's inbound messages stand, for [`in_order`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// Messages up to this stream sequence were taken (0: none yet, a new chat).
    UpTo(u64),
    /// The record does not say (it predates `inbound_seq`, or cannot be read): the dispatcher's
    /// per-chat lane is the only order there is.
    Unknown,
}

impl Taken {
    /// What `record` says was taken (none: nothing yet).
    pub fn of(record: Option<&ChatRecord>) -> Taken {
        match record {
            None => Taken::UpTo(0),
            Some(c) if c.inbound_seq > 0 => Taken::UpTo(c.inbound_seq),
            Some(_) => Taken::Unknown,
        }
    }
}

/// Is the inbound message at `seq` its chat's next one to take? `next` is the stream sequence of
/// the chat's first message after the taken ones (none if there is none left). An earlier
/// message not yet taken (a dispatcher died holding it) goes first; a replay is in order.
pub fn in_order(taken: Taken, next: Option<u64>, seq: u64) -> bool {
    match taken {
        Taken::Unknown => true,
        Taken::UpTo(t) if seq <= t => true,
        Taken::UpTo(_) => next.is_none_or(|n| n >= seq),
    }
}

/// What releasing an ended turn did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Released {
    /// Whether the record changed (a release already done changes nothing).
    pub changed: bool,
    /// The chat's live turn afterwards and the history to admit it with. Admitting is idempotent,
    /// so the caller admits it whether or not this release changed anything.
    pub next: Option<(TurnId, Vec<HistoryEntry>)>,
}

/// Did the turn ever run? A turn killed before any attempt started said nothing.
pub fn ran(record: &TurnRecord) -> bool {
    record
        .attempts
        .iter()
        .any(|a| a.started_at.is_some() || a.exit.is_some())
}

/// Is `turn` the chat's live turn?
pub fn is_live(c: &ChatRecord, turn: &TurnId) -> bool {
    c.live.as_ref() == Some(turn)
}

/// An ended turn lets its chat go: if it was the live one, its message and the bot `replies` that
/// landed join the history (bounded by `budget`), and the next waiting turn becomes live; if it
/// was waiting (killed before its time), it leaves the queue.
pub fn release(
    c: &mut ChatRecord,
    record: &TurnRecord,
    replies: &[String],
    budget: Budget,
) -> Released {
    release_with(c, record, replies, 0, budget)
}

/// [`release`], when `skipped` older replies of the turn were left out before `replies` (the
/// newest that a history can hold): they count among the history's left-out entries.
pub fn release_with(
    c: &mut ChatRecord,
    record: &TurnRecord,
    replies: &[String],
    skipped: u64,
    budget: Budget,
) -> Released {
    let mut changed = false;
    if is_live(c, &record.turn) {
        if ran(record) {
            c.history_dropped += skipped;
            let said = std::iter::once(HistoryEntry {
                role: Role::User,
                text: record.message.text.clone(),
            })
            .chain(replies.iter().map(|text| HistoryEntry {
                role: Role::Bot,
                text: text.clone(),
            }));
            history::append(&mut c.history, &mut c.history_dropped, said, budget);
        }
        c.live = if c.waiting.is_empty() {
            None
        } else {
            Some(c.waiting.remove(0))
        };
        changed = true;
    } else if let Some(i) = c.waiting.iter().position(|t| t == &record.turn) {
        c.waiting.remove(i);
        changed = true;
    }
    let next = c.live.clone().map(|t| (t, c.history.clone()));
    Released { changed, next }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::{self, NewTurn};
    use crate::wire::InboundMessage;
    use crate::Timestamp;
    use std::time::Duration;

    const BUDGET: Budget = Budget {
        entries: 50,
        bytes: 1 << 20,
    };

    fn chat() -> ChatId {
        ChatId::new("c").expect("valid")
    }
    fn turn(n: u32) -> TurnId {
        TurnId::new(format!("t-{n}")).expect("valid")
    }
    fn record(n: u32, ran: bool) -> TurnRecord {
        let (mut r, _) = lifecycle::create(
            NewTurn {
                turn: turn(n),
                message: InboundMessage {
                    v: FORMAT_VERSION,
                    chat: chat(),
                    id: format!("m-{n}"),
                    text: format!("question {n}"),
                    sender: None,
                    attachments: Vec::new(),
                },
                history: Vec::new(),
                max_turn_retry: 3,
                retry_delay: Duration::from_secs(10),
                rerun_of: None,
                created_by: None,
                admit_now: true,
            },
            Timestamp::from_millis(0),
        );
        if ran {
            r.attempts[0].started_at = Some(Timestamp::from_millis(1));
        }
        r
    }

    #[test]
    fn the_first_turn_is_live_and_the_rest_wait_in_arrival_order() {
        let mut c = empty(&chat());
        assert_eq!(
            join(&mut c, &turn(1), Some(1)),
            (true, Joined::Live(vec![]))
        );
        assert_eq!(join(&mut c, &turn(2), Some(2)), (true, Joined::Waiting));
        assert_eq!(join(&mut c, &turn(3), Some(3)), (true, Joined::Waiting));
        assert_eq!(c.waiting, vec![turn(2), turn(3)]);
        assert_eq!(c.inbound_seq, 3);
        // Joining again changes nothing and says the same.
        assert_eq!(
            join(&mut c, &turn(1), Some(1)),
            (false, Joined::Live(vec![]))
        );
        assert_eq!(join(&mut c, &turn(2), Some(2)), (false, Joined::Waiting));
    }

    /// A chat's queue is bounded (its record must fit NATS): one more is refused, its message
    /// counted taken so the chat's next ones go, and a slot freed takes the next one again.
    #[test]
    fn a_full_queue_takes_the_message_but_not_the_turn() {
        let mut c = empty(&chat());
        join_bounded(&mut c, &turn(1), Some(1), 2);
        join_bounded(&mut c, &turn(2), Some(2), 2);
        join_bounded(&mut c, &turn(3), Some(3), 2);
        assert_eq!(
            join_bounded(&mut c, &turn(4), Some(4), 2),
            (true, Joined::Full { waiting: 2 })
        );
        assert_eq!(c.waiting, vec![turn(2), turn(3)]);
        assert_eq!(c.inbound_seq, 4, "taken: the chat's next message goes");
        // A replay of the refused one changes nothing more.
        assert_eq!(
            join_bounded(&mut c, &turn(4), Some(4), 2),
            (false, Joined::Left)
        );
        release(&mut c, &record(1, true), &[], BUDGET);
        assert_eq!(
            join_bounded(&mut c, &turn(5), Some(5), 2),
            (true, Joined::Waiting)
        );
    }

    #[test]
    fn only_an_idle_chat_is_joined_first() {
        let mut c = empty(&chat());
        assert_eq!(join_if_idle(&mut c, &turn(1), 1), Some(vec![]));
        assert_eq!(c.live, Some(turn(1)));
        // Busy: nothing changes, the turn joins the slow way once its record exists.
        let busy = c.clone();
        assert_eq!(join_if_idle(&mut c, &turn(2), 2), None);
        assert_eq!(c, busy);
        // Someone waiting: an idle live slot is not enough, arrival order comes first.
        join(&mut c, &turn(2), Some(2));
        c.live = None;
        let queued = c.clone();
        assert_eq!(join_if_idle(&mut c, &turn(3), 3), None);
        assert_eq!(c, queued);
        // A message taken before (a replay) never joins this way.
        let mut c = empty(&chat());
        c.inbound_seq = 5;
        assert_eq!(join_if_idle(&mut c, &turn(4), 5), None);
        assert_eq!(c.live, None);
        assert_eq!(join_if_idle(&mut c, &turn(4), 6), Some(vec![]));
        assert_eq!(c.inbound_seq, 6);
    }

    /// Found by the model checker (crates/model, `one_turn_with_two_faults`): the dispatcher
    /// dies after the join, the turn ends and is released, the message comes back. Joining
    /// again made the ended turn the chat's live one, and the chat never moved again.
    #[test]
    fn a_replayed_join_of_a_turn_that_has_left_does_not_make_it_live_again() {
        let mut c = empty(&chat());
        join(&mut c, &turn(1), Some(1));
        release(&mut c, &record(1, true), &["answer 1".into()], BUDGET);
        assert_eq!(join(&mut c, &turn(1), Some(1)), (false, Joined::Left));
        assert_eq!(c.live, None);
        assert!(c.waiting.is_empty());
        // A new message still joins.
        assert_eq!(
            join(&mut c, &turn(2), Some(2)).1,
            Joined::Live(c.history.clone())
        );
    }

    #[test]
    fn releasing_the_live_turn_records_what_was_said_and_lets_the_next_go() {
        let mut c = empty(&chat());
        join(&mut c, &turn(1), Some(1));
        join(&mut c, &turn(2), Some(2));
        let r = release(&mut c, &record(1, true), &["answer 1".into()], BUDGET);
        assert!(r.changed);
        let (next, history) = r.next.expect("turn 2 goes");
        assert_eq!(next, turn(2));
        let texts: Vec<_> = history.iter().map(|e| e.text.as_str()).collect();
        assert_eq!(texts, ["question 1", "answer 1"]);
        // A replay of the same release changes nothing, and still names turn 2 to admit.
        let again = release(&mut c, &record(1, true), &["answer 1".into()], BUDGET);
        assert!(!again.changed);
        assert_eq!(again.next.map(|(t, _)| t), Some(turn(2)));
        assert_eq!(c.history.len(), 2);
    }

    #[test]
    fn a_turn_that_never_ran_adds_nothing_to_the_history() {
        let mut c = empty(&chat());
        join(&mut c, &turn(1), Some(1));
        let r = release(&mut c, &record(1, false), &[], BUDGET);
        assert!(r.changed);
        assert_eq!(r.next, None);
        assert!(c.history.is_empty());
        assert_eq!(c.live, None);
    }

    #[test]
    fn a_waiting_turn_that_ended_leaves_the_queue_and_the_live_one_keeps_running() {
        let mut c = empty(&chat());
        join(&mut c, &turn(1), Some(1));
        join(&mut c, &turn(2), Some(2));
        join(&mut c, &turn(3), Some(3));
        let r = release(&mut c, &record(2, false), &[], BUDGET);
        assert!(r.changed);
        assert_eq!(r.next.map(|(t, _)| t), Some(turn(1)));
        assert_eq!(c.waiting, vec![turn(3)]);
    }

    #[test]
    fn a_message_waits_for_every_earlier_one_of_its_chat() {
        // Nothing taken yet; message 5 is the chat's first: in order.
        assert!(in_order(Taken::UpTo(0), Some(5), 5));
        // Message 7 while 5 (earlier, same chat) is not taken: wait.
        assert!(!in_order(Taken::UpTo(0), Some(5), 7));
        // 5 taken; the next after it is 7 itself.
        assert!(in_order(Taken::UpTo(5), Some(7), 7));
        // A replay of a message already taken.
        assert!(in_order(Taken::UpTo(7), Some(9), 5));
        // Nothing left after the taken ones (ours was removed meanwhile): nothing earlier waits.
        assert!(in_order(Taken::UpTo(5), None, 7));
        assert!(in_order(Taken::Unknown, Some(1), 7));
    }

    #[test]
    fn taking_a_refused_message_moves_the_mark_forward_only() {
        let mut c = empty(&chat());
        assert!(inbound_taken(&mut c, 4));
        assert!(!inbound_taken(&mut c, 3));
        assert_eq!(c.inbound_seq, 4);
        assert_eq!(Taken::of(Some(&c)), Taken::UpTo(4));
        assert_eq!(Taken::of(None), Taken::UpTo(0));
        assert_eq!(Taken::of(Some(&empty(&chat()))), Taken::Unknown);
    }
}
