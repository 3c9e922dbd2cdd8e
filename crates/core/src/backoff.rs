//! Waits between tries that double up to a cap: every retry loop of every role uses this one
//! schedule, so how long a role keeps trying is read (and tested) where it is set.

use std::time::Duration;

/// The next wait, twice the last, never above `cap`. An endless iterator: a loop bounds its
/// tries itself (`take(n)`), or retries until it is cancelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    next: Duration,
    cap: Duration,
}

impl Backoff {
    /// Waits of `first`, `2 × first`, … up to `cap`.
    pub const fn doubling(first: Duration, cap: Duration) -> Backoff {
        Backoff { next: first, cap }
    }

    /// The wait before the next try; the one after it doubles.
    pub fn wait(&mut self) -> Duration {
        let now = self.next.min(self.cap);
        self.next = now.saturating_mul(2).min(self.cap);
        now
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.wait())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn waits_double_from_the_first_and_stay_at_the_cap() {
        let waits: Vec<_> = Backoff::doubling(ms(100), ms(1000)).take(6).collect();
        assert_eq!(
            waits,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
    }

    #[test]
    fn a_first_wait_above_the_cap_is_the_cap() {
        let waits: Vec<_> = Backoff::doubling(ms(900), ms(500)).take(2).collect();
        assert_eq!(waits, [ms(500), ms(500)]);
    }

    #[test]
    fn a_huge_cap_does_not_overflow() {
        let first = Duration::from_secs(u64::MAX / 2 + 1);
        let mut b = Backoff::doubling(first, Duration::MAX);
        assert_eq!(b.wait(), first);
        assert_eq!(b.wait(), Duration::MAX);
        assert_eq!(b.wait(), Duration::MAX);
    }
}
