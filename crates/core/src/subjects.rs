//! The one place where subject, stream, consumer, bucket, key and dedup-id names are built.
//! Everything is under `turnpike.` so operators can filter it with `nats sub 'turnpike.>'`.

use crate::fence::FenceWriter;
use crate::ids::{ChatId, RunnerId, TurnId};

/// The first token of every subject.
pub const PREFIX: &str = "turnpike";

// Streams.
/// Inbound chat messages.
pub const STREAM_CHAT_IN: &str = "TURNPIKE_CHAT_IN";
/// What chats are told: bot messages, statuses, notices.
pub const STREAM_CHAT_OUT: &str = "TURNPIKE_CHAT_OUT";
/// Work items, published now or scheduled.
pub const STREAM_WORK: &str = "TURNPIKE_WORK";
/// Runner events (started, progress, exited).
pub const STREAM_EVENTS: &str = "TURNPIKE_EVENTS";
/// Dead letters.
pub const STREAM_DEAD: &str = "TURNPIKE_DEAD";

// Durable consumers.
/// The dispatcher's, on the inbound stream.
pub const CONSUMER_DISPATCHER: &str = "dispatcher";
/// The runners', on the work stream (shared by every runner).
pub const CONSUMER_RUNNERS: &str = "runners";
/// The coordinators', on the events stream.
pub const CONSUMER_COORDINATOR: &str = "coordinator";

// KV buckets and the object store.
/// Turn records, by turn id.
pub const BUCKET_TURNS: &str = "turnpike_turns";
/// Chat records, by chat id.
pub const BUCKET_CHATS: &str = "turnpike_chats";
/// Attempt claims, `<turn>.<attempt>`.
pub const BUCKET_CLAIMS: &str = "turnpike_claims";
/// KV bucket: the resource profile each chat runs with (key = chat id, value = profile name).
pub const BUCKET_PROFILES: &str = "turnpike_profiles";
/// Runner leases, `<turn>.<attempt>.<runner>`.
pub const BUCKET_LEASES: &str = "turnpike_leases";
/// The live index: turns not yet ended.
pub const BUCKET_LIVE: &str = "turnpike_live";
/// Runner presence, by runner id.
pub const BUCKET_RUNNERS: &str = "turnpike_runners";
/// Dashboard sessions ended before their time (a logout), by nonce.
pub const BUCKET_SESSIONS: &str = "turnpike_sessions";
/// Attachments, `<chat>/<message>/<file>`.
pub const OBJECTS_ATTACHMENTS: &str = "turnpike_attachments";
/// Chat workspaces, `<chat>/<turn>/<attempt>` (the attempt that saved it).
pub const OBJECTS_WORKSPACES: &str = "turnpike_workspaces";

// Wildcards for stream subjects and consumer filters.
/// Every chat's inbound messages.
pub const CHAT_IN_ALL: &str = "turnpike.chat.in.>";
/// Every chat's output.
pub const CHAT_OUT_ALL: &str = "turnpike.chat.out.>";
/// Every turn's fence.
pub const FENCE_ALL: &str = "turnpike.fence.>";
/// Work items to run now.
pub const WORK_RUN_ALL: &str = "turnpike.work.run.>";
/// Work items scheduled for later.
pub const WORK_SCHEDULE_ALL: &str = "turnpike.work.schedule.>";
/// Every runner event.
pub const EVENTS_ALL: &str = "turnpike.events.>";
/// Every dead letter.
pub const DEAD_ALL: &str = "turnpike.dead.>";
/// Every kill sent to runners.
pub const KILL_ALL: &str = "turnpike.control.kill.>";

// Headers Turnpike sets so operators can filter and readers can route without decoding.
/// The turn a message is about.
pub const HDR_TURN: &str = "Turnpike-Turn";
/// The attempt a message is about.
pub const HDR_ATTEMPT: &str = "Turnpike-Attempt";
/// What kind of output item a message is (`message`, `status`, `notice`).
pub const HDR_KIND: &str = "Turnpike-Kind";
/// Why a dead letter was refused.
pub const HDR_DEAD_REASON: &str = "Turnpike-Dead-Reason";
/// Which role refused a dead letter.
pub const HDR_DEAD_SOURCE: &str = "Turnpike-Dead-Source";

// Operator requests, served by the coordinators (NATS service `turnpike-coordinator`).
/// Kill a turn.
pub const OPS_KILL: &str = "turnpike.ops.kill";
/// Clear a chat's errored flag.
pub const OPS_CLEAR: &str = "turnpike.ops.clear";
/// Move a chat to another resource profile.
pub const OPS_PROFILE: &str = "turnpike.ops.profile";
/// Forget a chat's workspace (its next turn starts empty) and delete its versions.
pub const OPS_WORKSPACE_RESET: &str = "turnpike.ops.workspace-reset";
/// Re-run an ended turn.
pub const OPS_RERUN: &str = "turnpike.ops.rerun";
/// A coordinator's counters.
pub const OPS_STATS: &str = "turnpike.ops.stats";
/// The cluster at a glance, from a coordinator's read model (kept by watches: no read per turn).
pub const OPS_STATUS: &str = "turnpike.ops.status";
/// A page of the live turns, from a coordinator's read model.
pub const OPS_LIVE: &str = "turnpike.ops.live";
/// A page of the chats flagged errored, from a coordinator's read model.
pub const OPS_ERRORED: &str = "turnpike.ops.errored";
/// The coordinators' NATS service name (`nats micro info`).
pub const OPS_SERVICE: &str = "turnpike-coordinator";

/// Where a chat adapter publishes a chat's inbound messages.
pub fn chat_in(chat: &ChatId) -> String {
    format!("{PREFIX}.chat.in.{chat}")
}

/// Where a chat's output is published.
pub fn chat_out(chat: &ChatId) -> String {
    format!("{PREFIX}.chat.out.{chat}")
}

/// Every attempt marker of a turn, in the chat-out stream: the fence is the last of them. Each
/// claim (and each "attempt lost" or "turn killed" decision) appends one, and bot messages are
/// published on the condition that the last sequence on this filter is still the one their
/// attempt saw, so a superseded attempt's output is refused.
pub fn fence(turn: &TurnId) -> String {
    format!("{PREFIX}.fence.{turn}.>")
}

/// Where `writer` appends its markers on `turn`'s fence: `turnpike.fence.<turn>.runner.<id>` for
/// a runner, `turnpike.fence.<turn>.service` for a coordinator or dispatcher. Each NATS user may
/// append only under its own name, so the subject says who wrote a marker.
pub fn fence_marker(turn: &TurnId, writer: &FenceWriter) -> String {
    match writer {
        FenceWriter::Runner(runner) => format!("{PREFIX}.fence.{turn}.runner.{runner}"),
        FenceWriter::Service => format!("{PREFIX}.fence.{turn}.service"),
    }
}

/// The turn and writer a marker's subject names; `None` for a subject of any other shape.
pub fn parse_fence_marker(subject: &str) -> Option<(TurnId, FenceWriter)> {
    let rest = subject.strip_prefix(PREFIX)?.strip_prefix(".fence.")?;
    let (turn, writer) = rest.split_once('.')?;
    let writer = match writer.split_once('.') {
        Some(("runner", id)) => FenceWriter::Runner(RunnerId::new(id).ok()?),
        None if writer == "service" => FenceWriter::Service,
        _ => return None,
    };
    Some((TurnId::new(turn).ok()?, writer))
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

/// Where `runner` reports on `turn`. Each runner's NATS user may publish only on subjects that
/// name it, so the subject, never the payload, says who sent an event.
pub fn events(turn: &TurnId, runner: &RunnerId) -> String {
    format!("{PREFIX}.events.{turn}.{runner}")
}

/// Every runner's events of one turn (a filter).
pub fn events_of(turn: &TurnId) -> String {
    format!("{PREFIX}.events.{turn}.*")
}

/// The turn and runner an event's subject names; `None` for a subject of any other shape.
pub fn parse_events(subject: &str) -> Option<(TurnId, RunnerId)> {
    let rest = subject.strip_prefix(PREFIX)?.strip_prefix(".events.")?;
    let (turn, runner) = rest.split_once('.')?;
    Some((TurnId::new(turn).ok()?, RunnerId::new(runner).ok()?))
}

/// Where a kill of the turn is sent to its runner.
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

/// The leases-bucket key of `runner`'s lease on one attempt: only that runner's NATS user may
/// write it, so no runner can keep another's attempt alive.
pub fn lease_key(turn: &TurnId, attempt: u32, runner: &RunnerId) -> String {
    format!("{turn}.{attempt}.{runner}")
}

/// JetStream dedup ids (`Nats-Msg-Id`), derived from turn and attempt so a replay never doubles.
pub mod msg_id {
    use crate::ids::{RunnerId, TurnId};

    /// A work item's dedup id.
    pub fn work(turn: &TurnId, attempt: u32) -> String {
        format!("work.{turn}.{attempt}")
    }
    /// A bot message's dedup id.
    pub fn bot_message(turn: &TurnId, attempt: u32, seq: u32) -> String {
        format!("msg.{turn}.{attempt}.{seq}")
    }
    /// A status item's dedup id.
    pub fn status(turn: &TurnId, attempt: u32, seq: u32) -> String {
        format!("status.{turn}.{attempt}.{seq}")
    }
    /// The dedup id of a turn's final status.
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
    /// Per runner: one runner cannot take another's dedup id and so drop its event.
    pub fn event(turn: &TurnId, attempt: u32, runner: &RunnerId, what: &str) -> String {
        format!("ev.{turn}.{attempt}.{runner}.{what}")
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

    #[test]
    fn an_events_subject_names_its_turn_and_runner() {
        let t = TurnId::new("t-1").expect("valid");
        let r = RunnerId::new("r_2-x").expect("valid");
        assert_eq!(parse_events(&events(&t, &r)), Some((t.clone(), r.clone())));
        assert!(events(&t, &r).starts_with(EVENTS_ALL.trim_end_matches('>')));
        for bad in [
            "turnpike.events.t-1",
            "turnpike.events.t-1.r.x",
            "turnpike.events..r",
            "turnpike.events.t-1.",
            "turnpike.fence.t-1.r",
            "other.events.t-1.r",
        ] {
            assert_eq!(parse_events(bad), None, "{bad}");
        }
        assert_eq!(lease_key(&t, 2, &r), "t-1.2.r_2-x");
    }

    #[test]
    fn a_fence_markers_subject_names_its_writer() {
        let t = TurnId::new("t-1").expect("valid");
        let r = RunnerId::new("r-2").expect("valid");
        for writer in [FenceWriter::Runner(r.clone()), FenceWriter::Service] {
            let subject = fence_marker(&t, &writer);
            assert_eq!(parse_fence_marker(&subject), Some((t.clone(), writer)));
            assert!(subject.starts_with(fence(&t).trim_end_matches('>')));
            assert!(subject.starts_with(FENCE_ALL.trim_end_matches('>')));
        }
        for bad in [
            "turnpike.fence.t-1",
            "turnpike.fence.t-1.runner",
            "turnpike.fence.t-1.runner.a.b",
            "turnpike.fence.t-1.service.x",
            "turnpike.fence.t-1.killed",
            "turnpike.fence.t.1.service",
            "turnpike.events.t-1.service",
        ] {
            assert_eq!(parse_fence_marker(bad), None, "{bad}");
        }
    }
}
