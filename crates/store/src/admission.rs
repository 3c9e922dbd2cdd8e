//! A new turn entering its chat: the live index, the record, its place in the chat's order and,
//! if it is the chat's live turn, its admission (attempt 1 dispatched); or, when its record can
//! never be created, leaving the chat so the next turn goes.

use crate::Bus;
use turnpike_core::chat::Joined;
use turnpike_core::lifecycle;
use turnpike_core::TurnRecord;

use crate::live;
use crate::outbox::{abandon, admit, run_outbox};
use crate::turns::{create, ApplyError, Versioned};

/// Create a turn in its chat: the live index, the record (waiting), then its place in the chat's
/// order; if it is the chat's live turn it is admitted at once (attempt 1 dispatched). Every step
/// is idempotent, so a replayed inbound message (or a crash half-way) only completes what is
/// missing. Returns the record and whether this call created it.
///
/// `known_chat`: the chat record as the caller last read it, if it did (the join then writes
/// without reading it again).
pub async fn create_in_chat(
    bus: &Bus,
    record: TurnRecord,
    inbound_seq: Option<u64>,
    known_chat: Option<crate::chats::Snapshot>,
) -> Result<(Versioned, bool), ApplyError> {
    let turn = record.turn.clone();
    let chat = record.chat.clone();
    // Into the live index first: a turn is never live without being findable by the sweep. A
    // create, not a put: whether the turn was listed already tells a replay below whether its
    // end's effects may still be owed.
    let listed_here = live::enlist(bus, &turn, &chat).await?;
    // An idle chat's new message: joined first, so the record is created admitted (one write
    // where creating it waiting and admitting it took two). A dispatcher that dies after the
    // join leaves the chat's live turn without a record: the replay of its message, not acked,
    // finds the chat busy and takes the path below, which creates and admits it.
    let fast = match (inbound_seq, &known_chat) {
        (Some(seq), Some(snapshot)) => {
            crate::chats::join_if_idle(bus, &chat, &turn, seq, snapshot).await?
        }
        _ => None,
    };
    let joined_first = fast.is_some();
    let known_chat = if joined_first { None } else { known_chat };
    let (current, created) = match fast {
        Some(history) => create(bus, lifecycle::admitted_at_creation(&record, history)).await?,
        None => create(bus, record).await?,
    };
    if created && joined_first {
        return Ok((run_outbox(bus, current).await?, true));
    }
    if current.record.state.is_terminal() {
        // A replay of a message whose turn already ended: nothing more to do, but to make sure
        // it does not hold its chat, and to count its message taken (it may never have joined:
        // killed first), so the chat's next ones go. Found by the model checker: killed before
        // its join, joined, the dispatcher died before admitting it, and the replay left the
        // ended turn the chat's live one for good. `admit` of an ended turn releases it.
        admit(bus, &turn, Vec::new(), None).await?;
        if let Some(seq) = inbound_seq {
            crate::chats::inbound_taken(bus, &chat, seq).await?;
        }
        // Its end's effects: if it was still listed, they may be owed, and whoever unlists it
        // carries them out (the sweep, if its coordinator died). If it was not, they were
        // carried out: unlist it again, or the sweep would carry them out a second time.
        if listed_here {
            live::unlist(bus, &turn).await?;
        }
        return Ok((current, created));
    }
    match crate::chats::join(bus, &chat, &turn, inbound_seq, known_chat).await? {
        // Admitted at the revision just written: no read before the write.
        Joined::Live(history) => admit(bus, &turn, history, Some(current.clone())).await?,
        Joined::Waiting | Joined::Left => {}
        // The chat's queue filled up since the dispatcher looked: the turn cannot wait in it.
        Joined::Full { waiting } => {
            let reason = turnpike_core::wire::Refusal::QueueFull {
                waiting,
                max: bus.chat_queue,
            };
            let ended = abandon(bus, &turn, &reason.to_string()).await?;
            return Ok((ended, created));
        }
    }
    Ok((current, created))
}

/// A turn whose record can never be created (NATS refuses it for good): it leaves its chat
/// (which an idle chat's message joins before its record is created) and the live index, and
/// the chat's next turn goes. `record` is the record that could not be created.
pub async fn withdraw(bus: &Bus, record: &TurnRecord) -> Result<(), ApplyError> {
    if let Some((next, history)) = crate::chats::release(bus, record).await? {
        if next != record.turn {
            admit(bus, &next, history, None).await?;
        }
    }
    live::unlist(bus, &record.turn).await?;
    Ok(())
}
