//! Identifiers that become subject tokens and KV keys, validated once at the boundary.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;

/// Why an identifier was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// An empty id.
    #[error("{kind} id is empty")]
    Empty {
        /// Which id (turn, chat, runner).
        kind: &'static str,
    },
    /// An id longer than its kind allows.
    #[error("{kind} id is {len} characters long; at most {max} are allowed")]
    TooLong {
        /// Which id (turn, chat, runner).
        kind: &'static str,
        /// Its length, in characters.
        len: usize,
        /// The most allowed.
        max: usize,
    },
    /// A character an id may not have.
    #[error("{kind} id {value:?} has {bad:?}; only A-Z, a-z, 0-9, '_' and '-' are allowed")]
    BadChar {
        /// Which id (turn, chat, runner).
        kind: &'static str,
        /// The id as given.
        value: String,
        /// The first character not allowed.
        bad: char,
    },
}

/// `[A-Za-z0-9_-]{1,max}`: safe as a NATS subject token and as a KV key alike.
fn validate(kind: &'static str, value: &str, max: usize) -> Result<(), IdError> {
    if value.is_empty() {
        return Err(IdError::Empty { kind });
    }
    let len = value.chars().count();
    if len > max {
        return Err(IdError::TooLong { kind, len, max });
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || *c == '_' || *c == '-'))
    {
        return Err(IdError::BadChar {
            kind,
            value: value.to_owned(),
            bad,
        });
    }
    Ok(())
}

macro_rules! token_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// The longest id allowed, in characters.
            pub const MAX_LEN: usize = $max;

            /// `value`, if it is a valid id of this kind.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                validate($kind, &value, $max)?;
                Ok(Self(value))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(value: String) -> Result<Self, IdError> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, IdError> {
                Self::new(s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

token_id!(
    /// A chat: `[A-Za-z0-9_-]{1,128}`, part of the public chat contract.
    ChatId,
    "chat",
    128
);
token_id!(
    /// A turn: derived from the chat and inbound message id, so a replayed message maps to the same turn.
    TurnId,
    "turn",
    64
);
token_id!(
    /// A runner node, stable across its restarts (default: the host name, sanitised).
    RunnerId,
    "runner",
    128
);

impl TurnId {
    /// The turn for an inbound message. Deterministic, so a replay of the same message (same chat,
    /// same message id) names the same turn and the dispatcher's KV create refuses a second one.
    pub fn for_message(chat: &ChatId, message_id: &str) -> TurnId {
        Self::digest(&[b"msg", chat.as_str().as_bytes(), message_id.as_bytes()])
    }

    /// A re-run of an ended turn is a new turn; `n` numbers the re-runs of one original.
    pub fn for_rerun(of: &TurnId, n: u32) -> TurnId {
        Self::digest(&[b"rerun", of.as_str().as_bytes(), n.to_string().as_bytes()])
    }

    fn digest(parts: &[&[u8]]) -> TurnId {
        let mut h = Sha256::new();
        for p in parts {
            // Length-prefix each part so ("ab","c") and ("a","bc") differ.
            h.update((p.len() as u64).to_be_bytes());
            h.update(p);
        }
        let d = h.finalize();
        let hex: String = d.iter().take(12).map(|b| format!("{b:02x}")).collect();
        TurnId(format!("t-{hex}"))
    }
}

impl RunnerId {
    /// Turn any host name into a valid runner id: a valid one is kept as it is; otherwise
    /// invalid characters become '-' and a short hash of the whole name is appended, so two
    /// names that differ only where they were cleaned (`a.b`, `a/b`) never share an id (a
    /// runner's restart reaps the containers of its id: a shared one would kill another's runs).
    pub fn sanitized(raw: &str) -> RunnerId {
        let valid = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
        if !raw.is_empty() && raw.len() <= Self::MAX_LEN && raw.chars().all(valid) {
            return RunnerId(raw.to_owned());
        }
        let digest = Sha256::digest(raw.as_bytes());
        let tag: String = digest.iter().take(4).map(|b| format!("{b:02x}")).collect();
        let mut s: String = raw
            .chars()
            .map(|c| if valid(c) { c } else { '-' })
            .take(Self::MAX_LEN - tag.len() - 1)
            .collect();
        if s.is_empty() {
            s.push_str("runner");
        }
        RunnerId(format!("{s}-{tag}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitized_runner_ids_keep_valid_names_and_never_collide() {
        assert_eq!(RunnerId::sanitized("host-1").as_str(), "host-1");
        let a = RunnerId::sanitized("a.b");
        let b = RunnerId::sanitized("a/b");
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("a-b-"), "{a}");
        assert!(RunnerId::new(a.as_str()).is_ok());
        let long = RunnerId::sanitized(&"x.".repeat(200));
        assert!(RunnerId::new(long.as_str()).is_ok(), "{long}");
        assert!(RunnerId::new(RunnerId::sanitized("").as_str()).is_ok());
    }

    #[test]
    fn chat_ids_follow_the_contract() {
        assert!(ChatId::new("abc_DEF-09").is_ok());
        assert!(ChatId::new("a".repeat(128)).is_ok());
        assert_eq!(
            ChatId::new("a".repeat(129)),
            Err(IdError::TooLong {
                kind: "chat",
                len: 129,
                max: 128
            })
        );
        assert_eq!(ChatId::new(""), Err(IdError::Empty { kind: "chat" }));
        for bad in ["a.b", "a b", "a*", "a>", "ü", "a/b"] {
            let err = ChatId::new(bad).expect_err(bad);
            assert!(err.to_string().contains("only A-Z"), "{err}");
        }
    }

    #[test]
    fn chat_id_deserialization_validates() {
        let ok: ChatId = serde_json::from_str("\"room-1\"").expect("valid");
        assert_eq!(ok.as_str(), "room-1");
        assert!(serde_json::from_str::<ChatId>("\"room.1\"").is_err());
    }

    #[test]
    fn turn_ids_are_deterministic_and_distinct() {
        let c = ChatId::new("c").expect("valid");
        let a = TurnId::for_message(&c, "m1");
        assert_eq!(a, TurnId::for_message(&c, "m1"));
        assert_ne!(a, TurnId::for_message(&c, "m2"));
        let c2 = ChatId::new("c2").expect("valid");
        assert_ne!(a, TurnId::for_message(&c2, "m1"));
        assert_ne!(TurnId::for_rerun(&a, 1), TurnId::for_rerun(&a, 2));
        assert!(TurnId::new(a.as_str()).is_ok());
    }

    #[test]
    fn runner_ids_are_sanitised() {
        let h = RunnerId::sanitized("host.example.com");
        assert!(h.as_str().starts_with("host-example-com-"), "{h}");
        assert_eq!(h, RunnerId::sanitized("host.example.com"), "stable");
        assert!(RunnerId::sanitized("").as_str().starts_with("runner-"));
    }
}
