//! This coordinator's counters and timings in the Prometheus text format (served on
//! `metrics_listen` by the binary).
//!
//! Every series counts what this process did since it started, so coordinators' series add up:
//! one event is applied by exactly one coordinator (one consumer, acked once applied), and a
//! redelivered duplicate changes nothing and is counted under `events_unchanged`, never twice
//! under a turn state. The cluster total is `sum without (instance) (…)` in Prometheus.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::counters::Counters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

/// The text exposition of `counters` (and its timings).
pub fn render(counters: &Counters) -> Result<String, std::fmt::Error> {
    let snapshot = counters.snapshot();
    let s = &snapshot.turns;
    let mut registry = Registry::with_prefix("turnpike");
    let ended = Family::<StateLabel, Counter>::default();
    for (state, n) in [
        ("done", s.turns_done),
        ("failed", s.turns_failed),
        ("gave_up", s.turns_gave_up),
        ("killed", s.turns_killed),
    ] {
        ended.get_or_create(&StateLabel { state }).inc_by(n);
    }
    registry.register("turns_ended", "Turns ended, by terminal state", ended);
    for (name, help, n) in [
        (
            "silent_turns",
            "Turns that ended cleanly without a bot message",
            s.silent_turns,
        ),
        (
            "retries_scheduled",
            "Retries scheduled after a death",
            s.retries_scheduled,
        ),
        (
            "runner_lost",
            "Attempts declared lost with their runner",
            s.runner_lost,
        ),
        (
            "dead_letters",
            "Events refused and recorded as dead letters",
            snapshot.dead_lettered,
        ),
        (
            "events_applied",
            "Runner events that changed a turn",
            snapshot.events_applied,
        ),
        (
            "events_unchanged",
            "Runner events that changed nothing (duplicates, superseded)",
            snapshot.events_unchanged,
        ),
    ] {
        let c = Counter::<u64>::default();
        c.inc_by(n);
        registry.register(name, help, c);
    }
    registry.register(
        "attempt_duration_seconds",
        "Seconds an attempt ran, by exit class",
        counters.timings.attempt_duration.clone(),
    );
    registry.register(
        "retry_delay_error_seconds",
        "Seconds a retry was stored after its due time",
        counters.timings.retry_delay_error.clone(),
    );
    let mut out = String::new();
    encode(&mut out, &registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::timings::ExitLabel;
    use turnpike_core::lifecycle::Effect;
    use turnpike_core::record::TurnState;

    #[test]
    fn counters_and_timings_are_exposed_by_name() {
        let c = Counters::default();
        c.effects(&[Effect::Ended {
            state: TurnState::GaveUp,
        }]);
        c.timings.retry_delay_error.observe(0.02);
        c.timings
            .attempt_duration
            .get_or_create(&ExitLabel {
                exit_class: "oom_killed".into(),
            })
            .observe(3.0);
        let text = render(&c).expect("encode");
        assert!(
            text.contains("turnpike_turns_ended_total{state=\"gave_up\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("turnpike_turns_ended_total{state=\"done\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("turnpike_retry_delay_error_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("turnpike_attempt_duration_seconds_count{exit_class=\"oom_killed\"} 1"),
            "{text}"
        );
    }
}
