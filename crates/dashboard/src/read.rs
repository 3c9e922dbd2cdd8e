//! What the pages show, read from JetStream. Every read is bounded: a page loads at most one
//! page of turn records, the live index and chat/runner buckets are read in one ordered pass
//! each, and a chat's recent turns come from the tail of its inbound subject.

use async_nats::jetstream::kv;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Duration;
use turnpike_core::wire::{ChatRecord, InboundMessage, RunnerPresence, Versioned};
use turnpike_core::{subjects, ChatId, TurnId, TurnRecord};
use turnpike_jetstream::{decode, decode_kv, Bus};
use turnpike_store::turns;

use crate::DashboardError;

/// Turn records loaded at once.
const PARALLEL_GETS: usize = 32;

fn kv_err(what: impl Into<String>, e: impl std::fmt::Display) -> DashboardError {
    DashboardError::Read {
        what: what.into(),
        why: e.to_string(),
    }
}

/// Every current (key, value) of a bucket, in one ordered pass (last value per key, markers of
/// deleted keys left out), sorted by key.
pub async fn snapshot(
    kv: &kv::Store,
    bucket: &str,
) -> Result<Vec<(String, bytes::Bytes)>, DashboardError> {
    // An empty bucket's watch would wait for a first entry: ask the stream first (the store's
    // own `status()` is the info cached when it was opened).
    let info = kv.stream.get_info().await.map_err(|e| kv_err(bucket, e))?;
    if info.state.messages == 0 {
        return Ok(Vec::new());
    }
    let mut watch = kv
        .watch_with_history(">")
        .await
        .map_err(|e| kv_err(bucket, e))?;
    let mut out = BTreeMap::new();
    let read = async {
        while let Some(entry) = watch.next().await {
            let entry = entry.map_err(|e| kv_err(bucket, e))?;
            if entry.operation == kv::Operation::Put {
                out.insert(entry.key, entry.value);
            } else {
                out.remove(&entry.key);
            }
            if entry.delta == 0 {
                break;
            }
        }
        Ok::<_, DashboardError>(())
    };
    tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .map_err(|_| kv_err(bucket, "reading the bucket took over 10 s"))??;
    Ok(out.into_iter().collect())
}

/// Values of a bucket decoded as `T`; values that do not decode are skipped (and logged).
pub async fn decoded<T: serde::de::DeserializeOwned + Versioned>(
    kv: &kv::Store,
    bucket: &str,
) -> Result<Vec<T>, DashboardError> {
    Ok(snapshot(kv, bucket)
        .await?
        .into_iter()
        .filter_map(|(k, v)| match decode_kv::<T>(&v) {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::warn!(bucket, key = %k, error = %e, "undecodable value left out of the dashboard");
                None
            }
        })
        .collect())
}

pub async fn turn(bus: &Bus, id: &TurnId) -> Result<Option<TurnRecord>, DashboardError> {
    turns::load(bus, id)
        .await
        .map(|v| v.map(|v| v.record))
        .map_err(|e| kv_err(format!("turn {id}"), e))
}

/// Reads at most when showing one turn's replies: far more than any turn lands, and a bound on
/// what one page view can cost.
const MAX_OUTPUT_READS: usize = 1000;

/// The bot messages the turn has landed so far, read from the chat's output: the record counts
/// an attempt's messages only once it ended, and a page shows a running one's as they land.
pub async fn output(
    bus: &Bus,
    r: &TurnRecord,
) -> Result<turnpike_store::fence::TurnOutput, DashboardError> {
    turnpike_store::fence::turn_output(bus, &r.chat, &r.turn, MAX_OUTPUT_READS)
        .await
        .map_err(|e| kv_err(format!("the replies of turn {}", r.turn), e))
}

/// Records of `ids` (missing ones left out), in the order given.
pub async fn turns(bus: &Bus, ids: &[TurnId]) -> Result<Vec<TurnRecord>, DashboardError> {
    let got: Vec<Option<TurnRecord>> = futures::stream::iter(ids.to_vec())
        .map(|id| {
            let bus = bus.clone();
            async move { turn(&bus, &id).await }
        })
        .buffered(PARALLEL_GETS)
        .try_collect()
        .await?;
    Ok(got.into_iter().flatten().collect())
}

/// Ids of turns not yet ended (the live index), sorted.
pub async fn live_ids(bus: &Bus) -> Result<Vec<TurnId>, DashboardError> {
    Ok(snapshot(&bus.live, subjects::BUCKET_LIVE)
        .await?
        .into_iter()
        .filter_map(|(k, _)| TurnId::new(k).ok())
        .collect())
}

pub async fn chats(bus: &Bus) -> Result<Vec<ChatRecord>, DashboardError> {
    decoded(&bus.chats, subjects::BUCKET_CHATS).await
}

pub async fn chat(bus: &Bus, id: &ChatId) -> Result<Option<ChatRecord>, DashboardError> {
    let v = bus
        .chats
        .get(id.as_str())
        .await
        .map_err(|e| kv_err(format!("chat {id}"), e))?;
    match v {
        Some(v) if !v.is_empty() => decode_kv(&v)
            .map(Some)
            .map_err(|e| kv_err(format!("chat {id}"), e)),
        _ => Ok(None),
    }
}

pub async fn runners(bus: &Bus) -> Result<Vec<RunnerPresence>, DashboardError> {
    decoded(&bus.runners, subjects::BUCKET_RUNNERS).await
}

/// Attempts waiting for a runner (the runners' consumer's pending count).
pub async fn queue_depth(bus: &Bus) -> Result<u64, DashboardError> {
    let stream = bus
        .js
        .get_stream_no_info(subjects::STREAM_WORK)
        .await
        .map_err(|e| kv_err("the work stream", e))?;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer = stream
        .get_consumer(subjects::CONSUMER_RUNNERS)
        .await
        .map_err(|e| kv_err("the runners' consumer", e))?;
    Ok(consumer
        .info()
        .await
        .map_err(|e| kv_err("the runners' consumer", e))?
        .num_pending)
}

/// Re-runs of a turn, found by their deterministic ids (`TurnId::for_rerun`), up to `max`.
pub async fn reruns(bus: &Bus, of: &TurnId, max: u32) -> Result<Vec<TurnRecord>, DashboardError> {
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
) -> Result<Vec<TurnId>, DashboardError> {
    let subject = subjects::chat_in(chat);
    let stream = bus
        .js
        .get_stream_no_info(subjects::STREAM_CHAT_IN)
        .await
        .map_err(|e| kv_err("the inbound stream", e))?;
    let last = match stream.get_last_raw_message_by_subject(&subject).await {
        Ok(m) => m,
        Err(e)
            if e.kind()
                == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
        {
            return Ok(Vec::new())
        }
        Err(e) => return Err(kv_err("the chat's last inbound message", e)),
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

use turnpike_core::wire::CountersSnapshot;

#[derive(Deserialize)]
struct ServiceStats {
    #[serde(default)]
    id: String,
    #[serde(default)]
    endpoints: Vec<EndpointStats>,
}

#[derive(Deserialize)]
struct EndpointStats {
    #[serde(default)]
    data: Option<CountersSnapshot>,
}

/// Every coordinator's counters, summed, and how many coordinators answered. Collects answers
/// until none has come for `quiet` (each coordinator answers at once).
pub async fn coordinator_counters(
    bus: &Bus,
    quiet: Duration,
) -> Result<(CountersSnapshot, usize), DashboardError> {
    let inbox = bus.client.new_inbox();
    let mut sub = bus
        .client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| kv_err("the coordinators' stats", e))?;
    bus.client
        .publish_with_reply(
            format!("$SRV.STATS.{}", subjects::OPS_SERVICE),
            inbox,
            bytes::Bytes::new(),
        )
        .await
        .map_err(|e| kv_err("the coordinators' stats", e))?;
    let mut total = CountersSnapshot::default();
    let mut seen = std::collections::HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let wait = quiet.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(wait, sub.next()).await {
            Ok(Some(m)) => {
                if let Ok(s) = serde_json::from_slice::<ServiceStats>(&m.payload) {
                    // Every endpoint carries the same process-wide counters: count each process once.
                    if seen.insert(s.id.clone()) {
                        if let Some(c) = s.endpoints.iter().find_map(|e| e.data.clone()) {
                            total.add(&c);
                        }
                    }
                }
            }
            _ => break,
        }
    }
    Ok((total, seen.len()))
}

/// What the overview shows: counters summed over the coordinators, live turns by state, the
/// work queue, capacity and errored chats.
pub async fn overview(bus: &Bus) -> Result<crate::html::Overview, DashboardError> {
    let (counters, coordinators) = coordinator_counters(bus, Duration::from_millis(50)).await?;
    let records = turns(bus, &live_ids(bus).await?).await?;
    let mut by_state: BTreeMap<&'static str, (turnpike_core::TurnState, u64)> = BTreeMap::new();
    for r in &records {
        by_state.entry(r.state.as_str()).or_insert((r.state, 0)).1 += 1;
    }
    let runners = runners(bus).await?;
    let errored_chats = chats(bus)
        .await?
        .iter()
        .filter(|c| c.errored.is_some())
        .count();
    Ok(crate::html::Overview {
        counters,
        coordinators,
        live: by_state.into_values().collect(),
        queue_depth: queue_depth(bus).await?,
        runners: runners.len(),
        slots: runners.iter().map(|r| r.slots).sum(),
        slots_in_use: runners.iter().map(|r| r.slots_in_use).sum(),
        errored_chats,
    })
}
