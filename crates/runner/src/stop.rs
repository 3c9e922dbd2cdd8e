//! Why a run stops. The causes come from many places (an operator's kill on the wire, the time
//! limit, the runner draining, the lease, the fence); they meet in one watch channel that the
//! backend waits on, and [`StopReason::stands`] decides which one holds when several come.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use turnpike_core::exit::StopReason;
use turnpike_core::TurnId;

/// The channel a run's stop reasons go into.
pub(crate) type Stop = watch::Sender<Option<StopReason>>;

/// Ask the run to stop for `why`; returns whether that changed the reason that stands.
pub(crate) fn request(stop: &Stop, why: StopReason) -> bool {
    stop.send_if_modified(|current| {
        let stands = StopReason::stands(*current, why);
        let changed = *current != Some(stands);
        *current = Some(stands);
        changed
    })
}

/// Why a run whose fence moved from `ours` must stop, as the fence says now.
pub(crate) async fn fence_moved(bus: &turnpike_store::Bus, turn: &TurnId, ours: u64) -> StopReason {
    match turnpike_store::fence::last(bus, turn).await {
        Ok(last) => turnpike_core::fence::check(last.as_ref(), ours)
            .map_or(StopReason::Superseded, StopReason::fenced),
        // Refused, so not ours any more, whichever it was.
        Err(_) => StopReason::Superseded,
    }
}

/// The tasks that turn a run's outside causes (the time limit, the runner's hard stop) into stop
/// requests; operator kills reach the run through [`crate::kills`]. Stopped when dropped.
pub(crate) struct Causes(Vec<tokio::task::JoinHandle<()>>);

impl Causes {
    /// Stop the run after `limit` (the run's time limit), or when `hard_stop` is cancelled.
    pub(crate) fn watch(
        limit: Duration,
        hard_stop: &CancellationToken,
        stop: &Arc<Stop>,
    ) -> Causes {
        let timer = {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(limit).await;
                request(&stop, StopReason::Timeout);
            })
        };
        let drain = {
            let stop = stop.clone();
            let token = hard_stop.clone();
            tokio::spawn(async move {
                token.cancelled().await;
                request(&stop, StopReason::Drain);
            })
        };
        Causes(vec![timer, drain])
    }
}

impl Drop for Causes {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_changes_the_reason_only_when_it_stands() {
        let (stop, rx) = watch::channel(None);
        assert!(request(&stop, StopReason::Timeout));
        assert!(
            !request(&stop, StopReason::Drain),
            "the first lesser reason stands"
        );
        assert_eq!(*rx.borrow(), Some(StopReason::Timeout));
        assert!(request(&stop, StopReason::Operator));
        assert!(!request(&stop, StopReason::Superseded));
        assert!(
            !request(&stop, StopReason::Operator),
            "the same reason again changes nothing"
        );
        assert_eq!(*rx.borrow(), Some(StopReason::Operator));
    }
}
