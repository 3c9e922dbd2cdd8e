//! The one place where subject, stream, consumer, bucket, key and dedup-id names are built.
//! Everything is under `turnpike.` so operators can filter it with `nats sub 'turnpike.>'`.

use crate::ids::{ChatId, TurnId};

pub const PREFIX: &str = "turnpike";

// Streams.
pub const STREAM_CHAT_IN: &str = "TURNPIKE_CHAT_IN";
pub const STREAM_CHAT_OUT: &str = "TURNPIKE_CHAT_OUT";
pub const STREAM_WORK: &str = "TURNPIKE_WORK";
pub const STREAM_EVENTS: &str = "TURNPIKE_EVENTS";
pub const STREAM_DEAD: &str = "TURNPIKE_DEAD";

// Durable consumers.
pub const CONSUMER_DISPATCHER: &str = "dispatcher";
pub const CONSUMER_RUNNERS: &str = "runners";
pub const CONSUMER_COORDINATOR: &str = "coordinator";

// KV buckets and the object store.
pub const BUCKET_TURNS: &str = "turnpike_turns";
pub const BUCKET_CHATS: &str = "turnpike_chats";
pub const BUCKET_CLAIMS: &str = "turnpike_claims";
pub const BUCKET_LEASES: &str = "turnpike_leases";
pub const BUCKET_LIVE: &str = "turnpike_live";
pub const BUCKET_RUNNERS: &str = "turnpike_runners";
/// Dashboard sessions ended before their time (a logout), by nonce.
pub const BUCKET_SESSIONS: &str = "turnpike_sessions";
pub const OBJECTS_ATTACHMENTS: &str = "turnpike_attachments";

// Wildcards for stream subjects and consumer filters.
pub const CHAT_IN_ALL: &str = "turnpike.chat.in.>";
pub const CHAT_OUT_ALL: &str = "turnpike.chat.out.>";
pub const FENCE_ALL: &str = "turnpike.fence.>";
pub const WORK_RUN_ALL: &str = "turnpike.work.run.>";
pub const WORK_SCHEDULE_ALL: &str = "turnpike.work.schedule.>";
pub const EVENTS_ALL: &str = "turnpike.events.>";
pub const DEAD_ALL: &str = "turnpike.dead.>";
pub const KILL_ALL: &str = "turnpike.control.kill.>";

// Headers Turnpike sets so operators can filter and readers can route without decoding.
pub const HDR_TURN: &str = "Turnpike-Turn";
pub const HDR_ATTEMPT: &str = "Turnpike-Attempt";
pub const HDR_KIND: &str = "Turnpike-Kind";
pub const HDR_DEAD_REASON: &str = "Turnpike-Dead-Reason";
pub const HDR_DEAD_SOURCE: &str = "Turnpike-Dead-Source";

// Operator requests, served by the coordinators (NATS service `turnpike-coordinator`).
pub const OPS_KILL: &str = "turnpike.ops.kill";
pub const OPS_CLEAR: &str = "turnpike.ops.clear";
pub const OPS_RERUN: &str = "turnpike.ops.rerun";
pub const OPS_STATS: &str = "turnpike.ops.stats";
pub const OPS_SERVICE: &str = "turnpike-coordinator";

pub fn chat_in(chat: &ChatId) -> String {
    format!("{PREFIX}.chat.in.{chat}")
}

pub fn chat_out(chat: &ChatId) -> String {
    format!("{PREFIX}.chat.out.{chat}")
}

/// The per-turn attempt marker in the chat-out stream. Each claim (and the coordinator's "attempt
/// lost" decision) publishes here; bot messages are published on the condition that this subject's
/// last sequence is still the one their attempt saw, so a superseded attempt's output is refused.
pub fn fence(turn: &TurnId) -> String {
    format!("{PREFIX}.fence.{turn}")
}

/// Work items the runners' consumer takes.
pub fn work_run(turn: &TurnId) -> String {
    format!("{PREFIX}.work.run.{turn}")
}

/// One schedule subject per turn attempt (a second schedule on a subject replaces the first).
/// Outside the runners' filter: acking a schedule message would delete the schedule.
pub fn work_schedule(turn: &TurnId, attempt: u32) -> String {
    format!("{PREFIX}.work.schedule.{turn}.{attempt}")
}

pub fn events(turn: &TurnId) -> String {
    format!("{PREFIX}.events.{turn}")
}

pub fn kill(turn: &TurnId) -> String {
    format!("{PREFIX}.control.kill.{turn}")
}

/// Dead letters, by the role that refused the input (`dispatcher`, `coordinator`, `runner`).
pub fn dead_letter(source: &str) -> String {
    format!("{PREFIX}.dead.{source}")
}

/// The claims-bucket key of one attempt.
pub fn claim_key(turn: &TurnId, attempt: u32) -> String {
    format!("{turn}.{attempt}")
}

/// JetStream dedup ids (`Nats-Msg-Id`), derived from turn and attempt so a replay never doubles.
pub mod msg_id {
    use crate::ids::TurnId;

    pub fn work(turn: &TurnId, attempt: u32) -> String {
        format!("work.{turn}.{attempt}")
    }
    pub fn bot_message(turn: &TurnId, attempt: u32, seq: u32) -> String {
        format!("msg.{turn}.{attempt}.{seq}")
    }
    pub fn status(turn: &TurnId, attempt: u32, seq: u32) -> String {
        format!("status.{turn}.{attempt}.{seq}")
    }
    pub fn status_final(turn: &TurnId) -> String {
        format!("status.{turn}.final")
    }
    /// The one marker an attempt's output gets when it is cut at its limits.
    pub fn output_cut(turn: &TurnId, attempt: u32) -> String {
        format!("cut.{turn}.{attempt}")
    }
    /// A turn gets at most one notice, whatever attempt sent it.
    pub fn notice(turn: &TurnId) -> String {
        format!("notice.{turn}")
    }
    pub fn event(turn: &TurnId, attempt: u32, what: &str) -> String {
        format!("ev.{turn}.{attempt}.{what}")
    }
}

/// The status id a chat adapter edits in place: one per turn.
pub fn status_id(turn: &TurnId) -> String {
    format!("status-{turn}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_subjects_are_outside_the_runners_filter() {
        let t = TurnId::new("t-1").expect("valid");
        assert!(work_run(&t).starts_with(WORK_RUN_ALL.trim_end_matches('>')));
        assert!(!work_schedule(&t, 2).starts_with(WORK_RUN_ALL.trim_end_matches('>')));
        assert!(work_schedule(&t, 2).starts_with(WORK_SCHEDULE_ALL.trim_end_matches('>')));
        assert_eq!(claim_key(&t, 3), "t-1.3");
    }
}
