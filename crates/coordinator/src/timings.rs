//! The histograms a coordinator observes as it applies events: how long attempts ran, how late
//! retries started.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use turnpike_core::lifecycle::Event;
use turnpike_core::record::TurnRecord;

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

fn attempt_of(record: &TurnRecord, n: u32) -> Option<&turnpike_core::record::AttemptRecord> {
    record.attempts.iter().find(|a| a.n == n)
}
