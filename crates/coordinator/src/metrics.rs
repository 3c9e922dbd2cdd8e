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
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use turnpike_core::lifecycle::{Event, TurnRecord};

use crate::counters::Counters;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExitLabel {
    pub exit_class: String,
}

fn attempt_buckets() -> Histogram {
    // 100 ms to ~2 h: agent runs are seconds to minutes, the time limit 30 min by default.
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.1, 2.0, 17,
    ))
}

/// Histograms this coordinator observes as it applies events.
#[derive(Clone)]
pub struct Timings {
    /// Seconds an attempt ran (started → ended), by how it ended.
    pub attempt_duration: Family<ExitLabel, Histogram, fn() -> Histogram>,
    /// Seconds a retry's work item was stored after its due time (death + retry delay).
    pub retry_delay_error: Histogram,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            attempt_duration: Family::new_with_constructor(attempt_buckets),
            retry_delay_error: Histogram::new([
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0,
            ]),
        }
    }
}

impl std::fmt::Debug for Timings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Timings")
    }
}

impl Timings {
    /// Observe what an applied event tells: an attempt's run time when it ended, a retry's
    /// lateness when it started.
    pub fn observe(&self, record: &TurnRecord, event: &Event) {
        match event {
            Event::Exited { attempt, report } => {
                if let Some(s) = attempt_of(record, *attempt).and_then(|a| a.started_at) {
                    let secs = report.ended_at.millis().saturating_sub(s.millis()) as f64 / 1000.0;
                    self.attempt_duration
                        .get_or_create(&ExitLabel {
                            exit_class: report.class.to_string(),
                        })
                        .observe(secs);
                }
            }
            Event::Started {
                attempt,
                published_at,
                ..
            } => {
                if let Some(due) = attempt_of(record, *attempt).and_then(|a| a.due_at) {
                    // Early is not possible by construction; late is what the histogram shows.
                    let late = published_at.millis().saturating_sub(due.millis()) as f64 / 1000.0;
                    self.retry_delay_error.observe(late);
                }
            }
            _ => {}
        }
    }
}

fn attempt_of(record: &TurnRecord, n: u32) -> Option<&turnpike_core::lifecycle::AttemptRecord> {
    record.attempts.iter().find(|a| a.n == n)
}

/// The text exposition of `counters` (and its timings).
pub fn render(counters: &Counters) -> Result<String, std::fmt::Error> {
    let s = counters.snapshot();
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
            s.dead_lettered,
        ),
        (
            "events_applied",
            "Runner events that changed a turn",
            s.events_applied,
        ),
        (
            "events_unchanged",
            "Runner events that changed nothing (duplicates, superseded)",
            s.events_unchanged,
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
    use turnpike_core::lifecycle::{Effect, TurnState};

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
