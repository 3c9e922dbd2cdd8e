//! The chat boundary: what chat adapters publish and read, and the chat record.

use super::*;

/// An attachment reference: the file lives in the JetStream object store under `object`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    /// The file name the agent sees.
    pub name: String,
    /// The object's name in the attachments store.
    pub object: String,
}

/// Published by a chat adapter on `turnpike.chat.in.<chat>`, with `Nats-Msg-Id` set to `id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InboundMessage {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// Unique per chat; the dedup key for replays.
    pub id: String,
    /// The chat.
    pub chat: ChatId,
    /// What the user said.
    pub text: String,
    /// Who said it, as the adapter names them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
    /// Files that come with it, already in the object store.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

impl InboundMessage {
    /// A text message with no attachments, from `sender`.
    pub fn new(
        chat: ChatId,
        id: impl Into<String>,
        text: impl Into<String>,
        sender: Option<String>,
    ) -> Self {
        InboundMessage {
            v: FORMAT_VERSION,
            id: id.into(),
            chat,
            text: text.into(),
            sender,
            attachments: Vec::new(),
        }
    }

    /// The turn this message becomes.
    pub fn turn(&self) -> TurnId {
        TurnId::for_message(&self.chat, &self.id)
    }

    /// May this message become a turn? Every field from outside is bounded (the id, the sender,
    /// each attachment's name and object), and so is the whole message, in encoded bytes: what
    /// it takes in a work item and a turn record, whatever its characters. A refusal quotes
    /// what it refuses cut short ([`crate::sizes::quote`]).
    pub fn check(&self, limits: &InboundLimits) -> Result<(), Refusal> {
        use crate::sizes::{self, quote, str_len};
        if self.id.is_empty() {
            return Err(Refusal::EmptyId);
        }
        let bounded = |len: usize, max: usize| (len <= max).then_some(()).ok_or((len, max));
        bounded(str_len(&self.id), sizes::MESSAGE_ID_MAX)
            .map_err(|(len, max)| Refusal::IdTooLong { len, max })?;
        if let Some(sender) = &self.sender {
            bounded(str_len(sender), sizes::SENDER_MAX)
                .map_err(|(len, max)| Refusal::SenderTooLong { len, max })?;
        }
        if self.attachments.len() > limits.attachments_max {
            return Err(Refusal::TooManyAttachments {
                count: self.attachments.len(),
                max: limits.attachments_max,
            });
        }
        // A chat names its uploads `<chat>/...`; another chat's object is not its to read.
        let own = format!("{}/", self.chat);
        for a in &self.attachments {
            if a.name.is_empty() {
                return Err(Refusal::EmptyName);
            }
            bounded(str_len(&a.name), sizes::ATTACHMENT_NAME_MAX).map_err(|(len, max)| {
                Refusal::NameTooLong {
                    name: quote(&a.name),
                    len,
                    max,
                }
            })?;
            bounded(str_len(&a.object), sizes::ATTACHMENT_OBJECT_MAX).map_err(|(len, max)| {
                Refusal::ObjectTooLong {
                    name: quote(&a.name),
                    len,
                    max,
                }
            })?;
            if !a.object.starts_with(&own) {
                return Err(Refusal::ForeignObject {
                    name: quote(&a.name),
                    object: quote(&a.object),
                    own: quote(&own),
                });
            }
        }
        let size = sizes::encoded_len(self);
        if size > limits.message_max {
            return Err(Refusal::TooLarge {
                size,
                max: limits.message_max,
            });
        }
        Ok(())
    }
}

/// The limits of the chat contract an inbound message is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InboundLimits {
    /// The whole message, encoded (`message_max_bytes`).
    pub message_max: usize,
    /// Attachments it may list (`attachments_max`).
    pub attachments_max: usize,
}

/// Why an inbound message was refused before it became a turn. Sizes are encoded bytes; what
/// came from outside is quoted cut short, so the notice and the dead letter stay small.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// An empty message id.
    #[error("the message has an empty id")]
    EmptyId,
    /// A message id too long.
    #[error("the message id is {len} bytes; the limit is {max}")]
    IdTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A sender name too long.
    #[error("the sender is {len} bytes; the limit is {max}")]
    SenderTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// More attachments than allowed.
    #[error("the message lists {count} attachments; the limit is {max}")]
    TooManyAttachments {
        /// How many it lists.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// An attachment with an empty name.
    #[error("an attachment has an empty name")]
    EmptyName,
    /// An attachment name too long.
    #[error("attachment name {name} is {len} bytes; the limit is {max}")]
    NameTooLong {
        /// The name, cut short.
        name: String,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An attachment object name too long.
    #[error("the object name of attachment {name} is {len} bytes; the limit is {max}")]
    ObjectTooLong {
        /// The name, cut short.
        name: String,
        /// The object name's length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An attachment outside this chat's part of the object store.
    #[error("attachment {name} (object {object}) is not under this chat's name {own}")]
    ForeignObject {
        /// The attachment's name, cut short.
        name: String,
        /// Its object, cut short.
        object: String,
        /// Where the chat's own objects are.
        own: String,
    },
    /// A message larger than allowed.
    #[error("the message is {size} bytes encoded; the limit is {max}")]
    TooLarge {
        /// The message, encoded.
        size: usize,
        /// The limit.
        max: usize,
    },
    /// A chat with its whole queue waiting already.
    #[error("the chat has {waiting} messages waiting; the limit is {max}")]
    QueueFull {
        /// Turns waiting already.
        waiting: usize,
        /// The limit.
        max: usize,
    },
}

/// Who a history line is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The user.
    User,
    /// The agent.
    Bot,
    /// Written by Turnpike, not said by anyone: e.g. that earlier history was left out.
    Note,
}

impl Role {
    /// The role as the wire spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Bot => "bot",
            Role::Note => "note",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of conversation history, snapshotted when the turn is created.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Who.
    pub role: Role,
    /// What was said.
    pub text: String,
}

/// What an output item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutboundKind {
    /// A bot message.
    Message,
    /// Live progress; adapters edit one message per `status_id` in place.
    Status,
    /// A notice from Turnpike itself (give-up, failure, silent turn).
    Notice,
}

impl OutboundKind {
    /// The kind as the wire (and the `Turnpike-Kind` header) spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            OutboundKind::Message => "message",
            OutboundKind::Status => "status",
            OutboundKind::Notice => "notice",
        }
    }
}

/// Published on `turnpike.chat.out.<chat>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OutboundItem {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// What it is.
    pub kind: OutboundKind,
    /// The chat.
    pub chat: ChatId,
    /// The turn it belongs to.
    pub turn: TurnId,
    /// The attempt that sent it.
    pub attempt: u32,
    /// The text.
    pub text: String,
    /// For status items: the id of the message an adapter edits in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_id: Option<String>,
    /// On the last status item of a turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub r#final: bool,
}

/// The chats bucket value (key = chat id): per-chat order, history, and the errored flag.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChatRecord {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The chat.
    pub chat: ChatId,
    /// The chat's one live turn (running, or pending a retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live: Option<TurnId>,
    /// Turns waiting for it, in arrival order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<TurnId>,
    /// The last `history_limit` user and bot messages of ended turns (no notices, no status).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<HistoryEntry>,
    /// Entries left out of `history` over the chat's life to keep it within its budget.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub history_dropped: u64,
    /// Stream sequence (in `TURNPIKE_CHAT_IN`) of the last inbound message of this chat that was
    /// taken (joined as a turn, or refused): a later one joins only when every earlier one was.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub inbound_seq: u64,
    /// Why the chat is flagged for operators, if it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errored: Option<ChatError>,
    /// Operators who cleared its flag before, and when.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cleared: Vec<OperatorAction>,
    /// The chat's workspace: the object of the last turn that saved one, and the one before.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<ChatWorkspace>,
}

/// Where a chat's workspace is kept (objects in `turnpike_workspaces`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChatWorkspace {
    /// What the chat's next turn starts from.
    pub current: String,
    /// What the turn that saved `current` started from, kept for operators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
}

/// Why a chat is flagged for operators.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChatError {
    /// The turn that flagged it.
    pub turn: TurnId,
    /// When.
    pub at: Timestamp,
    /// For people: what happened, in words.
    pub reason: String,
    /// For programs: the kind of failure (absent in records written before it existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<ChatErrorCause>,
}

/// Why a turn flagged its chat errored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatErrorCause {
    /// Every attempt of the budget died with no bot message.
    GaveUp,
    /// The agent could not be started at all.
    CouldNotStart,
    /// A step of the turn failed in a way no retry can change; the reason says which.
    PermanentError,
}
