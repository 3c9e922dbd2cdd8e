//! Runs that nobody will end any more, found on this host by their labels and removed: a
//! container whose start an engine time-out cut off and that started later (running beside the
//! attempt's retry, with nobody reading it), a process of a run that left its process group and
//! outlived it, the runs of a runner that crashed and never came back. Every `lease`, each
//! runner looks at what its host holds:
//! - what this runner started for an attempt it no longer runs: removed;
//! - what another runner started: removed once that runner is gone (the process backend: its
//!   process is dead; Docker: its presence lapsed and the attempt holds no live lease).

use crate::backend::{tree, Backend};
use crate::context::RunnerContext;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

/// Look every `every` until `shutdown`.
pub(crate) async fn run(ctx: Arc<RunnerContext>, every: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let reaped = reap_once(&ctx).await;
        if reaped > 0 {
            warn!(reaped, "removed runs nobody would end");
        }
    }
}

/// One look; how many runs (processes, containers) were removed.
pub(crate) async fn reap_once(ctx: &Arc<RunnerContext>) -> usize {
    match &ctx.backend {
        Backend::Process(p) => {
            let (me, routes) = (p.instance().clone(), ctx.kills.clone());
            let doomed = move |tag: &tree::Tag| {
                if me.started(tag) {
                    !routes.is_running(&tag.turn, tag.attempt)
                } else {
                    tree::runner_gone(tag)
                }
            };
            tokio::task::spawn_blocking(move || tree::kill_where(doomed))
                .await
                .unwrap_or(0)
        }
        Backend::Docker(d) => {
            let containers = match d.containers().await {
                Ok(c) => c,
                Err(e) => {
                    debug!(error = %e, "cannot list containers to reap");
                    return 0;
                }
            };
            let mut reaped = 0;
            for c in containers {
                if stray(ctx, d, &c).await {
                    warn!(container = %c.id, turn_id = ?c.turn, attempt = ?c.attempt, runner = ?c.runner, "removing a run nobody will end");
                    d.remove_container(&c.id).await;
                    reaped += 1;
                }
            }
            reaped
        }
    }
}

/// Is this container a run nobody will end?
async fn stray(
    ctx: &RunnerContext,
    d: &crate::backend::DockerBackend,
    c: &crate::backend::Container,
) -> bool {
    let (Some(turn), Some(attempt)) = (&c.turn, c.attempt) else {
        return false;
    };
    if d.started(c) {
        return !ctx.kills.is_running(turn.as_str(), attempt);
    }
    // Another runner's (or an earlier life of this one's, which its restart reaps): only of
    // this deployment (whose runners this one can see), once that runner is gone and the
    // attempt holds no live lease.
    if !d.same_deployment(c) {
        return false;
    }
    // Young: its runner may be alive but just back from a freeze (its presence not yet
    // renewed, the attempt's lease written a heartbeat after its claim). Found by the nemesis: a
    // runner resumed from a pause had the container it had just created removed before its
    // start. A runner that is really gone leaves it for one more look.
    let grace = ctx.config.lease + ctx.config.heartbeat;
    let age = c
        .created
        .map(|at| turnpike_jetstream::now().millis() as i64 / 1000 - at);
    if age.is_none_or(|secs| secs < grace.as_secs() as i64) {
        return false;
    }
    let Some(runner) = &c.runner else {
        return false;
    };
    if runner == ctx.id.as_str() {
        return false;
    }
    let Ok(runner) = turnpike_core::RunnerId::new(runner.as_str()) else {
        return false;
    };
    if !matches!(
        turnpike_store::runners::is_present(&ctx.bus, &runner).await,
        Ok(false)
    ) {
        return false;
    }
    matches!(
        turnpike_store::leases::state(&ctx.bus, turn, attempt, &runner).await,
        Ok(turnpike_store::leases::Lease::Lapsed(_) | turnpike_store::leases::Lease::Absent)
    )
}
