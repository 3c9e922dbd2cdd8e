//! Steps before an agent starts (taking the fence, fetching attachments) are tried again while
//! what failed may pass: nothing has run yet, and an attempt spent on a leader election would be
//! one less for the agent.

use tokio::sync::watch;
use tracing::debug;
use turnpike_core::exit::{classify, StopReason};
use turnpike_core::wire::ExitReport;
use turnpike_jetstream::now;

/// Why a step before the agent's start gave up: its last error, and the stop that ended the
/// tries if one did.
pub(crate) struct GaveUp<E> {
    pub(crate) error: E,
    pub(crate) stopped: Option<StopReason>,
}

impl<E: std::fmt::Display> GaveUp<E> {
    /// The attempt's exit: as the stop says (a lost lease is a lost runner, a kill a kill), or
    /// an engine failure if the tries ran out first.
    pub(crate) fn report(&self, what: &str) -> ExitReport {
        use turnpike_core::wire::ExitClass;
        let reason = format!("{what}: {}", self.error);
        let class = match self.stopped {
            Some(why) => classify(
                &turnpike_core::exit::RawExit {
                    stopped_by: Some(why),
                    ..Default::default()
                },
                None,
                false,
            ),
            None => ExitClass::EngineError,
        };
        ExitReport::without_output(class, reason, now())
    }
}

/// Run `step` until it succeeds, fails in a way no retry changes (`transient` says which), the
/// attempt is stopped (a kill, its lease lost: NATS down for as long blocks the lease too), or
/// `patience` has passed (the run's time limit: the longest an attempt may take); between tries,
/// a doubling pause.
pub(crate) async fn patiently<T, E, F, Fut>(
    stop: &watch::Receiver<Option<StopReason>>,
    patience: std::time::Duration,
    mut step: F,
    transient: impl Fn(&E) -> bool,
) -> Result<T, GaveUp<E>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let until = tokio::time::Instant::now() + patience;
    let mut pauses = turnpike_core::backoff::Backoff::doubling(
        std::time::Duration::from_millis(50),
        std::time::Duration::from_secs(1),
    );
    let mut stop = stop.clone();
    loop {
        let error = match step().await {
            Ok(t) => return Ok(t),
            Err(e) => e,
        };
        let stopped = *stop.borrow();
        if !transient(&error) || stopped.is_some() || tokio::time::Instant::now() >= until {
            return Err(GaveUp { error, stopped });
        }
        debug!(%error, "not yet; trying again");
        tokio::select! {
            _ = tokio::time::sleep(pauses.wait()) => {}
            _ = stop.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn transient(e: &&str) -> bool {
        e.starts_with("transient")
    }

    #[tokio::test]
    async fn a_step_that_fails_transiently_is_tried_until_it_succeeds() {
        let (_stop, stop_rx) = watch::channel(None);
        let mut tries = 0;
        let got = patiently(
            &stop_rx,
            Duration::from_secs(60),
            || {
                tries += 1;
                let now = tries;
                async move {
                    if now < 3 {
                        Err("transient: no leader")
                    } else {
                        Ok(now)
                    }
                }
            },
            transient,
        )
        .await;
        assert!(matches!(got, Ok(3)));
    }

    #[tokio::test]
    async fn a_permanent_failure_is_not_tried_again() {
        let (_stop, stop_rx) = watch::channel(None);
        let mut tries = 0;
        let got: Result<(), _> = patiently(
            &stop_rx,
            Duration::from_secs(60),
            || {
                tries += 1;
                async { Err("refused") }
            },
            transient,
        )
        .await;
        let gave_up = got.expect_err("gave up");
        assert_eq!(
            (gave_up.error, gave_up.stopped, tries),
            ("refused", None, 1)
        );
        assert_eq!(
            gave_up.report("x").class,
            turnpike_core::wire::ExitClass::EngineError
        );
    }

    #[tokio::test]
    async fn a_stop_ends_the_tries_and_says_how_the_attempt_ended() {
        for (why, class) in [
            (
                StopReason::LeaseLost,
                turnpike_core::wire::ExitClass::RunnerLost,
            ),
            (
                StopReason::Operator,
                turnpike_core::wire::ExitClass::OperatorKilled,
            ),
        ] {
            let (stop, stop_rx) = watch::channel(None);
            let mut tries = 0;
            let got: Result<(), _> = patiently(
                &stop_rx,
                Duration::from_secs(3600),
                || {
                    tries += 1;
                    if tries == 2 {
                        stop.send_replace(Some(why));
                    }
                    async { Err("transient: timed out") }
                },
                transient,
            )
            .await;
            let gave_up = got.expect_err("gave up");
            assert_eq!(gave_up.stopped, Some(why));
            assert_eq!(tries, 2);
            assert_eq!(gave_up.report("cannot take the fence").class, class);
        }
    }
}
