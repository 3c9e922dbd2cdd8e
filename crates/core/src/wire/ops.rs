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
/// `turnpike.ops.stats` report them (sum them over coordinators for the cluster).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct CountersSnapshot {
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
    /// Inputs refused as dead letters.
    pub dead_lettered: u64,
    /// Turns queued far longer than expected.
    pub queued_long: u64,
    /// Runner events applied.
    pub events_applied: u64,
    /// Runner events that changed nothing (duplicates, superseded).
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

/// `to.field += from.field` for each counter kept both in total and over the last hour
/// ([`HourCounts`]'s fields, named once here), then for each `extra` field.
macro_rules! add_counts {
    ($to:expr, $from:expr $(, $extra:ident)*) => {
        add_counts!(@each $to, $from, turns_done, turns_failed, turns_gave_up, turns_killed,
            silent_turns, retries_scheduled, runner_lost $(, $extra)*)
    };
    (@each $to:expr, $from:expr, $($field:ident),+) => {
        $( $to.$field += $from.$field; )+
    };
}

impl CountersSnapshot {
    /// Add another process's counts: cluster figures are sums (each event is counted by the one
    /// coordinator that applied it). The sum's hour covers the shortest window added, the one
    /// that starts last.
    pub fn add(&mut self, other: &CountersSnapshot) {
        add_counts!(
            self,
            other,
            dead_lettered,
            queued_long,
            events_applied,
            events_unchanged
        );
        self.last_hour.add(&other.last_hour);
        self.window_start_ms = self.window_start_ms.max(other.window_start_ms);
    }
}

impl HourCounts {
    /// Add another process's counts over its hour.
    pub fn add(&mut self, other: &HourCounts) {
        add_counts!(self, other);
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
