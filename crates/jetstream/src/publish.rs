use crate::BusError;
use async_nats::header::{self, HeaderMap};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::publish::PublishAck;
use async_nats::jetstream::Context;
use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::SystemTime;
use turnpike_core::backoff::Backoff;
use turnpike_core::codec::{self, Codec, CodecError};
use turnpike_core::subjects;
use turnpike_core::wire::Versioned;
use turnpike_core::Timestamp;

/// The wall clock, read in one place.
pub fn now() -> Timestamp {
    Timestamp::from_system_time(SystemTime::now())
}

/// Headers that name the codec of the payload.
pub fn encode_headers(codec: Codec) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(codec::CONTENT_TYPE, codec.content_type());
    h
}

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

    /// JetStream dedup: a second publish with this id inside the duplicate window is dropped.
    pub fn msg_id(mut self, id: &str) -> Self {
        self.headers.insert(header::NATS_MESSAGE_ID, id);
        self
    }

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

    pub fn subject(&self) -> &str {
        self.subject.as_str()
    }

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

/// The scheduler takes RFC 3339 in UTC; it honours fractions of a second.
fn humantime_rfc3339_seconds(at: Timestamp) -> String {
    humantime::format_rfc3339_millis(at.to_system_time()).to_string()
}

/// Publish an inbound chat message as a chat adapter does: on `turnpike.chat.in.<chat>`, with its
/// id as the dedup id (so a retried publish is never a second message).
pub async fn publish_inbound(
    bus: &crate::Bus,
    msg: &turnpike_core::wire::InboundMessage,
) -> Result<PublishAck, BusError> {
    Publish::new(bus.codec, subjects::chat_in(&msg.chat), msg)?
        .msg_id(&msg.id)
        .send(&bus.js)
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
/// Never fails the caller: if even this publish fails, it is logged.
pub async fn dead_letter(
    js: &Context,
    source: &str,
    reason: &str,
    original_subject: &str,
    headers: Option<&HeaderMap>,
    payload: Bytes,
) {
    // Keep the original headers but JetStream's own (`Nats-*`): a dead letter must not be
    // deduplicated against, fenced or scheduled like the original.
    let mut h = HeaderMap::new();
    for (name, values) in headers.map(|h| h.iter()).into_iter().flatten() {
        if name.to_string().to_ascii_lowercase().starts_with("nats-") {
            continue;
        }
        for v in values {
            h.append(name.clone(), v.clone());
        }
    }
    let reason_line: String = reason
        .chars()
        .filter(|c| *c != '\r' && *c != '\n')
        .take(1000)
        .collect();
    h.insert(subjects::HDR_DEAD_REASON, reason_line.as_str());
    h.insert(subjects::HDR_DEAD_SOURCE, original_subject);
    let subject = subjects::dead_letter(source);
    let result = match js.publish_with_headers(subject.clone(), h, payload).await {
        Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match result {
        Ok(()) => tracing::warn!(%subject, from = original_subject, %reason, "dead-lettered"),
        Err(e) => {
            tracing::error!(%subject, from = original_subject, %reason, error = %e, "dead letter could not be stored")
        }
    }
}
