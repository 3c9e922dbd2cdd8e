//! One attempt on the wire: the work item, what the agent reads and writes, how it exited, the
//! runner events, claims and runner presence.

use super::*;

/// A turn attempt: the work item on `turnpike.work.run.<turn>`. Self-contained, so a runner never
/// needs to read turn state: the same message, attachments and history on every attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct WorkItem {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The turn.
    pub turn: TurnId,
    /// Its chat.
    pub chat: ChatId,
    /// This attempt, from 1.
    pub attempt: u32,
    /// The attempt limit of this turn, `max(MAX_TURN_RETRY, 1)` as stored when it was created.
    pub max_attempts: u32,
    /// The message, whose text the agent's prompt is made from (see [`WorkItem::prompt`]): the
    /// text is carried once, not again as a prompt.
    pub message: InboundMessage,
    /// The chat's history when the turn was created: the same on every attempt.
    #[serde(default)]
    pub history: Vec<HistoryEntry>,
    /// The resource profile to run it with: its chat's when this attempt was dispatched
    /// (`None`: the deployment's default). At most [`PROFILE_NAME_MAX`] bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The chat's workspace when this attempt was dispatched (its object in
    /// `turnpike_workspaces`), restored into the run when its profile has a workspace; `None`:
    /// empty. The same for every attempt of a turn: a chat runs one turn at a time, and only a
    /// turn's own clean end saves a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// The longest profile name.
pub const PROFILE_NAME_MAX: usize = 64;
/// The longest name of a workspace object (`<chat>/<turn>/<attempt>`: a chat id of 128, a turn
/// id, an attempt number and room to spare).
pub const WORKSPACE_OBJECT_MAX: usize = 256;

/// The resource profile an attempt ran with, as its runner applied it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ProfileUsed {
    /// Its name.
    pub name: String,
    /// The memory limit, in bytes.
    pub memory_limit: u64,
}

/// The one JSON document an agent reads on stdin (then EOF): its attempt's work item (its
/// fields at the top of the document: `v`, `turn`, `chat`, `attempt`, `max_attempts`, `message`,
/// `history`), with the prompt made for this attempt and where its attachments are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AgentInput {
    /// The attempt: which turn, chat and try this run is, the message and the history before it.
    #[serde(flatten)]
    pub work: WorkItem,
    /// What the agent is asked: the message text, behind the retry preamble from attempt 2 on.
    pub prompt: String,
    /// Paths of the attachment files as the agent sees them.
    pub attachments: Vec<String>,
    /// When the run will be stopped (its time limit), by the clock of the host it runs on: an
    /// agent that posts a summary before then has replied; one stopped mid-thought has not.
    pub deadline: Timestamp,
}

impl WorkItem {
    /// The prompt the agent sees: the message text, behind the retry preamble from attempt 2 on.
    pub fn prompt(&self) -> String {
        crate::texts::prompt_for_attempt(&self.message.text, self.attempt, self.max_attempts)
    }
}

impl AgentInput {
    /// The input of `work`'s attempt, its attachments at `attachment_paths`, stopped at
    /// `deadline`.
    pub fn from_work(work: &WorkItem, attachment_paths: Vec<String>, deadline: Timestamp) -> Self {
        AgentInput {
            work: work.clone(),
            prompt: work.prompt(),
            attachments: attachment_paths,
            deadline,
        }
    }
}

/// One line an agent writes on stdout.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentLine {
    /// A bot message for the chat.
    Message {
        /// The message.
        text: String,
    },
    /// Live progress.
    Status {
        /// What the agent is doing, in a few words.
        text: String,
    },
    /// The agent's own verdict on the run.
    Result {
        /// `ok` or `error`.
        status: AgentStatus,
        /// What went wrong, for operators.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
}

/// An agent's verdict on its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentStatus {
    /// It did what was asked.
    Ok,
    /// It failed, and says so.
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

    /// Every class.
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
    /// How it ended.
    pub class: ExitClass,
    /// The agent's exit code, if it exited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// The signal that ended it, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Error text: why it could not start, what the engine said, what the agent reported; cut to
    /// [`crate::sizes::ERROR_MAX`] encoded bytes ([`ExitReport::bounded`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Bot messages JetStream acknowledged on the chat's outbound subject for this attempt.
    pub messages_landed: u32,
    /// Where those messages are stored on the outbound stream (from their PubAcks): the first and
    /// the last sequence, never one entry per message. (Older runners sent every sequence, as
    /// `replies`; it is read as its span.)
    #[serde(
        default,
        alias = "replies",
        deserialize_with = "ReplySpan::deserialize_lenient",
        skip_serializing_if = "Option::is_none"
    )]
    pub reply_span: Option<ReplySpan>,
    /// The agent said more than an attempt may land (`attempt_messages_max` or
    /// `attempt_bytes_max`): the rest was not delivered, and the chat was told so.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub output_cut: bool,
    /// When it ended, by the runner's clock (for operators; decisions use the server's).
    pub ended_at: Timestamp,
    /// Who ran the attempt and when its work item was published: the report says it again
    /// because events are handled concurrently and the Started event may be applied after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<AttemptStart>,
    /// The workspace the run left at its clean exit, stored but not yet the chat's (its object
    /// in `turnpike_workspaces`): it becomes the chat's only if this exit is the current
    /// attempt's and ends the turn cleanly; otherwise it is discarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
}

/// Where an attempt's bot messages are stored on the chat-out stream: its first and last stream
/// sequence. The attempt's messages lie between, on its chat's subject (among other items of
/// the chat: statuses, notices), so a reader scans that range for them; the count is
/// `messages_landed`. Bounded, whatever the agent said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct ReplySpan {
    /// The first message's stream sequence.
    pub first: u64,
    /// The last message's stream sequence.
    pub last: u64,
}

impl ReplySpan {
    /// The span of one message.
    pub fn at(seq: u64) -> Self {
        ReplySpan {
            first: seq,
            last: seq,
        }
    }

    /// `span` grown to cover `seq`.
    pub fn with(span: Option<ReplySpan>, seq: u64) -> ReplySpan {
        match span {
            None => ReplySpan::at(seq),
            Some(s) => ReplySpan {
                first: s.first.min(seq),
                last: s.last.max(seq),
            },
        }
    }

    /// The smallest span covering both.
    pub fn union(a: Option<ReplySpan>, b: Option<ReplySpan>) -> Option<ReplySpan> {
        match (a, b) {
            (Some(a), Some(b)) => Some(ReplySpan {
                first: a.first.min(b.first),
                last: a.last.max(b.last),
            }),
            (a, b) => a.or(b),
        }
    }

    /// Reads `{"first":…,"last":…}`, or the list of sequences older writers stored (its span;
    /// none if empty), without holding the list.
    pub fn deserialize_lenient<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<ReplySpan>, D::Error> {
        struct Lenient;
        impl<'de> serde::de::Visitor<'de> for Lenient {
            type Value = Option<ReplySpan>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a reply span {first, last} or a list of stream sequences")
            }
            fn visit_none<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(None)
            }
            fn visit_some<D: serde::Deserializer<'de>>(
                self,
                d: D,
            ) -> Result<Self::Value, D::Error> {
                d.deserialize_any(Lenient)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut span = None;
                while let Some(s) = seq.next_element::<u64>()? {
                    span = Some(ReplySpan::with(span, s));
                }
                Ok(span)
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let (mut first, mut last) = (None, None);
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "first" => first = Some(map.next_value::<u64>()?),
                        "last" => last = Some(map.next_value::<u64>()?),
                        _ => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                    }
                }
                match (first, last) {
                    (Some(first), Some(last)) => Ok(Some(ReplySpan { first, last })),
                    _ => Err(serde::de::Error::missing_field("first/last")),
                }
            }
        }
        d.deserialize_any(Lenient)
    }
}

/// What an attempt landed, as counted: how many bot messages, and where they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Landed {
    /// How many.
    pub count: u32,
    /// Where they are.
    pub span: Option<ReplySpan>,
}

impl Landed {
    /// One more message, stored at `seq`.
    pub fn push(&mut self, seq: u64) {
        self.count += 1;
        self.span = Some(ReplySpan::with(self.span, seq));
    }
}

/// The start of an attempt as its runner saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AttemptStart {
    /// The runner that ran it.
    pub runner: RunnerId,
    /// When its work item was stored in the work stream.
    pub published_at: Timestamp,
    /// When its agent started, by the runner's clock (`None`: it never did). Without it a report
    /// applied before its Started event would leave the attempt with no start time for good.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// The resource profile it ran with (`None`: a runner from before profiles, or an attempt
    /// that never got as far as choosing one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<ProfileUsed>,
}

impl ExitReport {
    /// The report of an attempt that ended before its agent produced anything.
    pub fn without_output(class: ExitClass, error: impl Into<String>, ended_at: Timestamp) -> Self {
        ExitReport::runner_lost(error, Landed::default(), ended_at).with_class(class)
    }

    /// An attempt whose runner is gone (its lease lapsed, or it restarted mid-run), after its
    /// fence moved: `landed` is what it landed, final from then on.
    pub fn runner_lost(error: impl Into<String>, landed: Landed, ended_at: Timestamp) -> Self {
        ExitReport {
            workspace: None,
            class: ExitClass::RunnerLost,
            exit_code: None,
            signal: None,
            error: Some(error.into()),
            messages_landed: landed.count,
            reply_span: landed.span,
            output_cut: false,
            ended_at,
            started: None,
        }
    }

    /// The report with its error text cut to [`crate::sizes::ERROR_MAX`] encoded bytes: what a
    /// runner publishes and a turn record keeps, whatever the agent or the engine said.
    pub fn bounded(mut self) -> Self {
        if let Some(e) = &self.error {
            if let std::borrow::Cow::Owned(cut) = crate::sizes::cut(e, crate::sizes::ERROR_MAX) {
                self.error = Some(cut);
            }
        }
        // A name longer than any workspace object's is not one: no workspace.
        if self
            .workspace
            .as_ref()
            .is_some_and(|w| w.len() > WORKSPACE_OBJECT_MAX)
        {
            self.workspace = None;
        }
        if let Some(p) = self.started.as_mut().and_then(|s| s.profile.as_mut()) {
            if let std::borrow::Cow::Owned(cut) = crate::sizes::cut(&p.name, PROFILE_NAME_MAX) {
                p.name = cut;
            }
        }
        self
    }

    fn with_class(self, class: ExitClass) -> Self {
        ExitReport { class, ..self }
    }
}

/// What a runner says about an attempt, on `turnpike.events.<turn>.<runner>` (the subject, not
/// this payload, says which runner spoke: each runner may publish only under its own id).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunnerEvent {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The turn.
    pub turn: TurnId,
    /// Its chat.
    pub chat: ChatId,
    /// The attempt.
    pub attempt: u32,
    /// The runner speaking.
    pub runner: RunnerId,
    /// When, by the runner's clock.
    pub at: Timestamp,
    /// What happened.
    pub kind: RunnerEventKind,
}

/// What a runner event says.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunnerEventKind {
    /// The attempt was claimed and its container started. `published_at` is when the work item was
    /// stored in the work stream (for a retry: when its schedule fired).
    Started {
        /// When the work item was stored.
        published_at: Timestamp,
    },
    /// A bot message landed (JetStream acked it on the outbound subject). `seq` counts from 1;
    /// `stream_seq` is where the outbound stream stored it (from the PubAck; absent from older
    /// runners).
    MessageLanded {
        /// The message's number in the attempt, from 1.
        seq: u32,
        /// Where the outbound stream stored it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stream_seq: Option<u64>,
    },
    /// Live progress from the agent.
    Progress {
        /// The progress text.
        text: String,
    },
    /// The attempt ended.
    Exited {
        /// How it ended.
        report: ExitReport,
    },
}

/// The claims bucket value (key = `<turn>.<attempt>`): who runs an attempt. Created once, so two
/// runners never run the same attempt even when a work item is delivered twice.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimRecord {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The turn.
    pub turn: TurnId,
    /// The attempt.
    pub attempt: u32,
    /// Who holds it.
    pub holder: ClaimHolder,
    /// When it was written.
    pub at: Timestamp,
    /// Unique to the one handling of a work delivery that wrote it: a claim whose
    /// acknowledgement was lost is read back, and it is this handling's own only if the token
    /// is its own (the same runner handling a second delivery of the attempt is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl ClaimRecord {
    /// Is `stored` the claim this one is, written by the same hand?
    pub fn is_same_claim(&self, stored: &ClaimRecord) -> bool {
        self.turn == stored.turn
            && self.attempt == stored.attempt
            && self.holder == stored.holder
            && self.token.is_some()
            && self.token == stored.token
    }
}

/// Who holds a claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ClaimHolder {
    /// A runner runs it.
    Runner {
        /// The runner.
        runner: RunnerId,
    },
    /// The coordinator cancelled the attempt (operator kill) before any runner took it.
    Cancelled,
}

/// A runner's announcement in the runners bucket (key = runner id), refreshed with a TTL.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RunnerPresence {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The runner.
    pub runner: RunnerId,
    /// The host it runs on.
    pub host: String,
    /// Its backend: `docker` or `process`.
    pub backend: String,
    /// Attempts it runs at once at most.
    pub slots: u32,
    /// Attempts it runs now.
    pub slots_in_use: u32,
    /// Its Turnpike version.
    pub version: String,
    /// When it said so, by its clock.
    pub at: Timestamp,
}
