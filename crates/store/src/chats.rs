//! The chat record (`turnpike_chats`): per-chat order (one live turn, the rest waiting in arrival
//! order), the conversation history new turns are given, and the errored flag. Every change is a
//! compare-and-set, so dispatchers and coordinators may race safely.

use crate::fence::Replies;
use crate::Bus;
use async_nats::jetstream::kv::{CreateErrorKind, UpdateErrorKind};
use bytes::Bytes;
use turnpike_core::chat;
use turnpike_core::subjects;
use turnpike_core::wire::{ChatRecord, HistoryEntry};
use turnpike_core::{ChatId, TurnId, TurnRecord};
use turnpike_jetstream::{decode_kv, now, BusError};

const CAS_ATTEMPTS: usize = 100;

/// The chat record as one read found it (at a revision, or missing), kept so that the next
/// compare-and-set can go without reading it again: a stale one only fails that write, which
/// then reads afresh.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// `None`: no record (or only a delete marker) at `revision`.
    record: Option<Result<ChatRecord, String>>,
    /// `None`: the key was never written.
    revision: Option<u64>,
}

impl Snapshot {
    /// The record, `None` if the chat has none yet, `Err` if it cannot be decoded.
    pub fn record(&self) -> Option<Result<&ChatRecord, &str>> {
        self.record
            .as_ref()
            .map(|r| r.as_ref().map_err(String::as_str))
    }
}

fn unreadable(chat: &ChatId, err: &str) -> BusError {
    BusError::kv(
        format!("read chat {chat}"),
        format!("the chat record cannot be read ({err}); its turns wait until it is repaired"),
    )
}

/// Read the chat record (one round trip to the bucket's leader).
pub async fn read(bus: &Bus, chat: &ChatId) -> Result<Snapshot, BusError> {
    let key = chat.as_str();
    let entry = bus
        .chats
        .entry(key)
        .await
        .map_err(|e| BusError::kv(format!("read chat {key}"), e))?;
    Ok(match entry {
        Some(e) if !e.value.is_empty() => Snapshot {
            record: Some(decode_kv::<ChatRecord>(&e.value).map_err(|err| err.to_string())),
            revision: Some(e.revision),
        },
        Some(e) => Snapshot {
            record: None,
            revision: Some(e.revision),
        },
        None => Snapshot {
            record: None,
            revision: None,
        },
    })
}

/// Read-modify-write the chat record with compare-and-set (creating it if missing). `change`
/// returns `(write?, result)`; it may run more than once, on a fresh copy each time.
pub async fn update<R>(
    bus: &Bus,
    chat: &ChatId,
    change: impl FnMut(&mut ChatRecord) -> (bool, R),
) -> Result<R, BusError> {
    update_from(bus, chat, None, change).await
}

/// [`update`] starting from `known`, a read made earlier: no read before the first write, and a
/// read after each conflict. A decision not to write (and the result it returns) is only ever
/// made on a record read here, never on `known`, which may be stale.
pub async fn update_from<R>(
    bus: &Bus,
    chat: &ChatId,
    mut known: Option<Snapshot>,
    mut change: impl FnMut(&mut ChatRecord) -> (bool, R),
) -> Result<R, BusError> {
    let key = chat.as_str();
    for _ in 0..CAS_ATTEMPTS {
        let (snapshot, from_known) = match known.take() {
            Some(s) => (s, true),
            None => (read(bus, chat).await?, false),
        };
        let mut record = match snapshot.record {
            Some(Ok(c)) => c,
            // Never started afresh: that would drop its queue and wedge its waiting turns.
            // An operator repairs it; until then the chat's turns wait (and say why).
            Some(Err(err)) => return Err(unreadable(chat, &err)),
            None => chat::empty(chat),
        };
        let (write, result) = change(&mut record);
        if !write {
            if from_known {
                continue;
            }
            return Ok(result);
        }
        if write_at(bus, chat, &record, snapshot.revision).await? {
            return Ok(result);
        }
    }
    Err(BusError::kv(
        format!("write chat {key}"),
        "still conflicting",
    ))
}

/// Write `record` if the chat is still at `revision` (`None`: never written). `Ok(false)`: it
/// changed meanwhile, nothing written.
async fn write_at(
    bus: &Bus,
    chat: &ChatId,
    record: &ChatRecord,
    revision: Option<u64>,
) -> Result<bool, BusError> {
    let key = chat.as_str();
    let written = write_value(bus, chat, record, revision).await;
    let written = match written {
        // By construction a chat record fits; if the servers still refuse it for good (a
        // bucket whose limit an operator lowered), it is kept without its history rather than
        // leave the chat's order unwritable forever.
        Err((false, e, true)) => {
            tracing::error!(chat_id = %chat, error = %e, "the chat record was refused for good; storing it without its history");
            let mut small = record.clone();
            small.history_dropped += small.history.len() as u64;
            small.history.clear();
            write_value(bus, chat, &small, revision).await
        }
        other => other,
    };
    match written {
        Ok(_) => Ok(true),
        Err((true, _, _)) => Ok(false),
        Err((false, why, true)) => Err(BusError::Unrecoverable {
            what: format!("write chat {key}"),
            why,
        }),
        Err((false, e, false)) => Err(BusError::kv(format!("write chat {key}"), e)),
    }
}

/// One write of the chat record: `Err((conflict, error, permanent))` when it failed.
async fn write_value(
    bus: &Bus,
    chat: &ChatId,
    record: &ChatRecord,
    revision: Option<u64>,
) -> Result<u64, (bool, String, bool)> {
    let key = chat.as_str();
    let value = Bytes::from(
        bus.codec
            .encode(record)
            .map_err(|e| (false, e.to_string(), true))?,
    );
    let permanent = |e: &(dyn std::error::Error + 'static)| {
        turnpike_jetstream::persistence(e) == turnpike_jetstream::Persistence::Permanent
    };
    // A chat nothing waits on is kept `retention_chat` after this write; one with a live or a
    // waiting turn has no TTL (the bucket has no age limit), so it never expires under them.
    if record.live.is_none() && record.waiting.is_empty() {
        return turnpike_jetstream::kv_put(
            &bus.js,
            subjects::BUCKET_CHATS,
            key,
            value,
            Some(revision.unwrap_or(0)),
            Some(bus.keep.idle_chats),
        )
        .await
        .map_err(|e| match e {
            BusError::Fenced { .. } => (true, e.to_string(), false),
            e => (false, e.to_string(), !e.is_transient()),
        });
    }
    match revision {
        Some(rev) => bus.chats.update(key, value, rev).await.map_err(|e| {
            (
                e.kind() == UpdateErrorKind::WrongLastRevision || turnpike_jetstream::lost_cas(&e),
                e.to_string(),
                permanent(&e),
            )
        }),
        None => bus.chats.create(key, value).await.map_err(|e| {
            (
                e.kind() == CreateErrorKind::AlreadyExists || turnpike_jetstream::lost_cas(&e),
                e.to_string(),
                permanent(&e),
            )
        }),
    }
}

/// A new turn joins its chat: it becomes the live turn if there is none ([`chat::Joined::Live`],
/// with the history to give it), else it waits its turn, unless the chat's queue is full
/// ([`chat::Joined::Full`]: the caller ends the turn). Idempotent for a turn already there.
pub async fn join(
    bus: &Bus,
    chat: &ChatId,
    turn: &TurnId,
    inbound_seq: Option<u64>,
    known: Option<Snapshot>,
) -> Result<chat::Joined, BusError> {
    let queue_max = bus.chat_queue;
    update_from(bus, chat, known, |c| {
        chat::join_bounded(c, turn, inbound_seq, queue_max)
    })
    .await
}

/// The first message of an idle chat: if `known` (the order check's read) shows no live turn
/// and the message at `seq` not taken yet, make `turn` the live turn with one compare-and-set at
/// that read's revision, before its record exists, so that the record is created admitted.
/// `Some(history)` if it did. `None` (nothing written) if the chat was busy or changed since:
/// the caller then creates the turn waiting and joins as usual. A turn never waits in the chat
/// without its record, so whoever releases the chat always finds the record it admits.
pub async fn join_if_idle(
    bus: &Bus,
    chat: &ChatId,
    turn: &TurnId,
    seq: u64,
    known: &Snapshot,
) -> Result<Option<Vec<HistoryEntry>>, BusError> {
    let mut record = match known.record() {
        None => chat::empty(chat),
        Some(Ok(c)) => c.clone(),
        Some(Err(_)) => return Ok(None),
    };
    let Some(history) = chat::join_if_idle(&mut record, turn, seq) else {
        return Ok(None);
    };
    Ok(write_at(bus, chat, &record, known.revision)
        .await?
        .then_some(history))
}

/// Is the inbound message at stream sequence `seq` the chat's next one to take? `false` while an
/// earlier message of the chat is still not taken (a dispatcher died holding it, or it waits for
/// a redelivery): the caller leaves this one for later, so a chat's turns keep arrival order.
/// A message already taken (a replay) is in order.
///
/// Returns the chat record as read, for the join that follows to write without reading again.
pub async fn inbound_in_order(
    bus: &Bus,
    chat: &ChatId,
    seq: u64,
) -> Result<(bool, Snapshot), BusError> {
    let snapshot = read(bus, chat).await?;
    let in_order = next_in_order(bus, chat, seq, &snapshot).await?;
    Ok((in_order, snapshot))
}

async fn next_in_order(
    bus: &Bus,
    chat: &ChatId,
    seq: u64,
    snapshot: &Snapshot,
) -> Result<bool, BusError> {
    let taken = match snapshot.record() {
        None => chat::Taken::UpTo(0),
        Some(Ok(c)) => chat::Taken::of(Some(c)),
        // Unreadable: its updates will say so; the lane's order is all there is meanwhile.
        Some(Err(_)) => chat::Taken::Unknown,
    };
    let chat::Taken::UpTo(after) = taken else {
        return Ok(true);
    };
    if seq <= after {
        // A replay of a message already taken: no read needed.
        return Ok(true);
    }
    let stream = bus
        .js
        .get_stream_no_info(subjects::STREAM_CHAT_IN)
        .await
        .map_err(|e| BusError::kv("open chat-in stream", e))?;
    let next = stream
        .raw_message_builder()
        .sequence(after + 1)
        .next_by_subject(subjects::chat_in(chat))
        .send()
        .await;
    let next = match next {
        Ok(m) => Some(m.sequence),
        // Nothing between: ours was removed meanwhile (retention); nothing earlier waits.
        Err(e)
            if e.kind()
                == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
        {
            None
        }
        Err(e) => return Err(BusError::kv(format!("check the order of chat {chat}"), e)),
    };
    Ok(chat::in_order(taken, next, seq))
}

/// The inbound message at `seq` was taken without a turn (refused): later ones may go.
pub async fn inbound_taken(bus: &Bus, chat: &ChatId, seq: u64) -> Result<(), BusError> {
    update(bus, chat, |c| (chat::inbound_taken(c, seq), ())).await
}

/// A turn ended: if it was the live one, its message and bot replies join the history and the
/// next waiting turn becomes live; if it was waiting (killed), it leaves the queue. Returns the
/// chat's live turn afterwards (with the history to give it), which the caller admits —
/// idempotent, so this is safe to carry out again after a crash. The history kept is
/// `history_limit` entries of at most `history_max_bytes`.
pub async fn release(
    bus: &Bus,
    record: &TurnRecord,
) -> Result<Option<(TurnId, Vec<HistoryEntry>)>, BusError> {
    let budget = bus.history;
    // Read outside the CAS loop: the replies are settled once the turn has ended. A failed read
    // is an error (retried), never "not live": that would drop the turn's replies from history.
    // The same read is the first compare-and-set's base.
    let snapshot = read(bus, &record.chat).await?;
    let was_live = match snapshot.record() {
        Some(Ok(c)) => chat::is_live(c, &record.turn),
        Some(Err(e)) => return Err(unreadable(&record.chat, e)),
        // No record: no live turn.
        None => false,
    };
    let replies = if was_live && chat::ran(record) {
        bot_messages(bus, record, budget).await?
    } else {
        Replies::default()
    };
    let texts: Vec<String> = replies.texts.iter().cloned().collect();
    let released = update_from(bus, &record.chat, Some(snapshot), |c| {
        let r = chat::release_with(c, record, &texts, replies.skipped, budget);
        (r.changed, r.next)
    })
    .await?;
    Ok(released)
}

/// The bot messages a turn landed that its chat's history can hold (the newest, within
/// `budget`; how many older ones were left out), read back from the chat's outbound stream
/// (they are the truth; the runner's claims are not). Where the record says an attempt's
/// messages are stored, that range is read and checked against its count; otherwise (a lost
/// event) the chat's subject is scanned from the turn's first fence marker. A scan cut short by
/// its bound keeps what it read: a chat's history a little short beats a chat that never moves.
async fn bot_messages(
    bus: &Bus,
    record: &TurnRecord,
    budget: turnpike_core::history::Budget,
) -> Result<Replies, BusError> {
    if let Some(found) = by_span(bus, record, budget).await? {
        return Ok(found);
    }
    let Some(from) = crate::fence::before_first_marker(bus, &record.turn).await? else {
        return Ok(Replies::default());
    };
    let (found, complete) =
        crate::fence::replies(bus, &record.chat, &record.turn, from, None, budget, |_| {
            true
        })
        .await?;
    if !complete {
        tracing::warn!(turn_id = %record.turn, "too many messages to read them all into history; keeping the newest read");
    }
    Ok(found)
}

/// A turn's replies read from the ranges its record holds; `None` if a range is unknown or does
/// not hold the count it should.
async fn by_span(
    bus: &Bus,
    record: &TurnRecord,
    budget: turnpike_core::history::Budget,
) -> Result<Option<Replies>, BusError> {
    let mut all = Replies::default();
    for a in record.attempts.iter().filter(|a| a.messages_landed > 0) {
        let Some(span) = a.reply_span else {
            return Ok(None);
        };
        let (found, complete) = crate::fence::replies(
            bus,
            &record.chat,
            &record.turn,
            span.first.saturating_sub(1),
            Some(span.last),
            budget,
            |item| item.attempt == a.n,
        )
        .await?;
        if !complete || found.len() != u64::from(a.messages_landed) {
            return Ok(None);
        }
        all.skipped += found.skipped;
        for text in found.texts {
            all.push(text, budget);
        }
    }
    Ok(Some(all))
}

/// Flag the chat errored for operators (once per turn).
pub async fn flag_errored(
    bus: &Bus,
    record: &TurnRecord,
    reason: &str,
    cause: Option<turnpike_core::wire::ChatErrorCause>,
) -> Result<(), BusError> {
    update(bus, &record.chat, |c| {
        if c.errored.as_ref().is_some_and(|e| e.turn == record.turn) {
            return (false, ());
        }
        c.errored = Some(turnpike_core::wire::ChatError {
            turn: record.turn.clone(),
            at: now(),
            reason: reason.to_owned(),
            cause,
        });
        (true, ())
    })
    .await
}
