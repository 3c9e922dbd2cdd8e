//! What must hold in every reachable state (`always`), and what must be reachable at all
//! (`sometimes`: the model is not vacuous — retries, kills, losses and replies do happen).
//! ARCHITECTURE.md names these properties beside the invariants they prove.

use crate::world::*;
use crate::Protocol;
use stateright::Property;
use turnpike_core::record::OutcomeReason;

pub const ONE_LIVE_AGENT: &str = "never two live agents of one turn";
pub const NO_STRAY_OUTPUT: &str =
    "no bot message after a kill, a final status, or from a superseded attempt";
pub const NO_RETRY_AFTER_REPLY: &str = "no attempt after one whose bot message landed";
pub const ONE_TERMINAL_STATE: &str = "a turn ends once, in one state";
pub const ONE_NOTICE: &str = "at most one notice per turn";
pub const OUTCOME_MATCHES_OUTPUT: &str = "the outcome says whether a bot message landed";
pub const ATTEMPT_BUDGET: &str = "attempts within the budget, each started at most once";
pub const CHAT_ORDER: &str = "a chat's turns start in arrival order, each after the previous ended";
pub const NO_WALKING_AWAY: &str = "a runner never drops an attempt whose claim it just wrote";
pub const NO_STRAY_SAVE: &str =
    "a workspace is saved only by a clean end's attempt that holds the fence, never a superseded one";

pub fn all() -> Vec<Property<Protocol>> {
    vec![
        Property::always(ONE_LIVE_AGENT, |_: &Protocol, w: &World| one_live_agent(w)),
        Property::always(NO_STRAY_OUTPUT, |_: &Protocol, w: &World| {
            w.ghost.bad_landing.is_none()
        }),
        Property::always(NO_RETRY_AFTER_REPLY, |_: &Protocol, w: &World| {
            no_retry_after_reply(w)
        }),
        Property::always(ONE_TERMINAL_STATE, |_: &Protocol, w: &World| {
            one_terminal_state(w)
        }),
        Property::always(ONE_NOTICE, |m: &Protocol, w: &World| {
            (0..m.turns).all(|t| {
                w.out
                    .iter()
                    .filter(|o| matches!(o, Out::Notice { turn, .. } if turn == &t))
                    .count()
                    <= 1
            })
        }),
        Property::always(OUTCOME_MATCHES_OUTPUT, |m: &Protocol, w: &World| {
            outcome_matches_output(m, w)
        }),
        Property::always(ATTEMPT_BUDGET, |m: &Protocol, w: &World| {
            attempt_budget(m, w)
        }),
        Property::always(CHAT_ORDER, |_: &Protocol, w: &World| !w.ghost.out_of_order),
        Property::always(NO_WALKING_AWAY, |_: &Protocol, w: &World| {
            !w.ghost.walked_away
        }),
        Property::always(NO_STRAY_SAVE, |_: &Protocol, w: &World| {
            w.ghost.bad_save.is_none()
        }),
        // Not vacuous:
        Property::sometimes("a retry's agent starts", |_: &Protocol, w: &World| {
            w.ghost.starts.keys().any(|(_, k)| *k > 1)
        }),
        Property::sometimes("a workspace is saved", |_: &Protocol, w: &World| {
            !w.ghost.saved.is_empty()
        }),
        Property::sometimes("a reply lands", |_: &Protocol, w: &World| {
            w.out.iter().any(|o| matches!(o, Out::Message { .. }))
        }),
        Property::sometimes("a turn gives up", |_: &Protocol, w: &World| {
            w.turns.iter().flatten().any(|s| {
                s.record
                    .outcome
                    .as_ref()
                    .is_some_and(|o| o.reason == OutcomeReason::BudgetSpent)
            })
        }),
        Property::sometimes("an attempt is declared lost", |_: &Protocol, w: &World| {
            w.fences
                .iter()
                .flatten()
                .any(|m| m.holder == turnpike_core::fence::FenceHolder::Lost)
        }),
        Property::sometimes("every turn settles", |m: &Protocol, w: &World| m.settled(w)),
        Property::sometimes(
            "a claim's acknowledgement is lost",
            |_: &Protocol, w: &World| {
                w.runners
                    .iter()
                    .any(|r| matches!(r, Runner::ClaimUnsure { .. }))
            },
        ),
        Property::sometimes("two events written at once", |_: &Protocol, w: &World| {
            // A start and the exit of its attempt, applied in one write.
            w.procs.iter().any(|p| match &p.job {
                Some(Job::Event { evs, applied: true }) => {
                    let kinds: Vec<_> = evs.iter().map(|ev| &w.events[*ev]).collect();
                    kinds.len() == 2
                        && kinds[0].attempt == kinds[1].attempt
                        && kinds.iter().any(|e| e.kind == EventKind::Started)
                        && kinds
                            .iter()
                            .any(|e| matches!(e.kind, EventKind::Exited { .. }))
                }
                _ => false,
            })
        }),
    ]
}

/// An agent is live when it started, has not stopped, and its runner is up: it can still say
/// something. A runner cut off from NATS stops its agent by its lease deadline (`LeaseLost`).
fn one_live_agent(w: &World) -> bool {
    let mut live = std::collections::BTreeSet::new();
    w.runners.iter().all(|r| match r {
        Runner::Running(run) if run.started && run.stop.is_none() => live.insert(run.turn),
        _ => true,
    })
}

fn no_retry_after_reply(w: &World) -> bool {
    w.out.iter().all(|o| match o {
        Out::Message { turn, attempt } => w.record(*turn).is_some_and(|r| r.attempt == *attempt),
        _ => true,
    })
}

fn one_terminal_state(w: &World) -> bool {
    w.ghost
        .ended
        .iter()
        .all(|(t, s)| w.record(*t).is_some_and(|r| r.state == *s))
}

fn outcome_matches_output(m: &Protocol, w: &World) -> bool {
    (0..m.turns).all(|t| {
        let Some(outcome) = w.record(t).and_then(|r| r.outcome.as_ref()) else {
            return true;
        };
        let landed = w.messages_of(t, None) > 0;
        match outcome.reason {
            OutcomeReason::Replied | OutcomeReason::DiedAfterReply => landed,
            OutcomeReason::SilentTurn
            | OutcomeReason::BudgetSpent
            | OutcomeReason::CouldNotStart => !landed,
            OutcomeReason::AgentFailed
            | OutcomeReason::OperatorKilled
            | OutcomeReason::PermanentError => true,
        }
    })
}

fn attempt_budget(m: &Protocol, w: &World) -> bool {
    let budget = m.max_turn_retry.max(1);
    w.turns.iter().flatten().all(|s| s.record.attempt <= budget)
        && w.ghost.starts.values().all(|n| *n <= 1)
}
