//! Every payload that crosses NATS. Each carries `v`, the format version, so a later release can
//! still read what this one wrote; readers refuse a version newer than they know, with a clear error.
//!
//! The chat boundary ([`InboundMessage`], [`OutboundItem`]) is a public contract for chat adapters
//! in any language; the README documents it field by field.

use crate::ids::{ChatId, RunnerId, TurnId};
use crate::time::Timestamp;
use crate::FORMAT_VERSION;
use serde::{Deserialize, Serialize};

fn v1() -> u16 {
    FORMAT_VERSION
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Implemented by every versioned payload so the codec can check `v` in one place.
pub trait Versioned {
    fn version(&self) -> u16;
}

macro_rules! versioned {
    ($($t:ty),* $(,)?) => {
        $(impl Versioned for $t {
            fn version(&self) -> u16 { self.v }
        })*
    };
}

versioned!(
    OpsRequest,
    OpsReply,
    InboundMessage,
    WorkItem,
    AgentInput,
    RunnerEvent,
    OutboundItem,
    ChatRecord,
    ClaimRecord,
    RunnerPresence,
    crate::lifecycle::TurnRecord,
);

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    User,
    Bot,
    /// Written by Turnpike, not said by anyone: e.g. that earlier history was left out.
    Note,
}

/// One line of conversation history, snapshotted when the turn is created.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HistoryEntry {
    pub role: Role,
    pub text: String,
}

/// A turn attempt: the work item on `turnpike.work.run.<turn>`. Self-contained, so a runner never
/// needs to read turn state: the same message, attachments and history on every attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkItem {
    #[serde(default = "v1")]
    pub v: u16,
    pub turn: TurnId,
    pub chat: ChatId,
    pub attempt: u32,
    /// The attempt limit of this turn, `max(MAX_TURN_RETRY, 1)` as stored when it was created.
    pub max_attempts: u32,
    /// The message, whose text the agent's prompt is made from (see [`WorkItem::prompt`]): the
    /// text is carried once, not again as a prompt.
    pub message: InboundMessage,
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
}

/// The one JSON document an agent reads on stdin (then EOF).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AgentInput {
    #[serde(default = "v1")]
    pub v: u16,
    pub turn: TurnId,
    pub chat: ChatId,
    pub attempt: u32,
    pub max_attempts: u32,
    pub prompt: String,
    pub message: InboundMessage,
    pub history: Vec<HistoryEntry>,
    /// Paths of the attachment files as the agent sees them.
    pub attachments: Vec<String>,
}

impl WorkItem {
    /// The prompt the agent sees: the message text, behind the retry preamble from attempt 2 on.
    pub fn prompt(&self) -> String {
        crate::texts::prompt_for_attempt(&self.message.text, self.attempt, self.max_attempts)
    }
}

impl AgentInput {
    pub fn from_work(work: &WorkItem, attachment_paths: Vec<String>) -> Self {
        AgentInput {
            v: FORMAT_VERSION,
            turn: work.turn.clone(),
            chat: work.chat.clone(),
            attempt: work.attempt,
            max_attempts: work.max_attempts,
            prompt: work.prompt(),
            message: work.message.clone(),
            history: work.history.clone(),
            attachments: attachment_paths,
        }
    }
}

/// One line an agent writes on stdout.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentLine {
    /// A bot message for the chat.
    Message { text: String },
    /// Live progress.
    Status { text: String },
    /// The agent's own verdict on the run.
    Result {
        status: AgentStatus,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    Ok,
    Error,
}

/// How an attempt ended, as the runner observed it. Decided by the runner from the exit code, the
/// engine's OOM signals, its own timers and kills; the coordinator turns it into an outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitClass {
    /// Exit 0 and the agent did not report a failure.
    Clean,
    /// Exit 0, but the agent reported `{"type":"result","status":"error"}`.
    AgentFailed,
    /// The agent never ran: image missing, create/start refused, exit 125/126/127 before output.
    CouldNotStart,
    /// Killed by the kernel's OOM killer inside the memory limit.
    OomKilled,
    /// The run time limit expired and the runner stopped it.
    TimedOut,
    /// A non-zero exit code.
    Crashed,
    /// Killed by a signal nobody in Turnpike sent (e.g. someone's `docker kill`).
    Signaled,
    /// Stopped on an operator's kill request: recorded as killed, never an error.
    OperatorKilled,
    /// The runner holding the attempt died or was cut off (lease expired).
    RunnerLost,
    /// The container engine failed us (API error, time-out): the agent may have been fine.
    EngineError,
}

impl ExitClass {
    /// A death: the run was cut short for a reason a fresh container may not hit again.
    pub fn is_death(self) -> bool {
        matches!(
            self,
            ExitClass::OomKilled
                | ExitClass::TimedOut
                | ExitClass::Crashed
                | ExitClass::Signaled
                | ExitClass::RunnerLost
                | ExitClass::EngineError
        )
    }

    pub const ALL: [ExitClass; 10] = [
        ExitClass::Clean,
        ExitClass::AgentFailed,
        ExitClass::CouldNotStart,
        ExitClass::OomKilled,
        ExitClass::TimedOut,
        ExitClass::Crashed,
        ExitClass::Signaled,
        ExitClass::OperatorKilled,
        ExitClass::RunnerLost,
        ExitClass::EngineError,
    ];

    /// The wire spelling (as serde writes it), for logs, metrics labels and pages.
    pub fn as_str(self) -> &'static str {
        match self {
            ExitClass::Clean => "clean",
            ExitClass::AgentFailed => "agent_failed",
            ExitClass::CouldNotStart => "could_not_start",
            ExitClass::OomKilled => "oom_killed",
            ExitClass::TimedOut => "timed_out",
            ExitClass::Crashed => "crashed",
            ExitClass::Signaled => "signaled",
            ExitClass::OperatorKilled => "operator_killed",
            ExitClass::RunnerLost => "runner_lost",
            ExitClass::EngineError => "engine_error",
        }
    }
}

impl std::fmt::Display for ExitClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The runner's report of how an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ExitReport {
    pub class: ExitClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Error text: why it could not start, what the engine said, what the agent reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bot messages JetStream acknowledged on the chat's outbound subject for this attempt.
    pub messages_landed: u32,
    /// Where those messages are stored on the outbound stream (from each PubAck), in order; the
    /// runner's whole account, since its MessageLanded events may be handled after this report.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replies: Vec<u64>,
    pub ended_at: Timestamp,
    /// Who ran the attempt and when its work item was published: the report says it again
    /// because events are handled concurrently and the Started event may be applied after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<AttemptStart>,
}

/// The start of an attempt as its runner saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttemptStart {
    pub runner: RunnerId,
    pub published_at: Timestamp,
}

impl ExitReport {
    /// The report of an attempt that ended before its agent produced anything.
    pub fn without_output(class: ExitClass, error: impl Into<String>, ended_at: Timestamp) -> Self {
        ExitReport {
            class,
            exit_code: None,
            signal: None,
            error: Some(error.into()),
            messages_landed: 0,
            replies: vec![],
            ended_at,
            started: None,
        }
    }
}

/// What a runner says about an attempt, on `turnpike.events.<turn>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunnerEvent {
    #[serde(default = "v1")]
    pub v: u16,
    pub turn: TurnId,
    pub chat: ChatId,
    pub attempt: u32,
    pub runner: RunnerId,
    pub at: Timestamp,
    pub kind: RunnerEventKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunnerEventKind {
    /// The attempt was claimed and its container started. `published_at` is when the work item was
    /// stored in the work stream (for a retry: when its schedule fired).
    Started { published_at: Timestamp },
    /// A bot message landed (JetStream acked it on the outbound subject). `seq` counts from 1;
    /// `stream_seq` is where the outbound stream stored it (from the PubAck; absent from older
    /// runners).
    MessageLanded {
        seq: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream_seq: Option<u64>,
    },
    /// Live progress from the agent.
    Progress { text: String },
    /// The attempt ended.
    Exited { report: ExitReport },
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

/// An operator's request to the coordinators (`turnpike.ops.*`): `turn` for kill and rerun,
/// `chat` for clear; `by` names the operator for the record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpsRequest {
    #[serde(default = "v1")]
    pub v: u16,
    pub by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<ChatId>,
}

/// The coordinators' answer to an [`OpsRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpsReply {
    #[serde(default = "v1")]
    pub v: u16,
    pub ok: bool,
    pub message: String,
    /// The turn acted on (for rerun: the new turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnId>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// A coordinator's counters since it started, as `$SRV.STATS.turnpike-coordinator` and
/// `turnpike.ops.stats` report them (sum them over coordinators for the cluster).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CountersSnapshot {
    pub turns_done: u64,
    pub turns_failed: u64,
    pub turns_gave_up: u64,
    pub turns_killed: u64,
    pub silent_turns: u64,
    pub retries_scheduled: u64,
    pub runner_lost: u64,
    pub dead_lettered: u64,
    pub queued_long: u64,
    pub events_applied: u64,
    pub events_unchanged: u64,
    /// The same counts over the last hour, or since `window_start` when the process is younger.
    pub last_hour: HourCounts,
    /// Where `last_hour` starts (milliseconds since the epoch).
    pub window_start_ms: u64,
}

/// Counts over a trailing hour (per process; add them over coordinators).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HourCounts {
    pub turns_done: u64,
    pub turns_failed: u64,
    pub turns_gave_up: u64,
    pub turns_killed: u64,
    pub silent_turns: u64,
    pub retries_scheduled: u64,
    pub runner_lost: u64,
}

/// Who did an operator action, and when.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OperatorAction {
    pub by: String,
    pub at: Timestamp,
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
    pub reason: String,
}

/// The claims bucket value (key = `<turn>.<attempt>`): who runs an attempt. Created once, so two
/// runners never run the same attempt even when a work item is delivered twice.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimRecord {
    #[serde(default = "v1")]
    pub v: u16,
    pub turn: TurnId,
    pub attempt: u32,
    pub holder: ClaimHolder,
    pub at: Timestamp,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClaimHolder {
    /// A runner runs it.
    Runner { runner: RunnerId },
    /// The coordinator cancelled the attempt (operator kill) before any runner took it.
    Cancelled,
}

/// A runner's announcement in the runners bucket (key = runner id), refreshed with a TTL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunnerPresence {
    #[serde(default = "v1")]
    pub v: u16,
    pub runner: RunnerId,
    pub host: String,
    pub backend: String,
    pub slots: u32,
    pub slots_in_use: u32,
    pub version: String,
    pub at: Timestamp,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::Codec;

    #[test]
    fn exit_classes_display_as_serde_spells_them() {
        for c in ExitClass::ALL {
            assert_eq!(
                serde_json::to_value(c).expect("json"),
                serde_json::json!(c.to_string())
            );
        }
    }
    use serde::de::DeserializeOwned;
    use std::fmt::Debug;

    fn chat() -> ChatId {
        ChatId::new("chat-1").expect("valid")
    }
    fn turn() -> TurnId {
        TurnId::for_message(&chat(), "m1")
    }
    fn runner() -> RunnerId {
        RunnerId::new("runner-a").expect("valid")
    }
    fn inbound() -> InboundMessage {
        InboundMessage {
            v: FORMAT_VERSION,
            id: "m1".into(),
            chat: chat(),
            text: "hello ✓".into(),
            sender: Some("ann".into()),
            attachments: vec![Attachment {
                name: "report.pdf".into(),
                object: "att/t-1/report.pdf".into(),
            }],
        }
    }

    fn round_trip<T: Serialize + DeserializeOwned + Versioned + PartialEq + Debug>(value: T) {
        for codec in [Codec::Json, Codec::Msgpack] {
            let bytes = codec.encode(&value).expect("encodes");
            let back: T = codec.decode(&bytes).expect("decodes");
            assert_eq!(back, value, "{codec:?}");
        }
        // Every payload carries its format version.
        let json: serde_json::Value =
            serde_json::from_slice(&Codec::Json.encode(&value).expect("encodes")).expect("json");
        assert_eq!(json["v"], serde_json::json!(FORMAT_VERSION));
    }

    fn work() -> WorkItem {
        WorkItem {
            v: FORMAT_VERSION,
            turn: turn(),
            chat: chat(),
            attempt: 2,
            max_attempts: 3,
            message: inbound(),
            history: vec![
                HistoryEntry {
                    role: Role::User,
                    text: "q".into(),
                },
                HistoryEntry {
                    role: Role::Bot,
                    text: "a".into(),
                },
            ],
        }
    }

    #[test]
    fn every_message_round_trips_in_both_codecs() {
        round_trip(inbound());
        round_trip(work());
        round_trip(AgentInput::from_work(
            &work(),
            vec!["/turnpike/attachments/report.pdf".into()],
        ));
        let at = Timestamp(1_800_000_000_000);
        for kind in [
            RunnerEventKind::Started { published_at: at },
            RunnerEventKind::MessageLanded {
                seq: 1,
                stream_seq: Some(42),
            },
            RunnerEventKind::MessageLanded {
                seq: 2,
                stream_seq: None,
            },
            RunnerEventKind::Progress {
                text: "thinking".into(),
            },
        ]
        .into_iter()
        .chain(
            ExitClass::ALL
                .into_iter()
                .map(|class| RunnerEventKind::Exited {
                    report: ExitReport {
                        class,
                        exit_code: Some(137),
                        signal: Some(9),
                        error: Some("why".into()),
                        messages_landed: 1,
                        replies: vec![7],
                        ended_at: at,
                        started: Some(AttemptStart {
                            runner: runner(),
                            published_at: at,
                        }),
                    },
                }),
        ) {
            round_trip(RunnerEvent {
                v: FORMAT_VERSION,
                turn: turn(),
                chat: chat(),
                attempt: 1,
                runner: runner(),
                at,
                kind,
            });
        }
        for kind in [
            OutboundKind::Message,
            OutboundKind::Status,
            OutboundKind::Notice,
        ] {
            round_trip(OutboundItem {
                v: FORMAT_VERSION,
                kind,
                chat: chat(),
                turn: turn(),
                attempt: 1,
                text: "hi".into(),
                status_id: (kind == OutboundKind::Status).then(|| "status-x".into()),
                r#final: kind == OutboundKind::Status,
            });
        }
        round_trip(ChatRecord {
            v: FORMAT_VERSION,
            chat: chat(),
            live: Some(turn()),
            waiting: vec![turn()],
            history: vec![HistoryEntry {
                role: Role::User,
                text: "q".into(),
            }],
            history_dropped: 3,
            inbound_seq: 42,
            errored: Some(ChatError {
                turn: turn(),
                at,
                reason: "gave up".into(),
            }),
            cleared: vec![OperatorAction {
                by: "op".into(),
                at,
            }],
        });
        for holder in [
            ClaimHolder::Runner { runner: runner() },
            ClaimHolder::Cancelled,
        ] {
            round_trip(ClaimRecord {
                v: FORMAT_VERSION,
                turn: turn(),
                attempt: 1,
                holder,
                at,
            });
        }
        round_trip(RunnerPresence {
            v: FORMAT_VERSION,
            runner: runner(),
            host: "h".into(),
            backend: "docker".into(),
            slots: 4,
            slots_in_use: 1,
            version: "0.1.0".into(),
            at,
        });
    }

    #[test]
    fn outbound_json_matches_the_public_contract() {
        let item = OutboundItem {
            v: FORMAT_VERSION,
            kind: OutboundKind::Status,
            chat: chat(),
            turn: turn(),
            attempt: 2,
            text: "working".into(),
            status_id: Some("status-1".into()),
            r#final: false,
        };
        let json: serde_json::Value = serde_json::to_value(&item).expect("json");
        assert_eq!(
            json,
            serde_json::json!({"v": 1, "kind": "status", "chat": "chat-1", "turn": turn().as_str(),
                "attempt": 2, "text": "working", "status_id": "status-1"})
        );
    }

    #[test]
    fn agent_lines_parse_as_documented() {
        let m: AgentLine =
            serde_json::from_str(r#"{"type":"message","text":"hi"}"#).expect("message");
        assert_eq!(m, AgentLine::Message { text: "hi".into() });
        let r: AgentLine =
            serde_json::from_str(r#"{"type":"result","status":"error","error":"x"}"#)
                .expect("result");
        assert_eq!(
            r,
            AgentLine::Result {
                status: AgentStatus::Error,
                error: Some("x".into())
            }
        );
        assert!(serde_json::from_str::<AgentLine>(r#"{"type":"nope"}"#).is_err());
    }
}
