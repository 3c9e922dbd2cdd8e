//! Where an owed attempt is on its way to a runner (the work stream), and whether a claimed
//! attempt's exit is already reported (the events stream): what the sweep reads before it
//! decides that an attempt was lost or must be dispatched again.

use futures::StreamExt;
use std::collections::HashSet;
use turnpike_core::subjects;
use turnpike_core::wire::{RunnerEvent, RunnerEventKind, WorkItem};
use turnpike_core::{RunnerId, TurnId};
use turnpike_jetstream::{decode, BusError};

use crate::Bus;

/// Where attempt `attempt` of `turn` is in the work stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnItsWay {
    /// Held by the scheduler until its due time (only a retry is scheduled).
    pub scheduled: bool,
    /// Published (or fired), waiting in the queue for a runner.
    pub queued: bool,
}

/// Look for attempt `attempt` of `turn` in the work stream: its schedule (only if
/// `retry`), else its work item waiting in the queue.
pub async fn on_its_way(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
    retry: bool,
) -> Result<OnItsWay, BusError> {
    let stream = bus
        .js
        .get_stream_no_info(subjects::STREAM_WORK)
        .await
        .map_err(|e| BusError::kv("open work stream", e))?;
    let scheduled = retry
        && stream
            .get_last_raw_message_by_subject(&subjects::work_schedule(turn, attempt))
            .await
            .is_ok();
    let mut queued = false;
    if !scheduled {
        if let Ok(m) = stream
            .get_last_raw_message_by_subject(&subjects::work_run(turn))
            .await
        {
            queued = decode::<WorkItem>(Some(&m.headers), &m.payload)
                .is_ok_and(|w| w.attempt == attempt);
        }
    }
    Ok(OnItsWay { scheduled, queued })
}

/// The turns with a work item waiting in the queue, all of them in one paged listing of the
/// work stream's subjects (no read per turn): how the sweep finds whether many queued attempts
/// are on their way at the cost of one request per hundred thousand.
pub async fn queued_turns(bus: &Bus) -> Result<HashSet<TurnId>, BusError> {
    let stream = bus
        .js
        .get_stream_no_info(subjects::STREAM_WORK)
        .await
        .map_err(|e| BusError::kv("open work stream", e))?;
    let mut listing = stream
        .info_with_subjects(subjects::WORK_RUN_ALL)
        .await
        .map_err(|e| BusError::kv("list the work queue", e))?;
    let prefix = subjects::WORK_RUN_ALL.trim_end_matches('>');
    let mut turns = HashSet::new();
    while let Some(subject) = listing.next().await {
        let (subject, count) = subject.map_err(|e| BusError::kv("list the work queue", e))?;
        if count == 0 {
            continue;
        }
        if let Some(turn) = subject
            .strip_prefix(prefix)
            .and_then(|t| TurnId::new(t).ok())
        {
            turns.insert(turn);
        }
    }
    Ok(turns)
}

/// Is the attempt's exit, as its claimant reported it, already in the events stream (waiting
/// to be applied)? `false` when it cannot be read.
pub async fn exit_reported(bus: &Bus, turn: &TurnId, attempt: u32, runner: &RunnerId) -> bool {
    let Ok(stream) = bus.js.get_stream_no_info(subjects::STREAM_EVENTS).await else {
        return false;
    };
    let Ok(last) = stream
        .get_last_raw_message_by_subject(&subjects::events(turn, runner))
        .await
    else {
        return false;
    };
    matches!(
        decode::<RunnerEvent>(Some(&last.headers), &last.payload),
        Ok(RunnerEvent { attempt: a, kind: RunnerEventKind::Exited { .. }, .. }) if a == attempt
    )
}
