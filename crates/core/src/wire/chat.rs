//! The chat boundary: what chat adapters publish and read, and the chat record.

use super::*;

/// An attachment reference: the file lives in the JetStream object store under `object`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Attachment {
    pub name: String,
    pub object: String,
}

/// Published by a chat adapter on `turnpike.chat.in.<chat>`, with `Nats-Msg-Id` set to `id`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct InboundMessage {
    #[serde(default = "v1")]
    pub v: u16,
    /// Unique per chat; the dedup key for replays.
    pub id: String,
    pub chat: ChatId,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
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
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
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
    pub role: Role,
    pub text: String,
}

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
    #[serde(default = "v1")]
    pub v: u16,
    pub kind: OutboundKind,
    pub chat: ChatId,
    pub turn: TurnId,
    pub attempt: u32,
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_id: Option<String>,
    /// On the last status item of a turn.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub r#final: bool,
}

/// The chats bucket value (key = chat id): per-chat order, history, and the errored flag.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChatRecord {
    #[serde(default = "v1")]
    pub v: u16,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errored: Option<ChatError>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cleared: Vec<OperatorAction>,
}

/// Why a chat is flagged for operators.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChatError {
    pub turn: TurnId,
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
}
