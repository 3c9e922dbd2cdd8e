//! Operator kills, heard on one subscription for the whole runner and routed to the runs they
//! target. One subscription made at start rather than one per attempt: no SUB and UNSUB per
//! attempt (each one also carried to every server of a cluster), and a run hears kills from the
//! moment it registers, which it does before its claim. The fence still catches any kill this
//! plain-NATS subscription misses.

use crate::stop::{request, Stop};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tracing::info;
use turnpike_core::exit::StopReason;
use turnpike_core::wire::KillRequest;
use turnpike_core::{subjects, TurnId};

/// A registered run: its attempt and where its stop reasons go.
type Run = (u32, Arc<Stop>);

/// The runs that may be killed now, by turn.
#[derive(Default)]
pub(crate) struct Routes(Mutex<HashMap<TurnId, Vec<Run>>>);

/// A run's registration; removed when dropped.
pub(crate) struct Registered<'a> {
    routes: &'a Routes,
    turn: TurnId,
    stop: Arc<Stop>,
}

impl Routes {
    /// Route kills of `turn`'s `attempt` to `stop` until the returned guard is dropped.
    pub(crate) fn register(&self, turn: &TurnId, attempt: u32, stop: Arc<Stop>) -> Registered<'_> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(turn.clone())
            .or_default()
            .push((attempt, stop.clone()));
        Registered {
            routes: self,
            turn: turn.clone(),
            stop,
        }
    }

    /// Does this runner run `turn`'s `attempt` now (registered, not yet ended)?
    pub(crate) fn is_running(&self, turn: &str, attempt: u32) -> bool {
        let Ok(turn) = TurnId::new(turn) else {
            return false;
        };
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&turn)
            .is_some_and(|runs| runs.iter().any(|(a, _)| *a == attempt))
    }

    /// Stop the runs a kill on `subject` with `payload` targets; returns how many.
    pub(crate) fn deliver(&self, subject: &str, payload: &[u8]) -> usize {
        let Some(turn) = subject
            .strip_prefix(subjects::KILL_ALL.trim_end_matches('>'))
            .and_then(|t| TurnId::new(t).ok())
        else {
            return 0;
        };
        let routes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stopped = 0;
        for (attempt, stop) in routes.get(&turn).into_iter().flatten() {
            if KillRequest::targets(payload, *attempt) {
                info!(turn_id = %turn, attempt, "operator kill received");
                request(stop, StopReason::Operator);
                stopped += 1;
            }
        }
        stopped
    }
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        let mut routes = self.routes.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(runs) = routes.get_mut(&self.turn) {
            runs.retain(|(_, s)| !Arc::ptr_eq(s, &self.stop));
            if runs.is_empty() {
                routes.remove(&self.turn);
            }
        }
    }
}

/// Route every kill heard on `sub` until it ends (the runner's client closed).
pub(crate) async fn route(routes: Arc<Routes>, mut sub: async_nats::Subscriber) {
    while let Some(m) = sub.next().await {
        routes.deliver(m.subject.as_str(), &m.payload);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::watch;

    fn turn(s: &str) -> TurnId {
        TurnId::new(s).expect("turn id")
    }

    #[test]
    fn a_kill_stops_the_runs_of_its_turn_and_attempt_only_while_registered() {
        let routes = Routes::default();
        let (a, a_rx) = watch::channel(None);
        let (b, b_rx) = watch::channel(None);
        let (a, b) = (Arc::new(a), Arc::new(b));
        let t1 = turn("t-000000000000000000000001");
        let t2 = turn("t-000000000000000000000002");
        let reg_a = routes.register(&t1, 2, a.clone());
        let _reg_b = routes.register(&t2, 1, b.clone());
        let kill = |t: &TurnId, attempt: u32| {
            let request = KillRequest {
                v: 1,
                turn: t.clone(),
                attempt,
                by: "op".into(),
            };
            routes.deliver(&subjects::kill(t), &request.to_json())
        };
        // Another attempt of the same turn, a subject that names no turn: nothing stops.
        assert_eq!(kill(&t1, 1), 0);
        assert_eq!(routes.deliver("turnpike.control.kill.", b"2"), 0);
        assert_eq!(routes.deliver("turnpike.control.other.x", b"2"), 0);
        assert_eq!(*a_rx.borrow(), None);
        assert_eq!(kill(&t1, 2), 1);
        assert_eq!(*a_rx.borrow(), Some(StopReason::Operator));
        assert_eq!(*b_rx.borrow(), None, "another turn's run is left alone");
        drop(reg_a);
        assert_eq!(kill(&t1, 2), 0, "an ended run is no longer routed to");
        assert!(!routes.0.lock().expect("lock").contains_key(&t1));
    }
}
