//! The attempt fence on the wire: read the last marker on `turnpike.fence.<turn>.>` and move it
//! by compare-and-set on that filter's last sequence, as `turnpike_core::fence` decides. Each
//! writer appends under its own name (`.runner.<id>`, `.service`), and a marker is believed only
//! for what its writer may say. Every read goes to the stream leader (the chat-out stream has no
//! direct gets), which holds every acknowledged marker.

use crate::Bus;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use std::time::Duration;
use turnpike_core::backoff::Backoff;
use turnpike_core::fence::{self, FenceHolder, FenceMarker, FenceWriter, Last};
use turnpike_core::subjects;
use turnpike_core::wire::{Landed, OutboundItem, OutboundKind};
use turnpike_core::{ChatId, RunnerId, Timestamp, TurnId, FORMAT_VERSION};
use turnpike_jetstream::{decode, BusError, Publish};

/// Compare-and-set rounds before giving up: each lost round means another writer moved the
/// fence, and there are at most a handful of writers per turn.
const CAS_ROUNDS: usize = 20;

/// The waits after lost (or failed) rounds, doubling from 2 ms to at most 250 ms (about 3.5 s
/// over all the rounds). In a cluster, an append is also refused while another append to the
/// fence is still being proposed (10164); re-read at once, the fence looks the same, and a busy
/// cluster's proposal outlasted twenty rounds without a pause (fault case f8 on a slow machine:
/// an operator's kill refused as "still contended" while it raced a runner's take).
fn pauses() -> Backoff {
    Backoff::doubling(Duration::from_millis(2), Duration::from_millis(250))
}

/// Messages of a chat read at most when counting one attempt's output.
const MAX_SCAN: usize = 100_000;

async fn stream(bus: &Bus) -> Result<Stream<()>, BusError> {
    bus.js
        .get_stream_no_info(subjects::STREAM_CHAT_OUT)
        .await
        .map_err(|e| BusError::kv("open chat-out stream", e))
}

/// A marker as read: believed only if its subject names this turn and a writer that may say
/// what it says (a runner its own claim, or a loss; a service a loss or a kill). Anything else
/// still moved the fence (its sequence counts), but says nothing.
fn read_marker(turn: &TurnId, m: &async_nats::jetstream::message::StreamMessage) -> Last {
    let writer = subjects::parse_fence_marker(m.subject.as_str())
        .filter(|(t, _)| t == turn)
        .map(|(_, w)| w);
    let marker = decode::<FenceMarker>(Some(&m.headers), &m.payload)
        .ok()
        .filter(|marker| {
            marker.turn == *turn && writer.as_ref().is_some_and(|w| w.may_write(&marker.holder))
        });
    Last {
        seq: m.sequence,
        marker,
    }
}

/// The fence's last marker; `None` if the turn never had one.
pub async fn last(bus: &Bus, turn: &TurnId) -> Result<Option<Last>, BusError> {
    let subject = subjects::fence(turn);
    match stream(bus)
        .await?
        .get_last_raw_message_by_subject(&subject)
        .await
    {
        Ok(m) => Ok(Some(read_marker(turn, &m))),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(BusError::kv(format!("read fence {subject}"), e)),
    }
}

/// The marker stored at `seq`, if it is one of this turn's.
async fn at(bus: &Bus, turn: &TurnId, seq: u64) -> Result<Option<Last>, BusError> {
    match stream(bus).await?.get_raw_message(seq).await {
        Ok(m)
            if subjects::parse_fence_marker(m.subject.as_str())
                .is_some_and(|(t, _)| t == *turn) =>
        {
            Ok(Some(read_marker(turn, &m)))
        }
        Ok(_) => Ok(None),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(BusError::kv(format!("read fence marker {seq}"), e)),
    }
}

/// When the message at `seq` was stored, by the server's clock.
async fn stored_at(bus: &Bus, seq: u64) -> Result<Timestamp, BusError> {
    let m = stream(bus)
        .await?
        .get_raw_message(seq)
        .await
        .map_err(|e| BusError::kv(format!("read fence marker {seq}"), e))?;
    Ok(Timestamp::from_system_time(std::time::SystemTime::from(
        m.time,
    )))
}

/// Append `holder`'s marker if the fence's last sequence is still `expect`: `Ok(None)` if
/// another writer moved it first.
async fn append(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
    (writer, holder): (&FenceWriter, FenceHolder),
    expect: u64,
) -> Result<Option<u64>, BusError> {
    let subject = subjects::fence_marker(turn, writer);
    let marker = FenceMarker {
        v: FORMAT_VERSION,
        turn: turn.clone(),
        attempt,
        holder,
        replaces: expect,
    };
    let sent = Publish::new(bus.codec, subject.clone(), &marker)?
        .header(subjects::HDR_TURN, turn.as_str())
        .header(subjects::HDR_ATTEMPT, &attempt.to_string())
        .expect_last_on(&subjects::fence(turn), expect)
        .send(&bus.js)
        .await;
    match sent {
        Ok(ack) => Ok(Some(ack.sequence)),
        Err(BusError::Fenced { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn still_contended(turn: &TurnId) -> BusError {
    BusError::kv(
        format!("move fence of {turn}"),
        format!("still contended after {CAS_ROUNDS} rounds"),
    )
}

/// What a runner's attempt to take the fence came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// The fence is ours from this marker's sequence on.
    Ours(u64),
    /// The turn was killed before we took it.
    Killed,
    /// The attempt was declared lost, or a later one holds the fence.
    Lost,
}

/// Take the fence for `attempt` on behalf of `runner` (after claiming it).
pub async fn take(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
    runner: &RunnerId,
) -> Result<Taken, BusError> {
    let mut pauses = pauses();
    for round in 0..CAS_ROUNDS {
        // Attempt 1 usually finds the fence empty: append expecting nothing before it (what
        // reading an empty fence leads to), and read only if that fails.
        let last = if round == 0 && attempt == 1 {
            None
        } else {
            last(bus, turn).await?
        };
        match fence::take(last.as_ref(), attempt, runner) {
            fence::Take::Append { expect } => {
                let holder = FenceHolder::Runner {
                    runner: runner.clone(),
                };
                let writer = FenceWriter::Runner(runner.clone());
                // A publish whose ack is lost is found again as `AlreadyOurs` by the next round.
                match append(bus, turn, attempt, (&writer, holder), expect).await {
                    Ok(Some(seq)) => return Ok(Taken::Ours(seq)),
                    // Attempt 1's first try did not read: reading is all it takes.
                    Ok(None) if round == 0 && attempt == 1 => continue,
                    Ok(None) => tokio::time::sleep(pauses.wait()).await,
                    Err(e) => {
                        tracing::debug!(error = %e, "fence not taken yet; re-reading");
                        tokio::time::sleep(pauses.wait()).await;
                    }
                }
            }
            fence::Take::AlreadyOurs { seq } => return Ok(Taken::Ours(seq)),
            fence::Take::Killed => return Ok(Taken::Killed),
            fence::Take::Lost => return Ok(Taken::Lost),
        }
    }
    Err(still_contended(turn))
}

/// What declaring an attempt lost came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Losing {
    /// Nothing of the attempt can land from now on. `runner_seq`: its own marker, after which
    /// its output lies (none: it never took the fence, so nothing of it landed). `at`: when the
    /// marker that fenced it out was stored, by the server's clock: the one time a loss with no
    /// other trace is dated by.
    Fenced {
        /// The attempt's own marker's sequence, if it took the fence.
        runner_seq: Option<u64>,
        /// When the fencing marker was stored.
        at: Timestamp,
    },
    /// A later attempt holds the fence: the caller's record is stale; change nothing.
    Stale {
        /// The attempt that holds it.
        current: u32,
    },
}

/// Fence `attempt` out, unless a later attempt already holds the fence; `writer` is who does it
/// (the sweep, or the runner that ran the attempt).
pub async fn lose(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
    writer: &FenceWriter,
) -> Result<Losing, BusError> {
    let mut pauses = pauses();
    for _ in 0..CAS_ROUNDS {
        let last = last(bus, turn).await?;
        match fence::lose(last.as_ref(), attempt) {
            fence::Lose::Append { expect, runner_seq } => {
                let lost = (writer, FenceHolder::Lost);
                if let Some(seq) = append(bus, turn, attempt, lost, expect).await? {
                    let at = stored_at(bus, seq).await?;
                    return Ok(Losing::Fenced { runner_seq, at });
                }
                tokio::time::sleep(pauses.wait()).await;
            }
            fence::Lose::AlreadyFenced { replaces } => {
                let replaced = if replaces == 0 {
                    None
                } else {
                    at(bus, turn, replaces).await?
                };
                // Fenced out already: by the last marker, which `last` read.
                let fenced_at = match &last {
                    Some(l) => stored_at(bus, l.seq).await?,
                    None => turnpike_jetstream::now(),
                };
                return Ok(Losing::Fenced {
                    runner_seq: fence::runner_seq(replaced.as_ref(), attempt),
                    at: fenced_at,
                });
            }
            fence::Lose::Stale { current } => return Ok(Losing::Stale { current }),
        }
    }
    Err(still_contended(turn))
}

/// Fence the whole turn out for an operator kill (the current attempt is `attempt`).
pub async fn kill(bus: &Bus, turn: &TurnId, attempt: u32, by: &str) -> Result<(), BusError> {
    let mut pauses = pauses();
    for _ in 0..CAS_ROUNDS {
        let last = last(bus, turn).await?;
        match fence::kill(last.as_ref()) {
            fence::Kill::Append { expect } => {
                let holder = FenceHolder::Killed { by: by.to_owned() };
                let killed = (&FenceWriter::Service, holder);
                if append(bus, turn, attempt, killed, expect).await?.is_some() {
                    return Ok(());
                }
                tokio::time::sleep(pauses.wait()).await;
            }
            fence::Kill::AlreadyKilled => return Ok(()),
        }
    }
    Err(still_contended(turn))
}

/// What `attempt` of `turn` landed (how many bot messages, where), counted once the attempt is
/// fenced out (so the count is final). Its output lies after its own marker at `runner_seq`;
/// each read goes to the stream leader, and any failure is an error, never a short count. The
/// messages are counted, not kept: an agent that said a great deal costs reads, not memory.
/// More than [`MAX_SCAN`] messages of the chat to read is an error no retry changes.
pub async fn landed(
    bus: &Bus,
    chat: &ChatId,
    turn: &TurnId,
    attempt: u32,
    runner_seq: Option<u64>,
) -> Result<Landed, BusError> {
    let mut landed = Landed::default();
    let Some(from) = runner_seq else {
        return Ok(landed);
    };
    let complete = scan(bus, chat, turn, from, None, MAX_SCAN, false, |seq, item| {
        if item.attempt == attempt {
            landed.push(seq);
        }
    })
    .await?;
    if !complete {
        return Err(BusError::Unrecoverable {
            what: format!("counting what attempt {attempt} of {turn} landed"),
            why: format!(
                "more than {MAX_SCAN} messages on {} since the attempt began",
                subjects::chat_out(chat)
            ),
        });
    }
    Ok(landed)
}

/// The newest bot messages of a turn that a history can hold, read in stream order and kept
/// within its budget as they come (never all of them in memory), and how many older ones were
/// left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replies {
    /// The newest replies kept, oldest first.
    pub texts: std::collections::VecDeque<String>,
    /// How many older ones were left out.
    pub skipped: u64,
    /// Encoded bytes of `texts`, as a history counts them.
    bytes: usize,
}

impl Replies {
    /// Keep `text` as the newest, leaving out the oldest while over `budget`.
    pub fn push(&mut self, text: String, budget: turnpike_core::history::Budget) {
        let entry = |text: &str| {
            turnpike_core::history::ENTRY_OVERHEAD + turnpike_core::sizes::str_len(text)
        };
        let text = turnpike_core::sizes::cut(
            &text,
            budget
                .bytes
                .saturating_sub(turnpike_core::history::ENTRY_OVERHEAD),
        )
        .into_owned();
        self.bytes += entry(&text);
        self.texts.push_back(text);
        while self.texts.len() > budget.entries || self.bytes > budget.bytes {
            let Some(old) = self.texts.pop_front() else {
                break;
            };
            self.bytes -= entry(&old);
            self.skipped += 1;
        }
    }

    /// How many replies there were: kept and left out.
    pub fn len(&self) -> u64 {
        self.texts.len() as u64 + self.skipped
    }

    /// No replies at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The bot messages of `turn` stored after `from` on its chat's subject, up to `until` (or the
/// subject's end), that `keep` selects, gathered into [`Replies`] within `budget`. `true` with
/// them if the scan reached its end; a scan cut short by [`MAX_SCAN`] returns what it found.
pub async fn replies(
    bus: &Bus,
    chat: &ChatId,
    turn: &TurnId,
    from: u64,
    until: Option<u64>,
    budget: turnpike_core::history::Budget,
    keep: impl Fn(&OutboundItem) -> bool,
) -> Result<(Replies, bool), BusError> {
    let mut found = Replies::default();
    let complete = scan(bus, chat, turn, from, until, MAX_SCAN, false, |_, item| {
        if keep(&item) {
            found.push(item.text, budget);
        }
    })
    .await?;
    Ok((found, complete))
}

/// The sequence just before `turn`'s first fence marker (nothing of a turn can land before it),
/// to scan its messages from; `None` if no attempt ever took the fence.
pub async fn before_first_marker(bus: &Bus, turn: &TurnId) -> Result<Option<u64>, BusError> {
    first_marker(bus, turn).await
}

/// A turn's bot messages so far, as a view shows them.
#[derive(Debug, Clone, Default)]
pub struct TurnOutput {
    /// The bot messages, in the order they landed.
    pub messages: Vec<OutboundItem>,
    /// Every message of the turn was read (the scan was not cut short by its bound).
    pub complete: bool,
}

/// The bot messages `turn` has landed so far, for a view (the dashboard), while it runs or
/// after. It stops at the turn's final status (nothing of a turn lands after it: its attempts
/// are over or fenced out before it is sent), so an old turn of a busy chat costs its own
/// messages, not the chat's since; and it reads at most `max_reads` messages and keeps at most
/// 1 MiB of their text, saying so instead of failing.
pub async fn turn_output(
    bus: &Bus,
    chat: &ChatId,
    turn: &TurnId,
    max_reads: usize,
) -> Result<TurnOutput, BusError> {
    let Some(from) = first_marker(bus, turn).await? else {
        return Ok(TurnOutput {
            messages: Vec::new(),
            complete: true,
        });
    };
    let mut messages = Vec::new();
    let mut bytes = 0;
    let mut cut = false;
    let complete = scan(bus, chat, turn, from, None, max_reads, true, |_, item| {
        // Kept within a view's byte budget too: a turn may land a thousand long messages.
        bytes += item.text.len();
        if bytes > TURN_OUTPUT_BYTES {
            cut = true;
        } else {
            messages.push(item)
        }
    })
    .await?;
    Ok(TurnOutput {
        messages,
        complete: complete && !cut,
    })
}

/// Bytes of a turn's messages one view shows at most.
const TURN_OUTPUT_BYTES: usize = 1 << 20;

/// The sequence of the turn's first fence marker; `None` if no attempt ever took the fence.
async fn first_marker(bus: &Bus, turn: &TurnId) -> Result<Option<u64>, BusError> {
    let subject = subjects::fence(turn);
    let first = stream(bus)
        .await?
        .raw_message_builder()
        .sequence(1)
        .next_by_subject(subject.clone())
        .send()
        .await;
    match first {
        Ok(m) => Ok(Some(m.sequence)),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(BusError::kv(format!("read fence {subject}"), e)),
    }
}

/// Each bot message of `turn` on `chat`'s outbound subject after sequence `from` (and at most
/// `until`), with its sequence, to `visit`; at most `max_reads` reads, ending early at the
/// turn's final status if `to_final`. `true` if the scan reached its end.
#[allow(clippy::too_many_arguments)]
async fn scan(
    bus: &Bus,
    chat: &ChatId,
    turn: &TurnId,
    from: u64,
    until: Option<u64>,
    max_reads: usize,
    to_final: bool,
    mut visit: impl FnMut(u64, OutboundItem),
) -> Result<bool, BusError> {
    let stream = stream(bus).await?;
    let subject = subjects::chat_out(chat);
    let mut seq = from + 1;
    for _ in 0..max_reads {
        if until.is_some_and(|last| seq > last) {
            return Ok(true);
        }
        let next = stream
            .raw_message_builder()
            .sequence(seq)
            .next_by_subject(subject.clone())
            .send()
            .await;
        let m = match next {
            Ok(m) => m,
            Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(true),
            Err(e) => return Err(BusError::kv(format!("read the messages of {turn}"), e)),
        };
        if until.is_some_and(|last| m.sequence > last) {
            return Ok(true);
        }
        if let Ok(item) = decode::<OutboundItem>(Some(&m.headers), &m.payload) {
            if &item.turn == turn {
                if item.kind == OutboundKind::Message {
                    visit(m.sequence, item);
                } else if to_final && item.r#final {
                    return Ok(true);
                }
            }
        }
        seq = m.sequence + 1;
    }
    Ok(false)
}

#[cfg(test)]
mod tests;
