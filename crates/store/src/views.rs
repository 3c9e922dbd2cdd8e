//! The read model: what operators are shown (`turnpike status` and the other listing commands,
//! the dashboard's pages and gauges, the coordinators' `turnpike.ops.stats`), read here once for
//! all of them. Every read is bounded: a bucket is read in one ordered pass, turn records in
//! parallel batches, a chat's recent turns from the tail of its inbound subject.

use async_nats::jetstream::kv;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::wire::{
    ChatErrorCause, ChatRecord, ErroredChat, ErroredPage, ErroredQuery, InboundMessage, LivePage,
    LiveQuery, LiveTurn, RunnerPresence, Versioned,
};
use turnpike_core::{subjects, ChatId, Timestamp, TurnId, TurnRecord};
use turnpike_jetstream::{decode, decode_kv, BusError};

use crate::turns::{self, ApplyError};
use crate::Bus;

/// Turn records read at once.
const PARALLEL_GETS: usize = 32;

/// How long one pass over a bucket may take before the view gives up.
const PASS_LIMIT: Duration = Duration::from_secs(10);

/// The cluster at a glance: what `turnpike status`, the dashboard's overview and its gauges
/// show.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cluster {
    /// Attempts waiting for a runner (the runners' consumer's pending count).
    pub queue_depth: u64,
    /// Live turns by state, in the order of [`TurnState`]'s names; only states with turns.
    pub live: Vec<(TurnState, u64)>,
    /// Runners present.
    pub runners: usize,
    /// Their slots, in all.
    pub slots: u32,
    /// Their slots in use.
    pub slots_in_use: u32,
    /// Chats flagged errored.
    pub errored_chats: usize,
    /// Of them, those whose turn gave up within the last hour.
    pub gave_up_last_hour: usize,
}

impl Cluster {
    /// Live turns in `state`.
    pub fn live_in(&self, state: TurnState) -> u64 {
        self.live
            .iter()
            .find(|(s, _)| *s == state)
            .map_or(0, |(_, n)| *n)
    }
}

/// The whole [`Cluster`] view: asked of the coordinators, which keep it from watches and answer
/// in a millisecond at any number of turns; read from the buckets when none answers (none is
/// running, or only ones older than `turnpike.ops.status`).
pub async fn cluster(bus: &Bus, now: Timestamp) -> Result<Cluster, BusError> {
    match ask_cluster(bus).await {
        Some(cluster) => Ok(cluster),
        None => read_cluster(bus, now).await,
    }
}

/// How long a coordinator is given to answer `turnpike.ops.status`.
const ASK_LIMIT: Duration = Duration::from_secs(2);

async fn ask_cluster(bus: &Bus) -> Option<Cluster> {
    ask(bus, subjects::OPS_STATUS, bytes::Bytes::new()).await
}

/// Ask the coordinators' read model; `None` if none answers in time, or the answer is not one
/// (an older coordinator, a model not built yet): the caller reads the buckets instead.
async fn ask<A: serde::de::DeserializeOwned>(
    bus: &Bus,
    subject: &'static str,
    body: bytes::Bytes,
) -> Option<A> {
    let asked = bus.client.request(subject, body);
    let answer = tokio::time::timeout(ASK_LIMIT, asked).await.ok()?.ok()?;
    serde_json::from_slice(&answer.payload).ok()
}

/// A page of the live turns, newest first: asked of the coordinators' read model; read from
/// the buckets (every live record) when none answers.
pub async fn live_page(bus: &Bus, query: &LiveQuery) -> Result<LivePage, BusError> {
    let body = serde_json::to_vec(query).map_err(|e| BusError::kv("encode a live query", e))?;
    if let Some(page) = ask(bus, subjects::OPS_LIVE, body.into()).await {
        return Ok(page);
    }
    let live: Vec<LiveTurn> = live_turns(bus)
        .await?
        .iter()
        .filter(|r| !r.state.is_terminal())
        .map(LiveTurn::of)
        .collect();
    Ok(LivePage::of(live.iter(), query))
}

/// A page of the chats flagged errored, most recently flagged first: asked of the coordinators'
/// read model; read from the buckets (every chat record) when none answers.
pub async fn errored_page(bus: &Bus, query: &ErroredQuery) -> Result<ErroredPage, BusError> {
    let body = serde_json::to_vec(query).map_err(|e| BusError::kv("encode an errored query", e))?;
    if let Some(page) = ask(bus, subjects::OPS_ERRORED, body.into()).await {
        return Ok(page);
    }
    let flagged: Vec<ErroredChat> = chats(bus)
        .await?
        .iter()
        .filter_map(ErroredChat::of)
        .collect();
    Ok(ErroredPage::of(flagged.iter(), query))
}

/// A page of one chat's live turns (its live one and those waiting behind it): its record and
/// theirs, read now (no coordinator holds a list per chat).
pub async fn chat_live_page(
    bus: &Bus,
    chat: &ChatId,
    query: &LiveQuery,
) -> Result<LivePage, BusError> {
    let ids: Vec<TurnId> = match self::chat(bus, chat).await? {
        Some(rec) => rec.live.into_iter().chain(rec.waiting).collect(),
        None => Vec::new(),
    };
    let turns: Vec<LiveTurn> = records(bus, &ids)
        .await?
        .iter()
        .filter(|r| !r.state.is_terminal())
        .map(LiveTurn::of)
        .collect();
    Ok(LivePage::of(turns.iter(), query))
}

/// One chat's errored flag as a page (of none or one): its record, read now.
pub async fn chat_errored_page(
    bus: &Bus,
    chat: &ChatId,
    query: &ErroredQuery,
) -> Result<ErroredPage, BusError> {
    let flagged = self::chat(bus, chat)
        .await?
        .as_ref()
        .and_then(ErroredChat::of);
    Ok(ErroredPage::of(flagged.iter(), query))
}

/// Read the whole [`Cluster`] view from the buckets now: every live record and every chat
/// record kept (what a coordinator does only until its own read model is built).
pub async fn read_cluster(bus: &Bus, now: Timestamp) -> Result<Cluster, BusError> {
    let live = count_by_state(&live_turns(bus).await?);
    let chats = chats(bus).await?;
    let errored = chats
        .iter()
        .filter_map(|c| c.errored.as_ref())
        .map(|e| (e.at, e.cause));
    assemble(bus, now, live, errored).await
}

/// The [`Cluster`] view from what a read model keeps (the live turns by state, and when and why
/// each errored chat was flagged), with the runners and the queue read now (one request each).
pub async fn assemble(
    bus: &Bus,
    now: Timestamp,
    live: Vec<(TurnState, u64)>,
    errored: impl Iterator<Item = (Timestamp, Option<ChatErrorCause>)> + Clone,
) -> Result<Cluster, BusError> {
    let runners = runners(bus).await?;
    let hour_ago = now.millis().saturating_sub(3_600_000);
    Ok(Cluster {
        queue_depth: queue_depth(bus).await?,
        live,
        runners: runners.len(),
        slots: runners.iter().map(|r| r.slots).sum(),
        slots_in_use: runners.iter().map(|r| r.slots_in_use).sum(),
        errored_chats: errored.clone().count(),
        gave_up_last_hour: errored
            .filter(|(at, cause)| at.millis() >= hour_ago && *cause == Some(ChatErrorCause::GaveUp))
            .count(),
    })
}

/// How many of `records` are in each state, in the order of the states' names.
pub fn count_by_state(records: &[TurnRecord]) -> Vec<(TurnState, u64)> {
    let mut by_state: BTreeMap<&'static str, (TurnState, u64)> = BTreeMap::new();
    for r in records {
        by_state.entry(r.state.as_str()).or_insert((r.state, 0)).1 += 1;
    }
    by_state.into_values().collect()
}

/// Every current (key, value) of a bucket, in one ordered pass (last value per key, markers of
/// deleted keys left out), sorted by key.
async fn snapshot(kv: &kv::Store, bucket: &str) -> Result<Vec<(String, bytes::Bytes)>, BusError> {
    let err = |e: &dyn std::fmt::Display| {
        BusError::kv(format!("read the {bucket} bucket"), e.to_string())
    };
    // An empty bucket's watch would wait for a first entry: ask the stream first (the store's
    // own `status()` is the info cached when it was opened).
    let info = kv.stream.get_info().await.map_err(|e| err(&e))?;
    if info.state.messages == 0 {
        return Ok(Vec::new());
    }
    let mut watch = kv.watch_with_history(">").await.map_err(|e| err(&e))?;
    let mut out = BTreeMap::new();
    let read = async {
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|e| err(&e))?;
            if entry.operation == kv::Operation::Put {
                out.insert(entry.key, entry.value);
            } else {
                out.remove(&entry.key);
            }
            if entry.delta == 0 {
                break;
            }
        }
        Ok::<_, BusError>(())
    };
    tokio::time::timeout(PASS_LIMIT, read)
        .await
        .map_err(|_| err(&format!("reading it took over {PASS_LIMIT:?}")))??;
    Ok(out.into_iter().collect())
}

/// Values of a bucket decoded as `T`; values that do not decode are left out (and logged).
async fn decoded<T: serde::de::DeserializeOwned + Versioned>(
    kv: &kv::Store,
    bucket: &str,
) -> Result<Vec<T>, BusError> {
    Ok(snapshot(kv, bucket)
        .await?
        .into_iter()
        .filter_map(|(k, v)| match decode_kv::<T>(&v) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(bucket, key = %k, error = %e, "undecodable value left out of a view");
                None
            }
        })
        .collect())
}

/// One turn's record, `None` if there is none.
pub async fn turn(bus: &Bus, id: &TurnId) -> Result<Option<TurnRecord>, ApplyError> {
    Ok(turns::load(bus, id).await?.map(|v| v.record))
}

/// Records of `ids`, in the order given; missing ones, and ones that cannot be read (logged),
/// left out.
pub async fn records(bus: &Bus, ids: &[TurnId]) -> Result<Vec<TurnRecord>, BusError> {
    let mut got = futures::stream::iter(ids.to_vec())
        .map(|id| async move { (turn(bus, &id).await, id) })
        .buffered(PARALLEL_GETS);
    let mut out = Vec::with_capacity(ids.len());
    while let Some((read, id)) = got.next().await {
        match read {
            Ok(Some(r)) => out.push(r),
            Ok(None) => {}
            Err(ApplyError::Bus(e)) => return Err(e),
            Err(e) => {
                tracing::warn!(turn_id = %id, error = %e, "unreadable turn left out of a view")
            }
        }
    }
    Ok(out)
}

/// Ids of turns not yet ended (the live index), sorted.
pub async fn live_ids(bus: &Bus) -> Result<Vec<TurnId>, BusError> {
    Ok(snapshot(&bus.live, subjects::BUCKET_LIVE)
        .await?
        .into_iter()
        .filter_map(|(k, _)| TurnId::new(k).ok())
        .collect())
}

/// Ids of every turn whose record is still kept (ended ones included), sorted.
pub async fn all_ids(bus: &Bus) -> Result<Vec<TurnId>, BusError> {
    let mut out: Vec<TurnId> = crate::bus::keys(&bus.turns, "turns")
        .await?
        .into_iter()
        .filter_map(|k| TurnId::new(k).ok())
        .collect();
    out.sort();
    Ok(out)
}

/// The records of every live turn.
pub async fn live_turns(bus: &Bus) -> Result<Vec<TurnRecord>, BusError> {
    records(bus, &live_ids(bus).await?).await
}

/// Every chat record kept.
pub async fn chats(bus: &Bus) -> Result<Vec<ChatRecord>, BusError> {
    decoded(&bus.chats, subjects::BUCKET_CHATS).await
}

/// Chats flagged errored.
pub async fn errored_chats(bus: &Bus) -> Result<Vec<ChatRecord>, BusError> {
    let mut chats = chats(bus).await?;
    chats.retain(|c| c.errored.is_some());
    Ok(chats)
}

/// One chat's record.
pub async fn chat(bus: &Bus, id: &ChatId) -> Result<Option<ChatRecord>, BusError> {
    match crate::chats::read(bus, id).await?.record() {
        None => Ok(None),
        Some(Ok(c)) => Ok(Some(c.clone())),
        Some(Err(e)) => Err(BusError::kv(format!("read chat {id}"), e.to_owned())),
    }
}

/// Every runner present.
pub async fn runners(bus: &Bus) -> Result<Vec<RunnerPresence>, BusError> {
    decoded(&bus.runners, subjects::BUCKET_RUNNERS).await
}

/// Attempts waiting for a runner (the runners' consumer's pending count).
pub async fn queue_depth(bus: &Bus) -> Result<u64, BusError> {
    let err = |e: &dyn std::fmt::Display| BusError::kv("read the runners' consumer", e.to_string());
    let stream = bus
        .js
        .get_stream_no_info(subjects::STREAM_WORK)
        .await
        .map_err(|e| err(&e))?;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer(subjects::CONSUMER_RUNNERS)
        .await
        .map_err(|e| err(&e))?;
    Ok(consumer.info().await.map_err(|e| err(&e))?.num_pending)
}

/// Re-runs of a turn, found by their deterministic ids (`TurnId::for_rerun`), up to `max`.
pub async fn reruns(bus: &Bus, of: &TurnId, max: u32) -> Result<Vec<TurnRecord>, ApplyError> {
    let mut out = Vec::new();
    for n in 1..=max {
        match turn(bus, &TurnId::for_rerun(of, n)).await? {
            Some(r) => out.push(r),
            None => break,
        }
    }
    Ok(out)
}

/// The turns of a chat's last `limit` inbound messages, newest first. Reads backwards from the
/// subject's last message in windows of stream sequences, so a chat's whole life is never read.
pub async fn recent_turn_ids(
    bus: &Bus,
    chat: &ChatId,
    limit: usize,
) -> Result<Vec<TurnId>, BusError> {
    let subject = subjects::chat_in(chat);
    let stream = bus
        .js
        .get_stream_no_info(subjects::STREAM_CHAT_IN)
        .await
        .map_err(|e| BusError::kv("open the inbound stream", e))?;
    let last = match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => m,
        Err(e)
            if e.kind()
                == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
        {
            return Ok(Vec::new())
        }
        Err(e) => return Err(BusError::kv("read the chat's last inbound message", e)),
    };
    let mut seqs: Vec<(u64, InboundMessage)> = Vec::new();
    let mut window: u64 = 64;
    let mut upto = last.sequence + 1;
    // Each pass reads forward from `upto - window` to `upto`; at most `limit` messages are kept.
    for _ in 0..24 {
        let start = upto.saturating_sub(window).max(1);
        let mut found = Vec::new();
        let mut at = start;
        while at < upto && found.len() < 4 * limit {
            let m = match stream.get_first_raw_message_by_subject(&subject, at).await {
                Ok(m) => m,
                Err(_) => break,
            };
            if m.sequence >= upto {
                break;
            }
            at = m.sequence + 1;
            if let Ok(msg) = decode::<InboundMessage>(Some(&m.headers), &m.payload) {
                found.push((m.sequence, msg));
            }
        }
        found.extend(seqs);
        seqs = found;
        if seqs.len() >= limit || start == 1 {
            break;
        }
        upto = start;
        window = window.saturating_mul(4);
    }
    Ok(seqs
        .iter()
        .rev()
        .take(limit)
        .map(|(_, m)| TurnId::for_message(chat, &m.id))
        .collect())
}

/// Which bucket a [`watch`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    /// Turn records.
    Turns,
    /// The live index.
    Live,
    /// Chat records.
    Chats,
    /// Runner presence.
    Runners,
    /// Attempt claims.
    Claims,
}

/// Follow every change of a bucket from now on.
pub async fn watch(bus: &Bus, which: Watched) -> Result<kv::Watch, BusError> {
    let (store, name) = bucket(bus, which);
    store
        .watch_all()
        .await
        .map_err(|e| BusError::kv(format!("watch the {name} bucket"), e))
}

/// Follow every key of a bucket: each one's current value first, then every change.
pub async fn watch_current(bus: &Bus, which: Watched) -> Result<kv::Watch, BusError> {
    let (store, name) = bucket(bus, which);
    store
        .watch_with_history(">")
        .await
        .map_err(|e| BusError::kv(format!("watch the {name} bucket"), e))
}

fn bucket(bus: &Bus, which: Watched) -> (&kv::Store, &'static str) {
    match which {
        Watched::Turns => (&bus.turns, subjects::BUCKET_TURNS),
        Watched::Live => (&bus.live, subjects::BUCKET_LIVE),
        Watched::Chats => (&bus.chats, subjects::BUCKET_CHATS),
        Watched::Runners => (&bus.runners, subjects::BUCKET_RUNNERS),
        Watched::Claims => (&bus.claims, subjects::BUCKET_CLAIMS),
    }
}

/// The bucket's revision now: the sequence of the last write to it (of any key). A watch that
/// has delivered this revision has seen every write made before this call.
pub async fn revision(bus: &Bus, which: Watched) -> Result<u64, BusError> {
    let (_, name) = bucket(bus, which);
    let stream = bus
        .js
        .get_stream(format!("KV_{name}"))
        .await
        .map_err(|e| BusError::kv(format!("read the {name} bucket's revision"), e))?;
    Ok(stream.cached_info().state.last_sequence)
}

/// Follow one turn's record from now on.
pub async fn watch_turn(bus: &Bus, turn: &TurnId) -> Result<kv::Watch, BusError> {
    bus.turns
        .watch(turn.as_str())
        .await
        .map_err(|e| BusError::kv(format!("watch turn {turn}"), e))
}

/// Follow one chat's record: its current value first, then every change.
pub async fn watch_chat(bus: &Bus, chat: &ChatId) -> Result<kv::Watch, BusError> {
    bus.chats
        .watch_with_history(chat.as_str())
        .await
        .map_err(|e| BusError::kv(format!("watch chat {chat}"), e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_core::lifecycle::{create, NewTurn};

    fn record(state: TurnState) -> TurnRecord {
        let chat = ChatId::new("c").expect("chat");
        let (mut r, _) = create(
            NewTurn {
                turn: TurnId::new("t").expect("turn"),
                message: InboundMessage::new(chat, "m".to_owned(), "hi", None),
                history: Vec::new(),
                max_turn_retry: 3,
                retry_delay: Duration::from_secs(10),
                rerun_of: None,
                created_by: None,
                admit_now: true,
            },
            Timestamp::from_millis(0),
        );
        r.state = state;
        r
    }

    #[test]
    fn live_turns_are_counted_by_state_in_name_order() {
        let states = [
            TurnState::Running,
            TurnState::Queued,
            TurnState::Running,
            TurnState::Waiting,
        ];
        let c = Cluster {
            live: count_by_state(&states.map(record)),
            ..Cluster::default()
        };
        assert_eq!(
            c.live,
            vec![
                (TurnState::Queued, 1),
                (TurnState::Running, 2),
                (TurnState::Waiting, 1)
            ]
        );
        assert_eq!(c.live_in(TurnState::Running), 2);
        assert_eq!(c.live_in(TurnState::PendingRetry), 0);
    }
}
