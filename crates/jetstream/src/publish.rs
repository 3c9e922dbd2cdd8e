use crate::BusError;
use async_nats::header::{self, HeaderMap};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::Context;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::{Duration, SystemTime};
use turnpike_core::backoff::Backoff;
use turnpike_core::codec::{self, Codec, CodecError};
use turnpike_core::subjects;
use turnpike_core::wire::Versioned;
use turnpike_core::Timestamp;

/// The wall clock, read in one place.
pub fn now() -> Timestamp {
    let ahead = CLOCK_AHEAD_MS.load(std::sync::atomic::Ordering::Relaxed);
    Timestamp::from_system_time(SystemTime::now()).saturating_add(Duration::from_millis(ahead))
}

/// How far this process's [`now`] runs ahead of the system clock: zero, but in a test of what a
/// host with a fast clock does.
static CLOCK_AHEAD_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// For tests (in a test binary of their own: it is process-wide): from now on, [`now`] runs
/// `ahead` of the system clock, as on a host whose clock is wrong. Decisions dated by the
/// servers' clock must not notice.
#[doc(hidden)]
pub fn skew_clock_for_tests(ahead: Duration) {
    CLOCK_AHEAD_MS.store(
        u64::try_from(ahead.as_millis()).unwrap_or(u64::MAX),
        std::sync::atomic::Ordering::Relaxed,
    );
}

/// Headers that name the codec of the payload.
pub fn encode_headers(codec: Codec) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(codec::CONTENT_TYPE, codec.content_type());
    h
}

/// A header's value, if the message has headers and that one.
pub fn header_str<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers.and_then(|h| h.get(name)).map(|v| v.as_str())
}

/// Decode a message payload with the codec its `Content-Type` names (JSON when absent).
pub fn decode<T: DeserializeOwned + Versioned>(
    headers: Option<&HeaderMap>,
    payload: &[u8],
) -> Result<T, CodecError> {
    Codec::from_content_type(header_str(headers, codec::CONTENT_TYPE))?.decode(payload)
}

/// Decode a KV value. KV entries carry no headers, so the codec is told by the first byte: a JSON
/// object starts with `{` (after optional white space); a MessagePack map never does.
pub fn decode_kv<T: DeserializeOwned + Versioned>(bytes: &[u8]) -> Result<T, CodecError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    match first {
        Some(b'{') | None => Codec::Json.decode(bytes),
        Some(_) => Codec::Msgpack.decode(bytes),
    }
}

/// Tries (backing off from 5 ms to 1 s, about 5 s in all) of a publish refused because its
/// dedup id is still in process; past that it fails as any publish may (transient: retried).
const DEDUP_IN_PROCESS_TRIES: usize = 12;

/// One JetStream publish, built up and then sent; it waits for the server's ack.
pub struct Publish {
    /// Shared bytes, like the payload: each try of [`Publish::send`] clones a pointer. The
    /// headers are cloned per try (async-nats takes them by value and returns nothing on error).
    subject: async_nats::Subject,
    headers: HeaderMap,
    payload: Bytes,
}

impl Publish {
    /// `value` encoded with `codec` for `subject`, its `Content-Type` set.
    pub fn new<T: Serialize>(
        codec: Codec,
        subject: impl Into<String>,
        value: &T,
    ) -> Result<Self, BusError> {
        Ok(Publish {
            subject: async_nats::Subject::from(subject.into()),
            headers: encode_headers(codec),
            payload: Bytes::from(codec.encode(value)?),
        })
    }

    /// A payload already encoded, with no headers of its own (a KV value).
    pub fn bytes(subject: impl Into<String>, payload: Bytes) -> Self {
        Publish {
            subject: async_nats::Subject::from(subject.into()),
            headers: HeaderMap::new(),
            payload,
        }
    }

    /// JetStream dedup: a second publish with this id inside the duplicate window is dropped.
    pub fn msg_id(mut self, id: &str) -> Self {
        self.headers.insert(header::NATS_MESSAGE_ID, id);
        self
    }

    /// Set a header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.insert(name, value);
        self
    }

    /// Publish only if the last message on `subject` (in the same stream) has sequence `seq`.
    pub fn expect_last_on(mut self, subject: &str, seq: u64) -> Self {
        self.headers.insert(
            header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            seq.to_string().as_str(),
        );
        self.headers
            .insert("Nats-Expected-Last-Subject-Sequence-Subject", subject);
        self
    }

    /// Hold the message in the stream until `at`, then store it on `target` (message scheduling).
    pub fn schedule_at(mut self, at: Timestamp, target: &str) -> Self {
        let at = humantime_rfc3339_seconds(at);
        self.headers
            .insert(header::NATS_SCHEDULE, format!("@at {at}").as_str());
        self.headers.insert(header::NATS_SCHEDULE_TARGET, target);
        self
    }

    /// Where it will be published.
    pub fn subject(&self) -> &str {
        self.subject.as_str()
    }

    /// Publish and wait for the stream's acknowledgement. A compare-and-set that lost is
    /// [`BusError::Fenced`]; a dedup id still being proposed is tried again briefly.
    pub async fn send(self, js: &Context) -> Result<PublishAck, BusError> {
        // A replicated stream refuses a publish whose dedup id another publish is still
        // proposing (two roles finishing the same effect at once); it is acknowledged as the
        // duplicate it is once that one is stored, within a few milliseconds.
        let waits = Backoff::doubling(
            std::time::Duration::from_millis(5),
            std::time::Duration::from_secs(1),
        );
        for wait in waits.take(DEDUP_IN_PROCESS_TRIES) {
            match self.send_once(js).await {
                Err(e) if crate::dedup_in_process(&e) => {
                    tracing::debug!(subject = %self.subject, "dedup id in process; publishing again");
                    tokio::time::sleep(wait).await;
                }
                sent => return sent,
            }
        }
        self.send_once(js).await
    }

    async fn send_once(&self, js: &Context) -> Result<PublishAck, BusError> {
        let ack = js
            .publish_with_headers(
                self.subject.clone(),
                self.headers.clone(),
                self.payload.clone(),
            )
            .await
            .map_err(|e| BusError::publish(self.subject.as_str(), e))?;
        ack.await.map_err(|e| {
            if e.kind() == PublishErrorKind::WrongLastSequence || crate::lost_cas(&e) {
                BusError::Fenced {
                    subject: self.subject.to_string(),
                }
            } else {
                BusError::publish(self.subject.as_str(), e)
            }
        })
    }
}

/// Write `value` under `key` in KV bucket `bucket` by hand (a KV write is a publish on
/// `$KV.<bucket>.<key>`): only if the key's last revision is still `expect` (`Some(0)`: no
/// message on it at all), and expiring `ttl` after this write if given (the bucket must allow
/// per-message TTLs), which no async-nats KV call can do. A lost compare-and-set is
/// [`BusError::Fenced`]. Returns the new revision.
pub async fn kv_put(
    js: &Context,
    bucket: &str,
    key: &str,
    value: Bytes,
    expect: Option<u64>,
    ttl: Option<Duration>,
) -> Result<u64, BusError> {
    let subject = format!("$KV.{bucket}.{key}");
    let mut publish = Publish::bytes(subject.clone(), value);
    if let Some(ttl) = ttl {
        publish = publish.header("Nats-TTL", &ttl_secs(ttl));
    }
    if let Some(seq) = expect {
        publish = publish.expect_last_on(&subject, seq);
    }
    Ok(publish.send(js).await?.sequence)
}

/// Mark `key` deleted in KV bucket `bucket` (what async-nats's `delete` writes), expiring `ttl`
/// after this write if given. Unlike a purge, no roll-up: the buckets runners write refuse
/// roll-ups, which would let one message wipe a whole bucket. In a bucket that keeps one
/// message per key, the marker replaces the value all the same.
pub async fn kv_delete(
    js: &Context,
    bucket: &str,
    key: &str,
    ttl: Option<Duration>,
) -> Result<u64, BusError> {
    let mut publish =
        Publish::bytes(format!("$KV.{bucket}.{key}"), Bytes::new()).header("KV-Operation", "DEL");
    if let Some(ttl) = ttl {
        publish = publish.header("Nats-TTL", &ttl_secs(ttl));
    }
    Ok(publish.send(js).await?.sequence)
}

/// The TTL header takes whole seconds; round up, so nothing lasts less than configured.
pub fn ttl_secs(d: Duration) -> String {
    let secs = d.as_millis().div_ceil(1000).max(1);
    format!("{secs}s")
}

/// The scheduler takes RFC 3339 in UTC; it honours fractions of a second.
fn humantime_rfc3339_seconds(at: Timestamp) -> String {
    humantime::format_rfc3339_millis(at.to_system_time()).to_string()
}

/// Publish an inbound chat message as a chat adapter does: on `turnpike.chat.in.<chat>`, with its
/// id as the dedup id (so a retried publish is never a second message).
pub async fn publish_inbound(
    js: &Context,
    codec: Codec,
    msg: &turnpike_core::wire::InboundMessage,
) -> Result<PublishAck, BusError> {
    Publish::new(codec, subjects::chat_in(&msg.chat), msg)?
        .msg_id(&msg.id)
        .send(js)
        .await
}

/// Shorthand: publish `value` on `subject`, with a dedup id.
pub async fn publish<T: Serialize>(
    js: &Context,
    codec: Codec,
    subject: impl Into<String>,
    msg_id: Option<&str>,
    value: &T,
) -> Result<PublishAck, BusError> {
    let mut p = Publish::new(codec, subject, value)?;
    if let Some(id) = msg_id {
        p = p.msg_id(id);
    }
    p.send(js).await
}

/// Refuse a pulled message for good: record it as a dead letter of `role` with `reason`, count
/// it in `refused`, and terminate its delivery (it never comes back). Every role refuses input
/// this way; the dispatcher first counts the message taken in its chat.
pub async fn refuse(
    js: &Context,
    role: &str,
    msg: &async_nats::jetstream::Message,
    reason: &str,
    refused: &std::sync::atomic::AtomicU64,
) {
    refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    dead_letter(
        js,
        role,
        reason,
        msg.subject.as_str(),
        msg.headers.as_ref(),
        msg.payload.clone(),
    )
    .await;
    if let Err(e) = msg.ack_with(async_nats::jetstream::AckKind::Term).await {
        tracing::debug!(error = %e, "terminating a refused message failed; it may come back and be refused again");
    }
}

/// Record input a role refused: the original payload and headers, plus why and from where.
/// Never fails the caller: if even this publish fails, it is logged. Bounded: the reason is cut,
/// and a payload that would not fit `max_payload` beside the headers is kept cut, saying so.
pub async fn dead_letter(
    js: &Context,
    source: &str,
    reason: &str,
    original_subject: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
) {
    let (h, payload) = dead_letter_message(
        reason,
        original_subject,
        headers,
        payload,
        js.client().max_payload(),
    );
    let shown = turnpike_core::sizes::quote(reason);
    let subject = subjects::dead_letter(source);
    let result = match js.publish_with_headers(subject.clone(), h, payload).await {
        Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match result {
        Ok(()) => {
            tracing::warn!(%subject, from = original_subject, reason = %shown, "dead-lettered")
        }
        Err(e) => {
            tracing::error!(%subject, from = original_subject, reason = %shown, error = %e, "dead letter could not be stored")
        }
    }
}

/// Header bytes of dead letters that carry the original headers at most; more are left out.
const DEAD_ORIGINAL_HEADERS_MAX: usize = 16 * 1024;
/// The header that says a dead letter's payload was cut, and how long it was.
pub const HDR_DEAD_CUT: &str = "Turnpike-Dead-Cut";

/// What NATS counts for `h` (`NATS/1.0`, each `name: value`, the blank line).
fn header_wire_len(h: &HeaderMap) -> usize {
    12 + h
        .iter()
        .map(|(name, values)| {
            let name = name.to_string().len();
            values
                .iter()
                .map(|v| name + v.as_str().len() + 4)
                .sum::<usize>()
        })
        .sum::<usize>()
}

/// A dead letter's headers and payload, within `max_payload`: the original headers but
/// JetStream's own (a dead letter must not be deduplicated against, fenced or scheduled like the
/// original) and at most [`DEAD_ORIGINAL_HEADERS_MAX`] of them, the reason on one line cut short,
/// where from, and the payload, cut if it does not fit beside them.
pub fn dead_letter_message(
    reason: &str,
    original_subject: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
    max_payload: usize,
) -> (HeaderMap, Bytes) {
    let mut h = HeaderMap::new();
    for (name, values) in headers.map(|h| h.iter()).into_iter().flatten() {
        if name.to_string().to_ascii_lowercase().starts_with("nats-") {
            continue;
        }
        for v in values {
            h.append(name.clone(), v.clone());
        }
    }
    if header_wire_len(&h) > DEAD_ORIGINAL_HEADERS_MAX {
        h = HeaderMap::new();
    }
    let one_line: String = reason
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let reason_line = turnpike_core::sizes::cut(&one_line, turnpike_core::sizes::REASON_MAX);
    h.insert(subjects::HDR_DEAD_REASON, reason_line.as_ref());
    h.insert(subjects::HDR_DEAD_SOURCE, original_subject);
    // Room for the cut header itself, and a margin.
    let room = max_payload.saturating_sub(header_wire_len(&h) + 64);
    if payload.len() <= room {
        return (h, payload);
    }
    h.insert(HDR_DEAD_CUT, payload.len().to_string().as_str());
    (h, payload.slice(..room))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 32: a refused message that was near `max_payload` itself, with large headers and a
    /// reason quoting a huge name, still makes a dead letter NATS accepts, saying it was cut.
    #[test]
    fn a_dead_letter_always_fits_max_payload() {
        let max = 1 << 20;
        let mut original = HeaderMap::new();
        original.insert("Nats-Msg-Id", "m1");
        original.insert("X-Adapter", "a".repeat(40_000).as_str());
        let payload = Bytes::from(vec![b'x'; max - 100]);
        let reason = format!(
            "attachment name {} is too long\r\nsecond line",
            "\"".repeat(300_000)
        );
        let (h, p) =
            dead_letter_message(&reason, "turnpike.chat.in.c", Some(&original), payload, max);
        assert!(
            header_wire_len(&h) + p.len() <= max,
            "{}",
            header_wire_len(&h) + p.len()
        );
        assert_eq!(
            h.get(HDR_DEAD_CUT).map(|v| v.as_str()),
            Some((max - 100).to_string().as_str())
        );
        assert!(h.get("Nats-Msg-Id").is_none() && h.get("X-Adapter").is_none());
        let kept = h
            .get(subjects::HDR_DEAD_REASON)
            .map(|v| v.to_string())
            .unwrap_or_default();
        assert!(
            kept.len() <= turnpike_core::sizes::REASON_MAX && !kept.contains('\n'),
            "{}",
            kept.len()
        );
        // A small one is kept whole, its own headers with it.
        let mut small = HeaderMap::new();
        small.insert("X-Adapter", "slack");
        let (h, p) = dead_letter_message("bad", "s", Some(&small), Bytes::from_static(b"{}"), max);
        assert_eq!(&p[..], b"{}");
        assert_eq!(h.get("X-Adapter").map(|v| v.as_str()), Some("slack"));
        assert!(h.get(HDR_DEAD_CUT).is_none());
    }
}
