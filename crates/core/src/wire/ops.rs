//! Operators' requests to the coordinators (`turnpike.ops.*`), their answers and counters, and
//! the kill request forwarded to a runner.

use super::*;

/// An operator's request to the coordinators (`turnpike.ops.*`): `turn` for kill and rerun,
/// `chat` for clear; `by` names the operator for the record.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpsRequest {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The operator asking.
    pub by: String,
    /// The turn, for kill and rerun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnId>,
    /// The chat, for clear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat: Option<ChatId>,
    /// The request's own id, chosen by whoever asks (a form when it is drawn, a command once
    /// per invocation): the same request sent again (a second click, a retry after a time-out)
    /// is answered as the first, and a re-run makes one turn, not two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The profile to move `chat` to (`turnpike.ops.profile`); none: back to the default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
}

impl OpsRequest {
    /// Kill or re-run `turn`, as `by`.
    pub fn turn(by: impl Into<String>, turn: TurnId) -> OpsRequest {
        OpsRequest {
            v: FORMAT_VERSION,
            by: by.into(),
            turn: Some(turn),
            chat: None,
            id: None,
            profile: None,
        }
    }

    /// This request with its own id ([`OpsRequest::id`]).
    pub fn with_id(self, id: impl Into<String>) -> OpsRequest {
        OpsRequest {
            id: Some(id.into()),
            ..self
        }
    }

    /// Clear `chat`'s errored flag, as `by`.
    pub fn chat(by: impl Into<String>, chat: ChatId) -> OpsRequest {
        OpsRequest {
            v: FORMAT_VERSION,
            by: by.into(),
            turn: None,
            chat: Some(chat),
            id: None,
            profile: None,
        }
    }

    /// Move `chat` to resource profile `profile` (none: back to the default), as `by`.
    pub fn profile(by: impl Into<String>, chat: ChatId, profile: Option<String>) -> OpsRequest {
        OpsRequest {
            profile,
            ..OpsRequest::chat(by, chat)
        }
    }

    /// As JSON (what the coordinators read).
    pub fn to_json(&self) -> Vec<u8> {
        // Strings only: always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Its values from outside within their bounds: they are kept in records.
    pub fn check(&self) -> Result<(), String> {
        use crate::sizes::{str_len, OPERATOR_MAX, REQUEST_ID_MAX};
        if self.by.is_empty() || str_len(&self.by) > OPERATOR_MAX {
            return Err(format!(
                "the operator name must be 1 to {OPERATOR_MAX} bytes"
            ));
        }
        if self
            .id
            .as_deref()
            .is_some_and(|id| str_len(id) > REQUEST_ID_MAX)
        {
            return Err(format!(
                "the request id may be at most {REQUEST_ID_MAX} bytes"
            ));
        }
        if self
            .profile
            .as_deref()
            .is_some_and(|p| p.is_empty() || str_len(p) > super::PROFILE_NAME_MAX)
        {
            return Err(format!(
                "a profile name is 1 to {} bytes",
                super::PROFILE_NAME_MAX
            ));
        }
        Ok(())
    }
}

/// The coordinators' answer to an [`OpsRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpsReply {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// Whether it was done.
    pub ok: bool,
    /// What happened, in words.
    pub message: String,
    /// The turn acted on (for rerun: the new turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<TurnId>,
    /// The turn's state afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// A coordinator's counters since it started, as `$SRV.STATS.turnpike-coordinator` and
/// `turnpike.ops.stats` report them (sum them over coordinators for the cluster). On the wire
/// the turn counts are fields of this object itself, beside the others.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CountersSnapshot {
    /// What turns came to, since the process started.
    #[serde(flatten)]
    pub turns: TurnCounts,
    /// Inputs refused as dead letters.
    pub dead_lettered: u64,
    /// Turns queued far longer than expected.
    pub queued_long: u64,
    /// Runner events applied.
    pub events_applied: u64,
    /// Runner events that changed nothing (duplicates, superseded).
    pub events_unchanged: u64,
    /// What turns came to over the last hour, or since `window_start_ms` when the process is
    /// younger.
    pub last_hour: TurnCounts,
    /// Where `last_hour` starts (milliseconds since the epoch).
    pub window_start_ms: u64,
}

/// What turns came to, counted by the coordinator that applied each: in total, and over a
/// trailing hour (per process; add them over coordinators).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TurnCounts {
    /// Turns that ended done.
    pub turns_done: u64,
    /// Turns that ended failed.
    pub turns_failed: u64,
    /// Turns that gave up.
    pub turns_gave_up: u64,
    /// Turns killed.
    pub turns_killed: u64,
    /// Turns that ended silent.
    pub silent_turns: u64,
    /// Retries scheduled.
    pub retries_scheduled: u64,
    /// Attempts declared lost with their runner.
    pub runner_lost: u64,
}

impl CountersSnapshot {
    /// Add another process's counts: cluster figures are sums (each event is counted by the one
    /// coordinator that applied it). The sum's hour covers the shortest window added, the one
    /// that starts last.
    pub fn add(&mut self, other: &CountersSnapshot) {
        self.turns.add(&other.turns);
        self.dead_lettered += other.dead_lettered;
        self.queued_long += other.queued_long;
        self.events_applied += other.events_applied;
        self.events_unchanged += other.events_unchanged;
        self.last_hour.add(&other.last_hour);
        self.window_start_ms = self.window_start_ms.max(other.window_start_ms);
    }
}

impl TurnCounts {
    /// Add another's counts.
    pub fn add(&mut self, other: &TurnCounts) {
        self.turns_done += other.turns_done;
        self.turns_failed += other.turns_failed;
        self.turns_gave_up += other.turns_gave_up;
        self.turns_killed += other.turns_killed;
        self.silent_turns += other.silent_turns;
        self.retries_scheduled += other.retries_scheduled;
        self.runner_lost += other.runner_lost;
    }
}

/// Who did an operator action, and when.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OperatorAction {
    /// The operator.
    pub by: String,
    /// When.
    pub at: Timestamp,
}

/// The `turnpike.ops.stats` answer of one coordinator.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsStats {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// This coordinator's counters since it started.
    pub counters: CountersSnapshot,
    /// Turns not yet ended, by state (from the live index: cluster-wide).
    pub live: std::collections::BTreeMap<String, u64>,
}

/// An operator's kill, forwarded by a coordinator to whichever runner runs the turn's attempt,
/// on `turnpike.control.kill.<turn>` (core NATS, JSON). The fence is what makes a kill stick;
/// this only makes the runner stop at once rather than at its next heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KillRequest {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// The turn.
    pub turn: TurnId,
    /// The attempt to stop; another attempt's runner ignores it.
    pub attempt: u32,
    /// The operator, for the runner's log.
    pub by: String,
}

impl KillRequest {
    /// As JSON (runners read it).
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings and numbers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Does a kill payload stop `attempt`? A request for another attempt does not; one that
    /// cannot be read (an older coordinator's bare attempt number is read as such) stops it:
    /// a kill is never lost to its format.
    pub fn targets(payload: &[u8], attempt: u32) -> bool {
        if let Ok(k) = serde_json::from_slice::<KillRequest>(payload) {
            return k.attempt == attempt;
        }
        std::str::from_utf8(payload)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .is_none_or(|a| a == attempt)
    }
}

/// A `turnpike.ops.live` request: one page of the live turns, newest first, as the
/// coordinators' read model holds them (no record read per turn).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveQuery {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// Only turns in this state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TurnState>,
    /// Only turns created at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// Turns to skip (of those that match, newest first).
    #[serde(default)]
    pub offset: usize,
    /// Turns to answer with, at most.
    pub limit: usize,
}

/// A live turn as the operators' lists show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveTurn {
    /// The turn.
    pub turn: TurnId,
    /// Its chat.
    pub chat: ChatId,
    /// Its state.
    pub state: TurnState,
    /// Its current attempt.
    pub attempt: u32,
    /// Its budget of attempts.
    pub max_attempts: u32,
    /// The runner of its current attempt, once one started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<RunnerId>,
    /// When its current attempt started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Timestamp>,
    /// When its pending retry is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_due: Option<Timestamp>,
    /// When it was created.
    pub created_at: Timestamp,
}

impl LiveTurn {
    /// What the lists show of `record`.
    pub fn of(record: &crate::TurnRecord) -> Self {
        let current = record.attempts.iter().rev().find(|a| a.n == record.attempt);
        LiveTurn {
            turn: record.turn.clone(),
            chat: record.chat.clone(),
            state: record.state,
            attempt: record.attempt,
            max_attempts: record.max_attempts,
            runner: current.and_then(|a| a.runner.clone()),
            started_at: current.and_then(|a| a.started_at),
            next_attempt_due: record.next_attempt_due,
            created_at: record.created_at,
        }
    }

    /// Does it match `query`'s filters?
    pub fn matches(&self, query: &LiveQuery) -> bool {
        query.state.is_none_or(|s| s == self.state)
            && query.since.is_none_or(|t| self.created_at >= t)
    }
}

/// The answer to a [`LiveQuery`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LivePage {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// Live turns that match, in all.
    pub total: usize,
    /// The page asked for, newest first.
    pub turns: Vec<LiveTurn>,
}

impl LivePage {
    /// The page `query` asks for of `turns`: those that match, newest first (then by id).
    pub fn of<'a>(turns: impl Iterator<Item = &'a LiveTurn>, query: &LiveQuery) -> Self {
        let matching: Vec<&LiveTurn> = turns.filter(|t| t.matches(query)).collect();
        LivePage {
            v: FORMAT_VERSION,
            total: matching.len(),
            turns: page(
                matching,
                |a, b| {
                    b.created_at
                        .cmp(&a.created_at)
                        .then_with(|| a.turn.cmp(&b.turn))
                },
                query.offset,
                query.limit,
            ),
        }
    }
}

/// Items `offset..offset + limit` of `items` in `order` (a total order: ties broken by id).
/// Only the page and what comes before it are sorted: a selection (linear) puts them first, so
/// a page of 100,000 live turns costs a pass over them, not a sort of them all.
fn page<T: Clone>(
    mut items: Vec<&T>,
    order: impl Fn(&&T, &&T) -> std::cmp::Ordering,
    offset: usize,
    limit: usize,
) -> Vec<T> {
    let end = offset.saturating_add(limit).min(items.len());
    if end == 0 {
        return Vec::new();
    }
    if end < items.len() {
        items.select_nth_unstable_by(end - 1, &order);
        items.truncate(end);
    }
    items.sort_unstable_by(&order);
    items.into_iter().skip(offset).cloned().collect()
}

/// A `turnpike.ops.errored` request: one page of the chats flagged errored, most recently
/// flagged first, as the coordinators' read model holds them (no read of every chat record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErroredQuery {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// Only chats flagged at or after this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Timestamp>,
    /// Chats to skip (of those that match, most recent first).
    #[serde(default)]
    pub offset: usize,
    /// Chats to answer with, at most.
    pub limit: usize,
}

/// A chat flagged errored, as the operators' lists show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErroredChat {
    /// The chat.
    pub chat: ChatId,
    /// Why, when and by which turn it is flagged.
    pub error: ChatError,
    /// The operator who cleared its flag last, before it was flagged again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleared_last: Option<OperatorAction>,
}

impl ErroredChat {
    /// What the lists show of `record`, if it is flagged.
    pub fn of(record: &ChatRecord) -> Option<Self> {
        Some(ErroredChat {
            chat: record.chat.clone(),
            error: record.errored.clone()?,
            cleared_last: record.cleared.last().cloned(),
        })
    }
}

/// The answer to an [`ErroredQuery`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErroredPage {
    /// Format version (`v`) of this payload; absent means 1 (docs/protocol.md).
    #[serde(default = "v1")]
    pub v: u16,
    /// Chats flagged that match, in all.
    pub total: usize,
    /// The page asked for, most recently flagged first.
    pub chats: Vec<ErroredChat>,
}

impl ErroredPage {
    /// The page `query` asks for of `chats`: those that match, most recently flagged first
    /// (then by chat).
    pub fn of<'a>(chats: impl Iterator<Item = &'a ErroredChat>, query: &ErroredQuery) -> Self {
        let matching: Vec<&ErroredChat> = chats
            .filter(|c| query.since.is_none_or(|t| c.error.at >= t))
            .collect();
        ErroredPage {
            v: FORMAT_VERSION,
            total: matching.len(),
            chats: page(
                matching,
                |a, b| {
                    b.error
                        .at
                        .cmp(&a.error.at)
                        .then_with(|| a.chat.cmp(&b.chat))
                },
                query.offset,
                query.limit,
            ),
        }
    }
}
