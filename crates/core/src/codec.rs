//! Payload codecs. JSON by default, so `nats stream view` and `nats kv get` show readable data;
//! MessagePack when a publisher sets `Content-Type: application/msgpack`. Every reader accepts both.

use crate::wire::Versioned;
use crate::FORMAT_VERSION;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// The header naming a payload's codec.
pub const CONTENT_TYPE: &str = "Content-Type";
/// `Content-Type` of JSON payloads (the default).
pub const JSON: &str = "application/json";
/// `Content-Type` of MessagePack payloads.
pub const MSGPACK: &str = "application/msgpack";

/// How payloads are encoded: readable JSON by default, compact MessagePack by choice; a reader
/// follows the `Content-Type` of each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// JSON.
    #[default]
    Json,
    /// MessagePack (named fields, so readers of either version keep working).
    #[serde(alias = "messagepack")]
    Msgpack,
}

/// Why a payload could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// A `Content-Type` neither codec is.
    #[error("unknown Content-Type {0:?}; expected {JSON} or {MSGPACK}")]
    UnknownContentType(String),
    /// Not JSON of the expected shape.
    #[error("payload is not valid JSON for this message: {0}")]
    Json(#[from] serde_json::Error),
    /// Not MessagePack of the expected shape.
    #[error("payload is not valid MessagePack for this message: {0}")]
    MsgpackDecode(#[from] rmp_serde::decode::Error),
    /// MessagePack encoding failed.
    #[error("could not encode MessagePack: {0}")]
    MsgpackEncode(#[from] rmp_serde::encode::Error),
    /// A payload newer than this release reads.
    #[error("payload has format version {found}; this release reads up to {FORMAT_VERSION}")]
    TooNew {
        /// The payload's version.
        found: u16,
    },
}

/// Only the version field, for a clear error when a payload is newer than this release.
#[derive(Deserialize)]
struct Peek {
    #[serde(default)]
    v: Option<u16>,
}

impl Codec {
    /// The codec a `Content-Type` header names; no header means JSON. Parameters such as
    /// `; charset=utf-8` are ignored.
    pub fn from_content_type(value: Option<&str>) -> Result<Codec, CodecError> {
        let Some(value) = value else {
            return Ok(Codec::Json);
        };
        let essence = value.split(';').next().unwrap_or("").trim();
        match essence.to_ascii_lowercase().as_str() {
            "" | JSON | "json" | "text/json" => Ok(Codec::Json),
            MSGPACK | "application/x-msgpack" | "application/vnd.msgpack" | "msgpack" => {
                Ok(Codec::Msgpack)
            }
            _ => Err(CodecError::UnknownContentType(value.to_owned())),
        }
    }

    /// The `Content-Type` value this codec writes.
    pub fn content_type(self) -> &'static str {
        match self {
            Codec::Json => JSON,
            Codec::Msgpack => MSGPACK,
        }
    }

    /// Encode `value`.
    pub fn encode<T: Serialize>(self, value: &T) -> Result<Vec<u8>, CodecError> {
        Ok(match self {
            Codec::Json => serde_json::to_vec(value)?,
            // Named fields, so optional/new fields evolve as they do in JSON.
            Codec::Msgpack => rmp_serde::to_vec_named(value)?,
        })
    }

    /// Decode and check the format version.
    pub fn decode<T: DeserializeOwned + Versioned>(self, bytes: &[u8]) -> Result<T, CodecError> {
        match self.decode_raw::<T>(bytes) {
            Ok(value) if value.version() > FORMAT_VERSION => Err(CodecError::TooNew {
                found: value.version(),
            }),
            Ok(value) => Ok(value),
            Err(e) => match self.decode_raw::<Peek>(bytes) {
                Ok(Peek { v: Some(found) }) if found > FORMAT_VERSION => {
                    Err(CodecError::TooNew { found })
                }
                _ => Err(e),
            },
        }
    }

    /// Decode without a version check (for types that carry no version, e.g. agent lines).
    pub fn decode_raw<T: DeserializeOwned>(self, bytes: &[u8]) -> Result<T, CodecError> {
        Ok(match self {
            Codec::Json => serde_json::from_slice(bytes)?,
            Codec::Msgpack => rmp_serde::from_slice(bytes)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::InboundMessage;

    #[test]
    fn content_types() {
        assert_eq!(Codec::from_content_type(None).expect("ok"), Codec::Json);
        assert_eq!(
            Codec::from_content_type(Some("application/json; charset=utf-8")).expect("ok"),
            Codec::Json
        );
        assert_eq!(
            Codec::from_content_type(Some("application/msgpack")).expect("ok"),
            Codec::Msgpack
        );
        assert!(Codec::from_content_type(Some("text/xml")).is_err());
    }

    #[test]
    fn newer_version_is_refused_clearly() {
        let err = Codec::Json
            .decode::<InboundMessage>(br#"{"v":9,"id":"1","chat":"c","text":"t"}"#)
            .expect_err("too new");
        assert!(matches!(err, CodecError::TooNew { found: 9 }), "{err}");
        // Even when the newer shape does not parse at all.
        let err = Codec::Json
            .decode::<InboundMessage>(br#"{"v":2,"something":"else"}"#)
            .expect_err("too new");
        assert!(matches!(err, CodecError::TooNew { found: 2 }), "{err}");
    }

    #[test]
    fn inbound_without_version_or_optionals_is_accepted() {
        let m: InboundMessage = Codec::Json
            .decode(br#"{"id":"1","chat":"c","text":"hi"}"#)
            .expect("decodes");
        assert_eq!(m.v, 1);
        assert!(m.sender.is_none() && m.attachments.is_empty());
    }

    #[test]
    fn bad_chat_id_in_payload_is_refused() {
        let err = Codec::Json
            .decode::<InboundMessage>(br#"{"id":"1","chat":"a.b","text":"hi"}"#)
            .expect_err("bad chat");
        assert!(err.to_string().contains("only A-Z"), "{err}");
    }
}
