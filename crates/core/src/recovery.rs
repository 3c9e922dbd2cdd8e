//! The recovery sweep's decisions, pure: what a live turn needs that no event will bring. The
//! coordinator's sweep reads the facts (record, claim, lease, schedule) and does what these say;
//! the protocol model calls the same functions.
//!
//! - effects decided a while ago and still in the outbox are carried out again (idempotent);
//! - a current attempt that was claimed and whose lease lapsed, with no exit report on its way,
//!   was lost with its runner: the sweep fences it out, counts what it landed and reports it;
//! - a pending retry that is neither scheduled, queued nor claimed is scheduled again.

use crate::record::{TurnRecord, TurnState};

/// What to look at for one live turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Waiting for its chat: the chat's previous turn admits it.
    Nothing,
    /// Ended: carry out what is left of its effects, then drop it from the live index.
    Finish,
    /// Queued or running: is its current attempt alive? ([`judge_attempt`])
    CheckAttempt { attempt: u32 },
    /// Pending a retry: is the next attempt on its way? ([`judge_retry`])
    CheckRetry { attempt: u32 },
}

/// What the sweep does with `record`. `outbox_stale`: the record was last written more than a
/// heartbeat ago, so effects still in its outbox were left by a writer that failed after its
/// compare-and-set; the first value says to carry them out before anything else.
pub fn plan(record: &TurnRecord, outbox_stale: bool) -> (bool, Plan) {
    let leftovers = !record.outbox.is_empty() && (outbox_stale || record.state.is_terminal());
    let plan = match record.state {
        s if s.is_terminal() => Plan::Finish,
        TurnState::Queued | TurnState::Running => Plan::CheckAttempt {
            attempt: record.attempt,
        },
        TurnState::PendingRetry => Plan::CheckRetry {
            attempt: record.attempt,
        },
        _ => Plan::Nothing,
    };
    (leftovers && plan != Plan::Finish, plan)
}

/// Who holds an attempt's claim, as the claims bucket says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    None,
    /// Cancelled by an operator kill before any runner took it.
    Cancelled,
    Runner,
}

/// An attempt's lease. A runner takes it before it claims the attempt, so for a claimed attempt
/// a lease that is not live was lost to the server's TTL: no clocks compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    Live,
    Lapsed,
}

/// What the sweep concludes about a current attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// Not claimed yet (queued), cancelled, or its runner is alive: nothing to do.
    Fine,
    /// The lease lapsed after the runner reported the exit: that event settles it.
    ExitOnItsWay,
    /// Lost with its runner: fence it out, count what it landed, report it `runner_lost`.
    Lost,
}

pub fn judge_attempt(claim: Claim, lease: Lease, exit_reported: bool) -> Attempt {
    match (claim, lease) {
        (Claim::None | Claim::Cancelled, _) | (Claim::Runner, Lease::Live) => Attempt::Fine,
        (Claim::Runner, Lease::Lapsed) if exit_reported => Attempt::ExitOnItsWay,
        (Claim::Runner, Lease::Lapsed) => Attempt::Lost,
    }
}

/// What the sweep concludes about a pending retry's next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// A runner claimed it (its schedule fired) and may have died before it reported starting:
    /// judge it as a current attempt.
    CheckAttempt,
    /// Scheduled, or fired and waiting in the work queue.
    OnItsWay,
    /// Owed and nowhere (an outbox lost it): schedule it again, for its recorded due time.
    Reschedule,
}

pub fn judge_retry(claimed: bool, scheduled: bool, queued: bool) -> Retry {
    if claimed {
        Retry::CheckAttempt
    } else if scheduled || queued {
        Retry::OnItsWay
    } else {
        Retry::Reschedule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_claimed_attempt_whose_lease_lapsed_without_a_report_is_lost() {
        for lease in [Lease::Live, Lease::Lapsed] {
            for reported in [false, true] {
                assert_eq!(judge_attempt(Claim::None, lease, reported), Attempt::Fine);
                assert_eq!(
                    judge_attempt(Claim::Cancelled, lease, reported),
                    Attempt::Fine
                );
            }
        }
        assert_eq!(
            judge_attempt(Claim::Runner, Lease::Live, false),
            Attempt::Fine
        );
        assert_eq!(
            judge_attempt(Claim::Runner, Lease::Lapsed, true),
            Attempt::ExitOnItsWay
        );
        assert_eq!(
            judge_attempt(Claim::Runner, Lease::Lapsed, false),
            Attempt::Lost
        );
    }

    #[test]
    fn a_claimed_retry_is_judged_by_its_lease_not_by_its_claim_alone() {
        // Item 2 of issue 16: returning as soon as a claim existed left a retry whose runner
        // died between claim and start pending for ever.
        for s in [false, true] {
            for q in [false, true] {
                assert_eq!(judge_retry(true, s, q), Retry::CheckAttempt);
            }
        }
        assert_eq!(judge_retry(false, true, false), Retry::OnItsWay);
        assert_eq!(judge_retry(false, false, true), Retry::OnItsWay);
        assert_eq!(judge_retry(false, false, false), Retry::Reschedule);
    }
}
