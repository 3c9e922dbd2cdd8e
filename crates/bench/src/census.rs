//! Which JetStream operations one turn really costs, counted on the wire rather than by reading
//! the code: a `>` subscription sees every request the roles send (API calls, acks, publishes).
//! The baseline of measurement 1 replays exactly this mix.

use crate::{burst, Stack};
use anyhow::{Context, Result};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::fmt;

/// The kinds of operation a turn costs, each a request the server answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Op {
    /// A publish into a stream, awaiting its PubAck.
    PublishAck,
    /// A KV put/create/update (also a stream publish awaiting its ack).
    KvWrite,
    /// A KV or stream read answered by the stream leader (`STREAM.MSG.GET`).
    LeaderGet,
    /// A direct get (`DIRECT.GET`), answered by any replica.
    DirectGet,
    /// A pull request for the next message(s) of a consumer.
    Fetch,
    /// An acknowledgement of a consumed message, fire-and-forget.
    Ack,
    /// An acknowledgement awaiting the server's confirmation (double ack).
    AckSync,
    /// Creating a consumer.
    ConsumerCreate,
    /// Deleting a consumer.
    ConsumerDelete,
    /// Purging a subject from a stream (KV delete/purge).
    Purge,
    /// Core publish with no reply expected.
    Plain,
    /// Any other JetStream API request.
    OtherApi,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::PublishAck => "stream publish + ack",
            Op::KvWrite => "KV write",
            Op::LeaderGet => "KV/stream get (leader)",
            Op::DirectGet => "direct get",
            Op::Fetch => "consumer fetch",
            Op::Ack => "consumer ack",
            Op::AckSync => "consumer ack, confirmed",
            Op::ConsumerCreate => "consumer create",
            Op::ConsumerDelete => "consumer delete",
            Op::Purge => "purge",
            Op::Plain => "core publish (no reply)",
            Op::OtherApi => "other JetStream API",
        })
    }
}

/// What a subject/reply pair is, or `None` for traffic that is not a request (replies,
/// consumer deliveries, server advisories, flow control).
pub fn classify(subject: &str, reply: Option<&str>) -> Option<Op> {
    // A consumer's delivery carries the stored message's own subject and an ack reply subject;
    // it is the answer to a fetch (or a push), not a new request.
    if reply.is_some_and(|r| r.starts_with("$JS.ACK.")) {
        return None;
    }
    let has_reply = reply.is_some();
    if subject.starts_with("_INBOX")
        || subject.starts_with("$JS.EVENT")
        || subject.starts_with("$JS.FC")
        || subject.starts_with("$SYS")
    {
        return None;
    }
    if let Some(api) = subject.strip_prefix("$JS.API.") {
        return Some(if api.starts_with("STREAM.MSG.GET.") {
            Op::LeaderGet
        } else if api.starts_with("DIRECT.GET.") {
            Op::DirectGet
        } else if api.starts_with("CONSUMER.MSG.NEXT.") {
            Op::Fetch
        } else if api.starts_with("CONSUMER.CREATE.") || api.starts_with("CONSUMER.DURABLE.CREATE.")
        {
            Op::ConsumerCreate
        } else if api.starts_with("CONSUMER.DELETE.") {
            Op::ConsumerDelete
        } else if api.starts_with("STREAM.PURGE.") {
            Op::Purge
        } else {
            Op::OtherApi
        });
    }
    if subject.starts_with("$JS.ACK.") {
        return Some(if has_reply { Op::AckSync } else { Op::Ack });
    }
    if !has_reply {
        return Some(Op::Plain);
    }
    if subject.starts_with("$KV.") {
        Some(Op::KvWrite)
    } else {
        Some(Op::PublishAck)
    }
}

/// A subject with its per-turn tokens dropped, so that counts group by what they are.
fn shape(subject: &str) -> String {
    // A get names its stream in the sixth token: which bucket is read is the point.
    let keep = if subject.starts_with("$JS.API.STREAM.MSG.GET.")
        || subject.starts_with("$JS.API.DIRECT.GET.")
    {
        6
    } else if subject.starts_with("$JS.") {
        5
    } else if subject.starts_with("turnpike.") {
        3
    } else {
        2
    };
    // Turn ids would give every turn a line of its own.
    subject
        .split('.')
        .take(keep)
        .map(|t| if t.starts_with("t-") { "<turn>" } else { t })
        .collect::<Vec<_>>()
        .join(".")
}

/// Operations per turn, by kind.
#[derive(Clone, Debug, Default)]
pub struct Mix(pub BTreeMap<Op, f64>);

impl Mix {
    /// Round trips per turn: every request the server answers (plain publishes and acks are
    /// fire-and-forget, so they are listed but not counted as round trips).
    pub fn round_trips(&self) -> f64 {
        self.0
            .iter()
            .filter(|(op, _)| !matches!(op, Op::Plain | Op::Ack))
            .map(|(_, n)| n)
            .sum()
    }

    /// Each kind rounded to whole operations per turn, for the baseline to replay.
    pub fn whole(&self) -> Vec<(Op, usize)> {
        self.0
            .iter()
            .map(|(op, n)| (*op, n.round() as usize))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// Run `n` turns on `stack` with a `>` subscription open and count what they cost.
pub async fn count(stack: &Stack, n: usize, tag: &str) -> Result<Mix> {
    let mut all = stack.bus.client.subscribe(">").await?;
    // Let the interest propagate before the first publish.
    stack.bus.client.flush().await?;
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    // TURNPIKE_CENSUS_DETAIL=1 also prints which subjects each kind went to.
    let detail = std::env::var_os("TURNPIKE_CENSUS_DETAIL").is_some();
    let counter = tokio::spawn(async move {
        let mut seen: BTreeMap<Op, u64> = BTreeMap::new();
        let mut subjects: BTreeMap<(Op, String), u64> = BTreeMap::new();
        loop {
            tokio::select! {
                _ = &mut stopped => break,
                m = all.next() => match m {
                    Some(m) => {
                        if let Some(op) = classify(m.subject.as_str(), m.reply.as_deref()) {
                            *seen.entry(op).or_default() += 1;
                            if detail {
                                *subjects.entry((op, shape(m.subject.as_str()))).or_default() += 1;
                            }
                        }
                    }
                    None => break,
                },
            }
        }
        for ((op, subject), c) in subjects {
            eprintln!("{:>7.2}  {op:<24} {subject}", c as f64 / n as f64);
        }
        seen
    });
    let result = burst(stack, n, "reply:ok", tag).await;
    // Let the last turns' trailing writes (chat releases, live purges) land.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    stack.bus.client.flush().await?;
    let _ = stop.send(());
    result?;
    let seen = counter.await?;
    Ok(Mix(seen
        .into_iter()
        .map(|(op, c)| (op, c as f64 / n as f64))
        .collect()))
}

/// Round trips in a rounded mix (acks and plain publishes are fire-and-forget).
/// The fewest operations one happy-path turn needs while keeping every promise, as derived in
/// docs/benchmarks/minimal-turn.md: measurement 1's second baseline. What the census counts can
/// only approach it; an operation the pipeline does beyond it shows as the gap between the two.
pub const MINIMAL: &[(Op, usize)] = &[
    // inbound, attempt 1, fence marker, bot message, exit report, final status
    (Op::PublishAck, 6),
    // chat join, turn create, live put, the exit applied, chat release, live purge
    (Op::KvWrite, 6),
    // the chat's previous inbound message, the reply read back for history
    (Op::LeaderGet, 2),
    (Op::Fetch, 1),
    // inbound, work item, exit report
    (Op::Ack, 3),
];

pub fn round_trips(whole: &[(Op, usize)]) -> usize {
    whole
        .iter()
        .filter(|(op, _)| !matches!(op, Op::Plain | Op::Ack))
        .map(|(_, n)| n)
        .sum()
}

const BASE_STREAM: &str = "BENCH_BASE";
const BASE_BUCKET: &str = "bench_base";

/// Streams and consumers for the baseline, configured like the pipeline's own: a stream shaped
/// like the events stream, a KV bucket shaped like the turns bucket (leader reads, CAS writes),
/// and one durable pull consumer per loop shaped like the coordinator's. The loops share
/// `connections` client connections, loop `w` using connection `w % connections`.
#[derive(Clone)]
pub struct Baseline {
    conns: Vec<Conn>,
    consumers: Vec<async_nats::jetstream::consumer::PullConsumer>,
}

/// One client connection of the baseline and its handles.
#[derive(Clone)]
struct Conn {
    js: async_nats::jetstream::Context,
    client: async_nats::Client,
    kv: async_nats::jetstream::kv::Store,
}

impl Baseline {
    pub async fn create(stack: &Stack, loops: usize, connections: usize) -> Result<Baseline> {
        use async_nats::jetstream::{consumer, kv};
        use turnpike_core::subjects;
        let js = stack.bus.js.clone();
        let streams = turnpike_jetstream::topology::stream_configs(&stack.config)?;
        let like = |name: &str| {
            streams
                .iter()
                .find(|s| s.name == name)
                .cloned()
                .with_context(|| format!("no stream {name} in the topology"))
        };
        let mut events = like(subjects::STREAM_EVENTS)?;
        events.name = BASE_STREAM.into();
        events.subjects = vec!["bench.base.>".into()];
        events.allow_direct = true;
        let mut turns = like(&format!("KV_{}", subjects::BUCKET_TURNS))?;
        turns.name = format!("KV_{BASE_BUCKET}");
        turns.subjects = vec![format!("$KV.{BASE_BUCKET}.>")];
        let _ = js.delete_stream(BASE_STREAM).await;
        let _ = js.delete_stream(&turns.name).await;
        js.create_stream(events).await?;
        js.create_stream(turns).await?;
        let mut conns = Vec::with_capacity(connections.max(1));
        for c in 0..connections.max(1) {
            let client = if c == 0 {
                stack.bus.client.clone()
            } else {
                turnpike_jetstream::connect(&stack.config, &format!("bench-baseline-{c}")).await?
            };
            let js = async_nats::jetstream::new(client.clone());
            let kv: kv::Store = js.get_key_value(BASE_BUCKET).await?;
            conns.push(Conn { js, client, kv });
        }
        let (_, like_coordinator) = turnpike_jetstream::topology::consumer_configs(&stack.config)?
            .into_iter()
            .find(|(s, _)| *s == subjects::STREAM_EVENTS)
            .context("no coordinator consumer in the topology")?;
        let mut consumers = Vec::with_capacity(loops);
        for w in 0..loops {
            let c = consumer::pull::Config {
                durable_name: Some(format!("base-{w}")),
                filter_subject: format!("bench.base.{w}.>"),
                filter_subjects: vec![],
                ..like_coordinator.clone()
            };
            let stream = conns[w % conns.len()]
                .js
                .get_stream_no_info(BASE_STREAM)
                .await?;
            consumers.push(stream.create_consumer(c).await?);
        }
        Ok(Baseline { conns, consumers })
    }

    /// One baseline "turn" of loop `w`: every operation of `mix`, in the mix's order (publishes
    /// before the reads and fetches that need them).
    pub async fn turn(&self, w: usize, t: usize, mix: &[(Op, usize)]) -> Result<()> {
        use async_nats::jetstream::consumer::pull::OrderedConfig;
        let key = format!("b-{w}-{t}");
        let subject = format!("bench.base.{w}.{t}");
        let payload = bytes::Bytes::from_static(&[b'x'; 200]);
        let Conn { js, client, kv } = &self.conns[w % self.conns.len()];
        let mut revision = None;
        let mut ordered = Vec::new();
        let mut fetched = Vec::new();
        for (op, count) in mix {
            for i in 0..*count {
                match op {
                    Op::PublishAck => {
                        let mut h = async_nats::HeaderMap::new();
                        h.insert("Nats-Msg-Id", format!("{key}-{i}").as_str());
                        js.publish_with_headers(subject.clone(), h, payload.clone())
                            .await?
                            .await?;
                    }
                    Op::KvWrite => {
                        revision = Some(match revision {
                            None => kv.create(&key, payload.clone()).await?,
                            Some(r) => kv.update(&key, payload.clone(), r).await?,
                        });
                    }
                    Op::LeaderGet => {
                        kv.get(&key).await?;
                    }
                    Op::DirectGet => {
                        let s = js.get_stream_no_info(BASE_STREAM).await?;
                        s.direct_get_last_for_subject(&subject).await?;
                    }
                    Op::OtherApi => {
                        // What the pipeline's other API calls are: a stream info before a scan.
                        js.get_stream(BASE_STREAM).await?;
                    }
                    Op::ConsumerCreate => {
                        // No round trip: the handle is local.
                        let s = js.get_stream_no_info(BASE_STREAM).await?;
                        ordered.push(
                            s.create_consumer(OrderedConfig {
                                filter_subject: subject.clone(),
                                ..Default::default()
                            })
                            .await?,
                        );
                    }
                    Op::Fetch => {
                        // A scan's read is one of the fetches the census counted.
                        if let Some(c) = ordered.pop() {
                            let mut m = c.messages().await?;
                            m.next().await.context("ordered consumer ended")??;
                        } else {
                            let want = mix
                                .iter()
                                .filter(|(o, _)| matches!(o, Op::Ack | Op::AckSync))
                                .map(|(_, k)| k)
                                .sum::<usize>()
                                .max(1);
                            let mut batch = self.consumers[w]
                                .fetch()
                                .max_messages(want)
                                .expires(std::time::Duration::from_secs(1))
                                .messages()
                                .await?;
                            while let Some(m) = batch.next().await {
                                fetched.push(m.map_err(|e| anyhow::anyhow!("fetch: {e}"))?);
                            }
                        }
                    }
                    Op::Ack => {
                        if let Some(m) = fetched.pop() {
                            m.ack().await.map_err(|e| anyhow::anyhow!("ack: {e}"))?;
                        }
                    }
                    Op::AckSync => {
                        if let Some(m) = fetched.pop() {
                            m.double_ack()
                                .await
                                .map_err(|e| anyhow::anyhow!("double ack: {e}"))?;
                        }
                    }
                    Op::ConsumerDelete => {
                        // The pipeline deletes nothing per turn today; a delete of a missing
                        // consumer still costs the round trip.
                        let _ = js
                            .get_stream_no_info(BASE_STREAM)
                            .await?
                            .delete_consumer(&format!("none-{key}"))
                            .await;
                    }
                    Op::Purge => {
                        kv.purge(format!("{key}-p")).await?;
                    }
                    Op::Plain => {
                        client.publish(subject.clone(), payload.clone()).await?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_shapes_group_per_turn_subjects_together() {
        assert_eq!(
            shape("turnpike.events.t-00df5c8edc1800cedbd7d526"),
            "turnpike.events.<turn>"
        );
        assert_eq!(
            shape("$KV.turnpike_turns.t-00df5c8edc1800cedbd7d526"),
            "$KV.turnpike_turns"
        );
        // Gets keep the stream they read: which bucket a turn reads is what the census is for.
        assert_eq!(
            shape("$JS.API.STREAM.MSG.GET.KV_turnpike_turns"),
            "$JS.API.STREAM.MSG.GET.KV_turnpike_turns"
        );
        assert_eq!(
            shape("$JS.API.CONSUMER.MSG.NEXT.TURNPIKE_WORK.runners"),
            "$JS.API.CONSUMER.MSG.NEXT"
        );
    }

    #[test]
    fn subjects_are_classified_by_what_the_server_does() {
        assert_eq!(
            classify("$JS.API.STREAM.MSG.GET.KV_turnpike_turns", Some("_INBOX.r")),
            Some(Op::LeaderGet)
        );
        assert_eq!(
            classify("$JS.API.DIRECT.GET.KV_x", Some("_INBOX.r")),
            Some(Op::DirectGet)
        );
        assert_eq!(
            classify("$JS.API.CONSUMER.MSG.NEXT.work.runners", Some("_INBOX.r")),
            Some(Op::Fetch)
        );
        assert_eq!(
            classify("$JS.API.CONSUMER.CREATE.s.c.f", Some("_INBOX.r")),
            Some(Op::ConsumerCreate)
        );
        assert_eq!(
            classify("$JS.ACK.work.runners.1.2.3.4.5", None),
            Some(Op::Ack)
        );
        assert_eq!(
            classify("$KV.turnpike_turns.t1", Some("_INBOX.r")),
            Some(Op::KvWrite)
        );
        assert_eq!(
            classify("turnpike.events.t1", Some("_INBOX.r")),
            Some(Op::PublishAck)
        );
        assert_eq!(classify("turnpike.progress.t1", None), Some(Op::Plain));
        assert_eq!(classify("_INBOX.abc.1", None), None);
        // A pull consumer's delivery: the stored subject, an ack reply.
        assert_eq!(
            classify(
                "turnpike.events.t1",
                Some("$JS.ACK.TURNPIKE_EVENTS.c.1.2.3.4.5")
            ),
            None
        );
        assert_eq!(classify("$JS.EVENT.ADVISORY.API", None), None);
    }

    #[test]
    fn acks_and_plain_publishes_are_not_round_trips() {
        let mix = Mix([
            (Op::PublishAck, 3.0),
            (Op::Ack, 2.0),
            (Op::Plain, 1.0),
            (Op::LeaderGet, 1.4),
        ]
        .into_iter()
        .collect());
        assert!((mix.round_trips() - 4.4).abs() < 1e-9);
        assert_eq!(
            mix.whole(),
            vec![
                (Op::PublishAck, 3),
                (Op::LeaderGet, 1),
                (Op::Ack, 2),
                (Op::Plain, 1)
            ]
        );
    }
}
