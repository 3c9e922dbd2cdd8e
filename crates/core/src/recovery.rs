//! The recovery sweep's decisions, pure: what a live turn needs that no event will bring. The
//! coordinator's sweep reads the facts (record, claim, lease, schedule) and does what these say;
//! the protocol model calls the same functions.
//!
//! - effects decided a while ago and still in the outbox are carried out again (idempotent),
//!   but for a dispatch, which is looked for where it would be instead (below);
//! - a current attempt that was claimed and whose lease lapsed (or was never written, for a
//!   whole lease since the sweep first looked), with no exit report on its way, was lost with its
//!   runner: the sweep fences it out, counts what it landed and reports it;
//! - an attempt owed (queued, or a pending retry) that is neither scheduled, queued nor claimed
//!   is dispatched again.

use crate::lifecycle::Effect;
use crate::record::{TurnRecord, TurnState};
use std::time::Duration;

/// What to look at for one live turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Waiting for its chat: the chat's previous turn admits it.
    Nothing,
    /// Ended: carry out what is left of its effects, then drop it from the live index.
    Finish,
    /// Running: is its current attempt alive? ([`judge_attempt`])
    CheckAttempt {
        /// The current attempt.
        attempt: u32,
    },
    /// Queued, or pending a retry: is its attempt on its way? ([`judge_retry`])
    CheckDispatched {
        /// The attempt owed.
        attempt: u32,
    },
}

/// What the sweep does with `record`: the effects to carry out again first (none unless
/// `outbox_stale`: the record was last written more than a heartbeat ago, so effects still in its
/// outbox may have been left by a writer that failed after its compare-and-set), then the plan.
///
/// A dispatch is never carried out again from here: it stays in the outbox until the attempt
/// begins (no write clears it, [`crate::lifecycle::Effect::carried_out`]), so replaying it would
/// publish a queued attempt again at every sweep. The attempt is looked for instead
/// ([`Plan::CheckDispatched`]) and dispatched again only when it is nowhere. An ended turn's
/// effects are all carried out by [`Plan::Finish`].
pub fn plan(record: &TurnRecord, outbox_stale: bool) -> (Vec<Effect>, Plan) {
    let plan = match record.state {
        s if s.is_terminal() => Plan::Finish,
        TurnState::Running => Plan::CheckAttempt {
            attempt: record.attempt,
        },
        TurnState::Queued | TurnState::PendingRetry => Plan::CheckDispatched {
            attempt: record.attempt,
        },
        _ => Plan::Nothing,
    };
    let leftovers = if outbox_stale && plan != Plan::Finish {
        leftovers(record).cloned().collect()
    } else {
        Vec::new()
    };
    (leftovers, plan)
}

/// The effects of a turn's outbox that a sweep carries out again once the record is stale: all
/// but the dispatch (which is checked against the work queue instead). The outbox keeps the
/// effects of the turn's last change after they are carried out (they are idempotent).
pub fn leftovers(record: &TurnRecord) -> impl Iterator<Item = &Effect> {
    record
        .outbox
        .iter()
        .filter(|e| !matches!(e, Effect::DispatchAttempt { .. }))
}

/// Who holds an attempt's claim, as the claims bucket says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claim {
    /// No one has claimed it.
    None,
    /// Cancelled by an operator kill before any runner took it.
    Cancelled,
    /// A runner took it.
    Runner,
}

/// An attempt's lease, as the sweep judges it. A runner writes its lease one heartbeat after it
/// claims the attempt (a run shorter than that writes none: most turns end within it), then
/// renews it every heartbeat; one it cannot write or renew in time, it stops its run for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// Renewed within its TTL.
    Live,
    /// Lapsed or taken away (the server left a marker), or no trace of one for a whole lease
    /// since the sweep first found none ([`absent_lease`]): the runner is gone, or has stopped
    /// its run by its own deadline.
    Lapsed,
    /// No trace of one, for less than a whole lease since the sweep first found none: the run
    /// may still be in its first heartbeat.
    NotYet,
}

/// How a claimed attempt's lease of which there is no trace at all is judged, `absent_for` after
/// the sweep first found none. Its runner writes one a heartbeat after the claim, or stops its
/// run by `lease - heartbeat` after the claim; the sweep saw the claim when it first looked, so a
/// whole `lease` later the runner has done one or the other. Both durations are measured on one
/// host's monotonic clock: no clocks compared across hosts.
pub fn absent_lease(absent_for: Duration, lease: Duration) -> Lease {
    if absent_for >= lease {
        Lease::Lapsed
    } else {
        Lease::NotYet
    }
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

/// Decide whether the current attempt of a running turn is alive, from its claim, its lease, and
/// whether its exit is already reported.
pub fn judge_attempt(claim: Claim, lease: Lease, exit_reported: bool) -> Attempt {
    match (claim, lease) {
        (Claim::None | Claim::Cancelled, _) | (Claim::Runner, Lease::Live | Lease::NotYet) => {
            Attempt::Fine
        }
        (Claim::Runner, Lease::Lapsed) if exit_reported => Attempt::ExitOnItsWay,
        (Claim::Runner, Lease::Lapsed) => Attempt::Lost,
    }
}

/// What the sweep concludes about an attempt owed (queued, or a pending retry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// A runner claimed it and may have died before it reported starting: judge it as a
    /// current attempt.
    CheckAttempt,
    /// Scheduled, or fired and waiting in the work queue.
    OnItsWay,
    /// Owed and nowhere (its dispatcher died before publishing it, or a purge lost it):
    /// dispatch it again, for its recorded due time.
    Reschedule,
}

/// Decide what a queued attempt or a pending retry needs, from whether it is claimed, scheduled, or
/// queued in the work stream.
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
    fn a_lease_never_written_is_lost_only_a_whole_lease_after_the_sweep_first_found_none() {
        let lease = Duration::from_secs(6);
        assert_eq!(absent_lease(Duration::ZERO, lease), Lease::NotYet);
        assert_eq!(
            absent_lease(lease - Duration::from_millis(1), lease),
            Lease::NotYet
        );
        assert_eq!(absent_lease(lease, lease), Lease::Lapsed);
        // A run in its first heartbeat (no lease yet) is fine, with or without its report.
        for reported in [false, true] {
            assert_eq!(
                judge_attempt(Claim::Runner, Lease::NotYet, reported),
                Attempt::Fine
            );
        }
    }

    #[test]
    fn only_a_claimed_attempt_whose_lease_lapsed_without_a_report_is_lost() {
        for lease in [Lease::Live, Lease::Lapsed, Lease::NotYet] {
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

    #[test]
    fn a_queued_turns_dispatch_is_looked_for_never_replayed() {
        use crate::lifecycle::{create, Effect, NewTurn};
        use crate::wire::InboundMessage;
        let chat = crate::ChatId::new("c").expect("valid");
        let (mut record, effects) = create(
            NewTurn {
                turn: crate::TurnId::for_message(&chat, "m"),
                message: InboundMessage {
                    v: 1,
                    id: "m".into(),
                    chat,
                    text: "q".into(),
                    sender: None,
                    attachments: vec![],
                },
                history: vec![],
                max_turn_retry: 3,
                retry_delay: std::time::Duration::from_secs(10),
                rerun_of: None,
                created_by: None,
                admit_now: true,
            },
            crate::Timestamp::from_millis(0),
        );
        record.outbox = effects;
        // Replaying the dispatch of a turn waiting in a long queue would publish it again at
        // every sweep; the sweep looks for it instead.
        for stale in [false, true] {
            assert_eq!(
                plan(&record, stale),
                (vec![], Plan::CheckDispatched { attempt: 1 })
            );
        }
        // Any other effect left by a writer that died is carried out once the record is stale.
        record.outbox.push(Effect::ForwardKill { attempt: 1 });
        assert!(plan(&record, false).0.is_empty());
        assert_eq!(
            plan(&record, true).0,
            vec![Effect::ForwardKill { attempt: 1 }]
        );
    }
}
