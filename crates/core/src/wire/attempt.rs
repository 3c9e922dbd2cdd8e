//! One attempt on the wire: the work item, what the agent reads and writes, how it exited, the
//! runner events, claims and runner presence.

use super::*;

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
    /// When its agent started, by the runner's clock (`None`: it never did). Without it a report
    /// applied before its Started event would leave the attempt with no start time for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
}

impl ExitReport {
    /// The report of an attempt that ended before its agent produced anything.
    pub fn without_output(class: ExitClass, error: impl Into<String>, ended_at: Timestamp) -> Self {
        ExitReport::runner_lost(error, Vec::new(), ended_at).with_class(class)
    }

    /// An attempt whose runner is gone (its lease lapsed, or it restarted mid-run), after its
    /// fence moved: `replies` are the stream sequences of what it landed, final from then on.
    pub fn runner_lost(error: impl Into<String>, replies: Vec<u64>, ended_at: Timestamp) -> Self {
        ExitReport {
            class: ExitClass::RunnerLost,
            exit_code: None,
            signal: None,
            error: Some(error.into()),
            messages_landed: replies.len() as u32,
            replies,
            ended_at,
            started: None,
        }
    }

    fn with_class(self, class: ExitClass) -> Self {
        ExitReport { class, ..self }
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
