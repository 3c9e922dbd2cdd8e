//! The protocol model, checked exhaustively in bounded deployments (CI runs these; the test
//! profile builds the model optimised, see the workspace `Cargo.toml`).
//!
//! Each scenario must hold every safety property, reach every `sometimes` it can, and leave no
//! state from which the work can no longer be finished. Each deliberate bug in [`Bugs`] must be
//! caught: a property fails or a state gets stuck. That is what shows the properties have teeth.

use stateright::{Checker, HasDiscoveries, Model};
use turnpike_model::properties::*;
use turnpike_model::{liveness, Bugs, Protocol};

struct Outcome {
    /// Properties with a discovery: a counterexample for `always`, an example for `sometimes`.
    found: Vec<&'static str>,
    states: usize,
}

fn check(m: Protocol, property: Option<&'static str>) -> Outcome {
    let mut checker = m.clone().checker().threads(2);
    if let Some(p) = property {
        // Looking for one counterexample: stop at the first.
        checker = checker.finish_when(HasDiscoveries::AnyOf([p].into()));
    }
    let c = checker.spawn_bfs().join();
    Outcome {
        found: c.discoveries().into_keys().collect(),
        states: c.unique_state_count(),
    }
}

fn stuck(m: &Protocol) -> Option<usize> {
    liveness::check(m).stuck.map(|p| p.len())
}

const SAFETY: [&str; 10] = [
    ONE_LIVE_AGENT,
    NO_STRAY_OUTPUT,
    NO_RETRY_AFTER_REPLY,
    ONE_TERMINAL_STATE,
    ONE_NOTICE,
    OUTCOME_MATCHES_OUTPUT,
    ATTEMPT_BUDGET,
    CHAT_ORDER,
    NO_WALKING_AWAY,
    NO_STRAY_SAVE,
];

/// Holds everything, and reaches the `expect`ed examples (so it is not vacuous).
fn holds(m: Protocol, expect: &[&str]) {
    let o = check(m.clone(), None);
    let broken: Vec<_> = o.found.iter().filter(|p| SAFETY.contains(p)).collect();
    assert!(broken.is_empty(), "counterexamples: {broken:?}");
    assert_eq!(stuck(&m), None, "a state from which the work cannot finish");
    for e in expect {
        assert!(
            o.found.contains(e),
            "never reached: {e} ({} states)",
            o.states
        );
    }
}

/// The bug is caught: by `property`, or (`None`) by a stuck state.
fn caught(m: Protocol, property: Option<&'static str>) {
    match property {
        Some(p) => {
            let o = check(m, Some(p));
            assert!(o.found.contains(&p), "not caught by {p}: {:?}", o.found);
        }
        None => assert!(stuck(&m).is_some(), "no stuck state found"),
    }
}

// The deployments the scenarios check. Each deliberate bug below is shown in one of them (or in
// one narrowed further), so it is caught where the protocol without it holds.

/// One turn, one runner, one coordinator; one fault anywhere.
fn one_turn_one_fault() -> Protocol {
    Protocol::new(1, 1, 1).with(|p| p.faults = 1)
}

/// One turn that an operator may kill at any step; no faults.
fn one_turn_killable() -> Protocol {
    Protocol::new(1, 1, 1).with(|p| {
        p.faults = 0;
        p.killable = vec![0];
    })
}

/// Two runners racing for one turn; no faults.
fn two_runners() -> Protocol {
    Protocol::new(1, 2, 1).with(|p| p.faults = 0)
}

/// Two runners; the sweep's pass and a retry's schedule both early, while the first run has
/// not started its agent (or has, without a lease yet).
fn two_runners_sweep_and_retry_early() -> Protocol {
    two_runners().with(|p| p.early_timers = 2)
}

/// Two turns of one chat, one retry each, no early timers; no faults.
fn two_turns_of_one_chat() -> Protocol {
    Protocol::new(2, 1, 1).with(|p| {
        p.faults = 0;
        p.max_turn_retry = 1;
        p.early_timers = 0;
    })
}

const EVERY_OUTCOME: [&str; 4] = [
    "a retry's agent starts",
    "a reply lands",
    "a turn gives up",
    "every turn settles",
];

#[test]
fn one_turn_with_one_fault_anywhere() {
    // A runner, coordinator, sweep or dispatcher crash, a lost acknowledgement (of a bot
    // message or of a claim) or exit report, a duplicated work message, or a runner cut off
    // from its lease: each at any step.
    holds(
        one_turn_one_fault(),
        &[
            &EVERY_OUTCOME[..],
            &[
                "an attempt is declared lost",
                "a claim's acknowledgement is lost",
                "a workspace is saved",
            ],
        ]
        .concat(),
    );
}

#[test]
fn one_turn_killed_at_any_step() {
    // Early timers too: a kill racing a retry's schedule, the sweep, a lease's lapse.
    holds(one_turn_killable(), &EVERY_OUTCOME);
}

#[test]
fn one_turn_killed_at_any_step_with_one_fault_anywhere() {
    // With batches: a coordinator writes a start and an exit at once, or each alone; the kill,
    // a crash of the coordinator holding the batch, or a lost report may come between any steps.
    holds(
        Protocol::new(1, 1, 1).with(|p| {
            p.faults = 1;
            p.max_turn_retry = 1;
            p.early_timers = 0;
            p.killable = vec![0];
            p.batches = true;
        }),
        &[
            "a reply lands",
            "a turn gives up",
            "every turn settles",
            "two events written at once",
        ],
    );
}

// Issue 19 asks whether the Started event (and its record write) can go: no decision needs
// the record to name the runner before its exit report does. These check the protocol without
// it; the fault suite still observes "running", so the event stays until that changes.

#[test]
fn without_start_reports_one_turn_with_one_fault_anywhere() {
    holds(
        one_turn_one_fault().with(|p| p.started_events = false),
        &[&EVERY_OUTCOME[..], &["an attempt is declared lost"]].concat(),
    );
}

#[test]
fn without_start_reports_one_turn_killed_at_any_step() {
    holds(
        one_turn_killable().with(|p| p.started_events = false),
        &EVERY_OUTCOME,
    );
}

#[test]
fn without_start_reports_two_runners_with_the_sweep_and_a_retry_early() {
    // With no start in the record, a claimed attempt is judged by its claim and lease alone.
    holds(
        two_runners_sweep_and_retry_early().with(|p| p.started_events = false),
        &EVERY_OUTCOME,
    );
}

#[test]
fn one_turn_with_two_faults() {
    holds(
        Protocol::new(1, 1, 1).with(|p| {
            p.faults = 2;
            p.early_timers = 0;
        }),
        &[&EVERY_OUTCOME[..], &["an attempt is declared lost"]].concat(),
    );
}

#[test]
fn two_runners_race_for_one_turn() {
    holds(two_runners(), &EVERY_OUTCOME);
}

#[test]
fn two_runners_with_the_sweep_and_a_retry_early() {
    // A run claimed but not started when the sweep calls its lease-less attempt lost is past
    // its own lease deadline: it never starts its agent, so the retry's agent is the only one
    // (runner backends' stopped_before_start; before it, the first agent could start late).
    holds(two_runners_sweep_and_retry_early(), &EVERY_OUTCOME);
}

#[test]
fn two_coordinators_apply_one_turn_s_events() {
    holds(
        Protocol::new(1, 1, 2).with(|p| p.faults = 0),
        &EVERY_OUTCOME,
    );
}

#[test]
fn two_turns_of_one_chat_keep_their_order() {
    holds(
        two_turns_of_one_chat(),
        &["a reply lands", "every turn settles"],
    );
}

fn bug(f: impl FnOnce(&mut Bugs)) -> impl FnOnce(&mut Protocol) {
    |p: &mut Protocol| f(&mut p.bugs)
}

/// Issue 37's save step: a clean end's workspace becomes the chat's, and one whose attempt was
/// declared lost or killed (the fence moved) is discarded even when its clean exit is the one
/// the record took.
#[test]
fn a_save_that_does_not_check_the_fence_saves_a_superseded_attempt() {
    caught(
        one_turn_one_fault().with(bug(|b| b.save_without_fence = true)),
        Some(NO_STRAY_SAVE),
    );
}

#[test]
fn a_kill_that_does_not_fence_lets_the_reply_land() {
    caught(
        one_turn_killable().with(bug(|b| b.kill_without_fence = true)),
        Some(NO_STRAY_OUTPUT),
    );
}

#[test]
fn a_killed_turn_left_live_wedges_its_chat() {
    caught(
        one_turn_killable()
            .with(|p| {
                p.max_turn_retry = 1;
                p.early_timers = 0;
            })
            .with(bug(|b| b.keep_ended_turn_live = true)),
        None,
    );
}

#[test]
fn trusting_any_claim_on_a_retry_stalls_it() {
    caught(
        one_turn_one_fault().with(bug(|b| b.trust_any_retry_claim = true)),
        None,
    );
}

#[test]
fn counting_before_the_fence_moves_retries_after_a_reply() {
    caught(
        one_turn_one_fault().with(bug(|b| b.count_before_fence = true)),
        Some(NO_RETRY_AFTER_REPLY),
    );
}

#[test]
fn trusting_a_count_with_an_unknown_publish_retries_after_a_reply() {
    caught(
        one_turn_one_fault().with(bug(|b| b.trust_uncertain_count = true)),
        Some(NO_RETRY_AFTER_REPLY),
    );
}

#[test]
fn ignoring_arrival_order_breaks_chat_order() {
    caught(
        two_turns_of_one_chat().with(bug(|b| b.ignore_chat_order = true)),
        Some(CHAT_ORDER),
    );
}

#[test]
fn joining_a_busy_chat_before_the_record_exists_wedges_it() {
    // Why the dispatcher joins first only with one compare-and-set on an idle chat: a turn that
    // waits in the chat without its record can be made live by the release of the turn before
    // it while there is nothing to admit.
    caught(
        two_turns_of_one_chat().with(bug(|b| b.join_before_create = true)),
        None,
    );
}

#[test]
fn taking_an_attempt_with_no_lease_yet_for_lost_runs_two_agents() {
    // Why the sweep gives a claimed attempt with no lease a whole lease before it calls it lost:
    // a run writes its lease a heartbeat after its claim, so the old rule ("claimed and no live
    // lease") declares a healthy run lost, and its retry starts beside it.
    caught(
        two_runners_sweep_and_retry_early().with(bug(|b| b.absent_lease_lost_at_once = true)),
        Some(ONE_LIVE_AGENT),
    );
}

#[test]
fn a_claim_whose_acknowledgement_was_lost_taken_for_anothers_is_never_run() {
    // Issue 32: async-nats reads a claim whose acknowledgement it lost back as "already
    // exists". Taken for another runner's, the runner drops the delivery of the attempt it
    // holds: nobody runs it until the sweep calls it lost, and the turn spends an attempt.
    caught(
        one_turn_one_fault().with(bug(|b| b.lost_claim_ack_is_anothers = true)),
        Some(NO_WALKING_AWAY),
    );
}

#[test]
fn a_batch_judged_on_the_record_as_read_loses_an_update() {
    // An exit and then a late start of the same attempt in one write: judged on the record as
    // read, the start overwrites the exit.
    let m = Protocol::new(1, 1, 1)
        .with(bug(|b| b.batch_judged_on_the_read_record = true))
        .with(|p| {
            p.faults = 0;
            p.batches = true;
        });
    caught(m, Some(ONE_TERMINAL_STATE));
}
