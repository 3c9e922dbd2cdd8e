//! The resource profile each chat runs with (`turnpike_profiles`, key: the chat id, value: the
//! profile's name). A chat with no key runs with `default_profile`. Operators move chats
//! (`turnpike.ops.profile`); each attempt's dispatch reads its chat's key once (a direct read of
//! the last message on the key's subject: no stream info).

use async_nats::jetstream::stream::LastRawMessageErrorKind;
use turnpike_core::{subjects, ChatId};
use turnpike_jetstream::BusError;

use crate::Bus;

fn subject(chat: &ChatId) -> String {
    format!("$KV.{}.{chat}", subjects::BUCKET_PROFILES)
}

/// The profile `chat` was moved to; `None`: the default (never moved, moved back, or a
/// topology from before profiles).
pub async fn of_chat(bus: &Bus, chat: &ChatId) -> Result<Option<String>, BusError> {
    let stream_name = format!("KV_{}", subjects::BUCKET_PROFILES);
    let stream = bus
        .js
        .get_stream_no_info(&stream_name)
        .await
        .map_err(|e| BusError::kv("open the profiles bucket", e))?;
    match stream.get_last_raw_message_by_subject(&subject(chat)).await {
        Ok(m) => {
            let deleted = m
                .headers
                .get("KV-Operation")
                .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"));
            let name = String::from_utf8_lossy(&m.payload).trim().to_owned();
            Ok((!deleted && !name.is_empty()).then_some(name))
        }
        Err(e) => match e.kind() {
            LastRawMessageErrorKind::NoMessageFound => Ok(None),
            LastRawMessageErrorKind::JetStream(j)
                if j.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND =>
            {
                Ok(None)
            }
            _ => Err(BusError::kv(format!("read chat {chat}'s profile"), e)),
        },
    }
}

/// Move `chat` to profile `name` (`None`: back to the default).
pub async fn set(bus: &Bus, chat: &ChatId, name: Option<&str>) -> Result<(), BusError> {
    let key = chat.as_str();
    match name {
        Some(name) => turnpike_jetstream::kv_put(
            &bus.js,
            subjects::BUCKET_PROFILES,
            key,
            bytes::Bytes::from(name.to_owned()),
            None,
            None,
        )
        .await
        .map(drop),
        None => turnpike_jetstream::kv_delete(&bus.js, subjects::BUCKET_PROFILES, key, None)
            .await
            .map(drop),
    }
}
