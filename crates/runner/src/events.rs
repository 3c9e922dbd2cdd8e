//! Runner events on the coordinator's subject: started, progress, each landed message, the exit.
//! Each is retried with the same dedup id, so a blip neither loses nor doubles one.

use crate::claim::{fence_out_and_count, Settled};
use crate::context::RunnerContext;
use tracing::warn;
use turnpike_core::subjects::{self, msg_id};
use turnpike_core::wire::{ExitReport, RunnerEvent, RunnerEventKind, WorkItem};
use turnpike_core::FORMAT_VERSION;
use turnpike_jetstream::{now, Publish};

/// What a runner event is about.
#[derive(Clone, Copy)]
pub(crate) struct WorkItemRef<'a> {
    turn: &'a turnpike_core::TurnId,
    chat: &'a turnpike_core::ChatId,
    attempt: u32,
}

/// Publish a runner event, retried (same dedup id) so a blip does not lose it.
pub(crate) async fn emit(ctx: &RunnerContext, work: &WorkItem, what: &str, kind: RunnerEventKind) {
    let _ = emit_for(ctx, work_ref(work), what, kind).await;
}

fn work_ref(work: &WorkItem) -> WorkItemRef<'_> {
    WorkItemRef {
        turn: &work.turn,
        chat: &work.chat,
        attempt: work.attempt,
    }
}

/// Publish, retrying what may pass; `Err` with the last failure if it was not published (a
/// failure no retry changes is not retried).
async fn emit_for(
    ctx: &RunnerContext,
    work: WorkItemRef<'_>,
    what: &str,
    kind: RunnerEventKind,
) -> Result<(), turnpike_jetstream::BusError> {
    let event = RunnerEvent {
        v: FORMAT_VERSION,
        turn: work.turn.clone(),
        chat: work.chat.clone(),
        attempt: work.attempt,
        runner: ctx.id.clone(),
        at: now(),
        kind,
    };
    let id = msg_id::event(work.turn, work.attempt, &ctx.id, what);
    let mut retries = crate::retries::Retries::event();
    loop {
        let publish = Publish::new(ctx.bus.codec, subjects::events(work.turn, &ctx.id), &event)
            .map(|p| {
                p.msg_id(&id)
                    .header(subjects::HDR_TURN, work.turn.as_str())
                    .header(subjects::HDR_ATTEMPT, &work.attempt.to_string())
            });
        let result = match publish {
            Ok(p) => p.send(&ctx.bus.js).await.map(|_| ()),
            Err(e) => Err(e),
        };
        let Err(e) = result else { return Ok(()) };
        if !e.is_transient() {
            warn!(error = %e, event = what, "runner event refused for good");
            return Err(e);
        }
        match retries.after_failure() {
            Some(wait) => {
                warn!(error = %e, event = what, "runner event not acknowledged; retrying");
                tokio::time::sleep(wait).await;
            }
            None => {
                warn!(
                    event = what,
                    "runner event lost after every try; the lease sweep will settle the attempt"
                );
                return Err(e);
            }
        }
    }
}

/// Report an attempt found as a leftover container after a restart: runner lost. Like the
/// coordinator's sweep, it first fences the attempt out (unless a later attempt holds the fence
/// already) and then counts what of it landed, so a reply that landed is never followed by a retry.
pub(crate) async fn report_orphan(
    ctx: &RunnerContext,
    turn: turnpike_core::TurnId,
    chat: turnpike_core::ChatId,
    attempt: u32,
) {
    let Settled::Landed(landed) = fence_out_and_count(ctx, &chat, &turn, attempt).await else {
        return;
    };
    let work_like = WorkItemRef {
        turn: &turn,
        chat: &chat,
        attempt,
    };
    let report =
        ExitReport::runner_lost("the runner restarted while the attempt ran", landed, now());
    self::report(ctx, work_like, report).await
}

pub(crate) async fn report_exit(ctx: &RunnerContext, work: &WorkItem, report: ExitReport) {
    self::report(ctx, work_ref(work), report).await
}

/// Publish an exit report. A report refused for good (it fits by construction; a server with a
/// lower limit than configured may still refuse it) is sent again without its error text,
/// which is all that can make it large: the coordinator needs the rest to decide.
async fn report(ctx: &RunnerContext, work: WorkItemRef<'_>, report: ExitReport) {
    let stripped = ExitReport {
        error: None,
        ..report.clone()
    };
    let sent = emit_for(ctx, work, "exited", RunnerEventKind::Exited { report }).await;
    if let Err(e) = sent {
        if !e.is_transient() {
            let _ = emit_for(
                ctx,
                work,
                "exited",
                RunnerEventKind::Exited { report: stripped },
            )
            .await;
        }
    }
}
