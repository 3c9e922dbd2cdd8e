//! How often the runner tries a publish again, and how long it waits before each try: pure, so
//! the policy is read and tested in one place.

use std::time::Duration;
use turnpike_core::backoff::Backoff;

/// The tries left for one publish, and the wait before the next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Retries {
    left: u32,
    waits: Waits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waits {
    /// Each wait one step longer than the last.
    Linear { next: Duration, step: Duration },
    /// Each wait twice the last, up to a cap.
    Doubling(Backoff),
}

impl Retries {
    /// A bot message: 5 more tries (same dedup id), 200 ms, 400 ms, … 1 s apart. After that,
    /// whether it landed is settled from the stream once the attempt is fenced out.
    pub(crate) fn bot_message() -> Retries {
        let step = Duration::from_millis(200);
        Retries {
            left: 5,
            waits: Waits::Linear { next: step, step },
        }
    }

    /// A runner event: 9 more tries, from 100 ms doubling up to 5 s apart (about 20 s in all),
    /// so a NATS blip does not lose it; past that the lease sweep settles the attempt.
    pub(crate) fn event() -> Retries {
        Retries {
            left: 9,
            waits: Waits::Doubling(Backoff::doubling(
                Duration::from_millis(100),
                Duration::from_secs(5),
            )),
        }
    }

    /// After a failed try: how long to wait before the next, or `None` when no try is left.
    pub(crate) fn after_failure(&mut self) -> Option<Duration> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(match &mut self.waits {
            Waits::Linear { next, step } => {
                let wait = *next;
                *next += *step;
                wait
            }
            Waits::Doubling(backoff) => backoff.wait(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waits(mut r: Retries) -> Vec<u64> {
        std::iter::from_fn(|| r.after_failure())
            .map(|d| d.as_millis() as u64)
            .collect()
    }

    #[test]
    fn a_bot_message_is_tried_six_times_in_all() {
        assert_eq!(waits(Retries::bot_message()), [200, 400, 600, 800, 1000]);
    }

    #[test]
    fn a_runner_event_backs_off_to_five_seconds() {
        assert_eq!(
            waits(Retries::event()),
            [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000]
        );
    }
}
