//! The lifecycle table, row by row for N = 0, 1, 3, 5, and property tests over random event
//! sequences with duplicates and reordering.

use super::*;
use crate::ids::{RunnerId, TurnId};
use crate::record::*;
use crate::texts;
use crate::time::Timestamp;
use crate::wire::{Attachment, AttemptStart, ReplySpan, Role};
use crate::wire::{
    ChatErrorCause, ExitClass, ExitReport, HistoryEntry, InboundMessage, OperatorAction,
};
use crate::ChatId;
use proptest::prelude::*;
use std::time::Duration;

const BUDGETS: [u32; 4] = [0, 1, 3, 5];
const DELAY: Duration = Duration::from_secs(10);
const T0: Timestamp = Timestamp(1_800_000_000_000);

fn at(secs: u64) -> Timestamp {
    T0.saturating_add(Duration::from_secs(secs))
}

fn runner(n: u32) -> RunnerId {
    RunnerId::new(format!("r{n}")).expect("valid runner id")
}

fn new_turn(n: u32) -> TurnRecord {
    let chat = ChatId::new("chat-1").expect("valid");
    let message = InboundMessage {
        v: 1,
        id: "m1".into(),
        chat: chat.clone(),
        text: "hello".into(),
        sender: Some("ann".into()),
        attachments: vec![Attachment {
            name: "a.txt".into(),
            object: "obj-1".into(),
        }],
    };
    let (record, effects) = create(
        NewTurn {
            turn: TurnId::for_message(&chat, "m1"),
            message,
            history: vec![HistoryEntry {
                role: Role::User,
                text: "earlier".into(),
            }],
            max_turn_retry: n,
            retry_delay: DELAY,
            rerun_of: None,
            created_by: None,
            admit_now: true,
        },
        T0,
    );
    assert_eq!(
        effects,
        vec![Effect::DispatchAttempt {
            attempt: 1,
            not_before: None
        }]
    );
    assert_eq!(record.state, TurnState::Queued);
    record
}

fn report(class: ExitClass, landed: u32, ended: Timestamp) -> ExitReport {
    ExitReport {
        workspace: None,
        class,
        exit_code: None,
        signal: None,
        error: None,
        messages_landed: landed,
        reply_span: None,
        output_cut: false,
        ended_at: ended,
        started: None,
    }
}

/// Apply and expect a change.
fn step(r: &TurnRecord, ev: Event, now: Timestamp) -> (TurnRecord, Vec<Effect>) {
    match apply(r, &ev, now).expect("legal transition") {
        Step::Changed { record, effects } => (*record, effects),
        Step::Unchanged(u) => panic!("expected a change for {ev:?}, got {u:?}"),
    }
}

/// Run attempt `k` to its exit: started, `landed` messages, exit `class` at `ended`.
fn run_attempt(
    r: &TurnRecord,
    k: u32,
    class: ExitClass,
    landed: u32,
    ended: Timestamp,
) -> (TurnRecord, Vec<Effect>) {
    let (mut r, _) = step(
        r,
        Event::Started {
            attempt: k,
            runner: runner(k),
            published_at: ended,
        },
        ended,
    );
    for seq in 1..=landed {
        let (next, effects) = step(
            &r,
            Event::MessageLanded {
                attempt: k,
                seq,
                stream_seq: Some(u64::from(k) * 1000 + u64::from(seq)),
            },
            ended,
        );
        assert!(effects.is_empty());
        r = next;
    }
    step(
        &r,
        Event::Exited {
            attempt: k,
            report: report(class, landed, ended),
        },
        ended,
    )
}

fn notices(effects: &[Effect]) -> Vec<(NoticeKind, String)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Notify { kind, text, .. } => Some((*kind, text.clone())),
            _ => None,
        })
        .collect()
}

fn flagged(effects: &[Effect]) -> bool {
    effects
        .iter()
        .any(|e| matches!(e, Effect::FlagChatErrored { .. }))
}

/// The typed cause of the errored flag, which operator tools count by (never by the prose).
fn flag_cause(effects: &[Effect]) -> Option<ChatErrorCause> {
    effects.iter().find_map(|e| match e {
        Effect::FlagChatErrored { cause, .. } => *cause,
        _ => None,
    })
}

fn ended(effects: &[Effect]) -> Option<TurnState> {
    effects.iter().find_map(|e| match e {
        Effect::Ended { state } => Some(*state),
        _ => None,
    })
}

const DEATHS: [ExitClass; 6] = [
    ExitClass::OomKilled,
    ExitClass::TimedOut,
    ExitClass::Crashed,
    ExitClass::Signaled,
    ExitClass::RunnerLost,
    ExitClass::EngineError,
];

#[test]
fn attempt_limit_is_max_of_budget_and_one() {
    for (n, limit) in [(0, 1), (1, 1), (3, 3), (5, 5)] {
        assert_eq!(new_turn(n).max_attempts, limit, "N={n}");
    }
}

#[test]
fn row_clean_exit_with_reply_is_done() {
    for n in BUDGETS {
        let (r, effects) = run_attempt(&new_turn(n), 1, ExitClass::Clean, 2, at(1));
        assert_eq!(r.state, TurnState::Done, "N={n}");
        assert_eq!(
            r.outcome.as_ref().map(|o| o.reason),
            Some(OutcomeReason::Replied)
        );
        assert!(notices(&effects).is_empty());
        assert!(!flagged(&effects));
        assert_eq!(ended(&effects), Some(TurnState::Done));
    }
}

#[test]
fn row_clean_exit_without_reply_is_done_with_silent_notice() {
    for n in BUDGETS {
        let (r, effects) = run_attempt(&new_turn(n), 1, ExitClass::Clean, 0, at(1));
        assert_eq!(r.state, TurnState::Done, "N={n}");
        assert_eq!(
            notices(&effects),
            vec![(NoticeKind::SilentTurn, texts::SILENT_TURN_NOTICE.to_owned())]
        );
        assert!(!flagged(&effects));
        assert_eq!(r.attempts.len(), 1, "a clean run is never retried");
    }
}

#[test]
fn row_agent_reported_failure_is_failed_plain_never_retried() {
    for n in BUDGETS {
        for landed in [0, 1] {
            let (r, effects) = run_attempt(&new_turn(n), 1, ExitClass::AgentFailed, landed, at(1));
            assert_eq!(r.state, TurnState::Failed, "N={n} landed={landed}");
            assert_eq!(
                notices(&effects),
                vec![(NoticeKind::Plain, texts::PLAIN_FAILURE_NOTICE.to_owned())]
            );
            assert!(!flagged(&effects));
            assert_eq!(r.attempts.len(), 1);
        }
    }
}

#[test]
fn row_could_not_start_is_failed_flagged_not_retried() {
    for n in BUDGETS {
        let (r, effects) = run_attempt(&new_turn(n), 1, ExitClass::CouldNotStart, 0, at(1));
        assert_eq!(r.state, TurnState::Failed, "N={n}");
        assert_eq!(
            r.outcome.as_ref().map(|o| o.reason),
            Some(OutcomeReason::CouldNotStart)
        );
        assert_eq!(
            notices(&effects),
            vec![(NoticeKind::Plain, texts::PLAIN_FAILURE_NOTICE.to_owned())]
        );
        assert!(flagged(&effects));
        assert_eq!(flag_cause(&effects), Some(ChatErrorCause::CouldNotStart));
        assert!(r.chat_flagged);
        assert_eq!(r.attempts.len(), 1);
    }
}

#[test]
fn row_death_after_reply_is_failed_plain_not_retried() {
    for n in BUDGETS {
        for class in DEATHS {
            let (r, effects) = run_attempt(&new_turn(n), 1, class, 1, at(1));
            assert_eq!(r.state, TurnState::Failed, "N={n} {class:?}");
            assert_eq!(
                r.outcome.as_ref().map(|o| o.reason),
                Some(OutcomeReason::DiedAfterReply)
            );
            assert_eq!(
                notices(&effects),
                vec![(NoticeKind::Plain, texts::PLAIN_FAILURE_NOTICE.to_owned())]
            );
            assert!(!flagged(&effects));
            assert!(!effects
                .iter()
                .any(|e| matches!(e, Effect::DispatchAttempt { .. })));
        }
    }
}

#[test]
fn row_death_reported_landed_only_in_exit_report_counts_too() {
    // The runner died after landing a message whose MessageLanded event we never saw: the
    // exit report's count still stops the retry.
    let r = new_turn(3);
    let (r, _) = step(
        &r,
        Event::Exited {
            attempt: 1,
            report: report(ExitClass::OomKilled, 1, at(1)),
        },
        at(1),
    );
    assert_eq!(r.state, TurnState::Failed);
}

#[test]
fn row_death_without_reply_retries_after_flat_delay_then_gives_up() {
    for n in BUDGETS {
        for class in DEATHS {
            let limit = n.max(1);
            let mut r = new_turn(n);
            let mut all_effects = Vec::new();
            for k in 1..=limit {
                let died = at(100 * u64::from(k));
                let (next, effects) = run_attempt(&r, k, class, 0, died);
                r = next;
                if k < limit {
                    let due = died.saturating_add(DELAY);
                    assert_eq!(r.state, TurnState::PendingRetry, "N={n} k={k} {class:?}");
                    assert_eq!(r.retry_count, k);
                    assert_eq!(r.attempt, k + 1);
                    assert_eq!(r.next_attempt_due, Some(due));
                    assert_eq!(
                        effects,
                        vec![Effect::DispatchAttempt {
                            attempt: k + 1,
                            not_before: Some(due)
                        }]
                    );
                    let w = r.work_item(k + 1);
                    assert_eq!(
                        w.prompt(),
                        format!("{}\nhello", texts::retry_preamble(k + 1, limit))
                    );
                    assert_eq!(w.message, r.message, "same message and attachments");
                    assert_eq!(w.history, r.history, "same history");
                    assert_eq!(w.max_attempts, limit);
                }
                all_effects.extend(effects);
            }
            assert_eq!(r.state, TurnState::GaveUp, "N={n} {class:?}");
            assert_eq!(r.attempts.len() as u32, limit);
            assert_eq!(r.retry_count, limit - 1);
            assert_eq!(
                notices(&all_effects),
                vec![(NoticeKind::GiveUp, texts::give_up_notice(limit))]
            );
            assert!(flagged(&all_effects));
            assert_eq!(flag_cause(&all_effects), Some(ChatErrorCause::GaveUp));
            assert!(r.chat_flagged);
            let dispatched: Vec<u32> = all_effects
                .iter()
                .filter_map(|e| match e {
                    Effect::DispatchAttempt { attempt, .. } => Some(*attempt),
                    _ => None,
                })
                .collect();
            assert_eq!(dispatched, (2..=limit).collect::<Vec<_>>());
        }
    }
}

#[test]
fn give_up_notice_says_the_real_count() {
    let (r, effects) = run_attempt(&new_turn(0), 1, ExitClass::OomKilled, 0, at(1));
    assert_eq!(r.state, TurnState::GaveUp);
    assert_eq!(
        notices(&effects),
        vec![(
            NoticeKind::GiveUp,
            "⚠ Agent couldn't complete this request after 1 attempt.".to_owned()
        )]
    );
}

#[test]
fn retry_delay_runs_from_the_time_of_the_deaths_event_not_the_runners_clock() {
    // `now` is the server's timestamp of the event that reported the death (the shells pass
    // it), the clock that also fires the schedule. The runner's `ended_at` decides nothing, ahead
    // of the server's clock or behind it.
    let r = new_turn(3);
    for runner_clock in [at(70), at(5)] {
        let (r2, effects) = step(
            &r,
            Event::Exited {
                attempt: 1,
                report: report(ExitClass::Crashed, 0, runner_clock),
            },
            at(10),
        );
        assert_eq!(
            r2.next_attempt_due,
            Some(at(20)),
            "runner clock {runner_clock:?}"
        );
        assert_eq!(
            effects,
            vec![Effect::DispatchAttempt {
                attempt: 2,
                not_before: Some(at(20))
            }]
        );
    }
}

#[test]
fn row_operator_kill_is_killed_never_retried_no_notice() {
    for n in BUDGETS {
        for landed in [0, 1] {
            // Kill while running: forwarded, and whatever death follows is recorded as killed.
            let r = new_turn(n);
            let (r, _) = step(
                &r,
                Event::Started {
                    attempt: 1,
                    runner: runner(1),
                    published_at: at(0),
                },
                at(0),
            );
            let (r, effects) = step(
                &r,
                Event::KillRequested {
                    action: OperatorAction {
                        by: "op".into(),
                        at: at(1),
                    },
                },
                at(1),
            );
            assert_eq!(effects, vec![Effect::ForwardKill { attempt: 1 }]);
            let r = if landed > 0 {
                step(
                    &r,
                    Event::MessageLanded {
                        attempt: 1,
                        seq: 1,
                        stream_seq: None,
                    },
                    at(1),
                )
                .0
            } else {
                r
            };
            for class in [
                ExitClass::OperatorKilled,
                ExitClass::Signaled,
                ExitClass::OomKilled,
            ] {
                let (done, effects) = step(
                    &r,
                    Event::Exited {
                        attempt: 1,
                        report: report(class, landed, at(2)),
                    },
                    at(2),
                );
                assert_eq!(done.state, TurnState::Killed, "N={n} {class:?}");
                assert!(notices(&effects).is_empty());
                assert!(!flagged(&effects));
                assert_eq!(
                    effects,
                    vec![Effect::Ended {
                        state: TurnState::Killed
                    }]
                );
            }
        }
        // An OperatorKilled exit counts as killed even if the request went straight to the runner.
        let (r, effects) = run_attempt(&new_turn(n), 1, ExitClass::OperatorKilled, 0, at(1));
        assert_eq!(r.state, TurnState::Killed);
        assert_eq!(
            effects,
            vec![Effect::Ended {
                state: TurnState::Killed
            }]
        );
    }
}

#[test]
fn kill_during_pending_retry_cancels_the_scheduled_attempt() {
    let (r, _) = run_attempt(&new_turn(3), 1, ExitClass::OomKilled, 0, at(1));
    assert_eq!(r.state, TurnState::PendingRetry);
    let (r, effects) = step(
        &r,
        Event::KillRequested {
            action: OperatorAction {
                by: "op".into(),
                at: at(2),
            },
        },
        at(2),
    );
    assert_eq!(r.state, TurnState::Killed);
    // One attempt was made; the scheduled second one never ran.
    assert_eq!(r.outcome.as_ref().map(|o| o.attempts), Some(1));
    assert_eq!(
        effects,
        vec![
            Effect::CancelAttempt { attempt: 2 },
            Effect::Ended {
                state: TurnState::Killed
            }
        ]
    );
    // The scheduled attempt firing anyway changes nothing.
    assert_eq!(
        apply(
            &r,
            &Event::Started {
                attempt: 2,
                runner: runner(9),
                published_at: at(11)
            },
            at(11)
        ),
        Ok(Step::Unchanged(Unchanged::AlreadyEnded {
            state: TurnState::Killed
        }))
    );
}

#[test]
fn kill_after_end_answers_already_ended() {
    let (r, _) = run_attempt(&new_turn(3), 1, ExitClass::Clean, 1, at(1));
    assert_eq!(
        apply(
            &r,
            &Event::KillRequested {
                action: OperatorAction {
                    by: "op".into(),
                    at: at(2)
                }
            },
            at(2)
        ),
        Ok(Step::Unchanged(Unchanged::AlreadyEnded {
            state: TurnState::Done
        }))
    );
}

#[test]
fn waiting_turn_starts_on_admission() {
    let chat = ChatId::new("c").expect("valid");
    let (r, effects) = create(
        NewTurn {
            turn: TurnId::for_message(&chat, "2"),
            message: InboundMessage {
                v: 1,
                id: "2".into(),
                chat,
                text: "x".into(),
                sender: None,
                attachments: vec![],
            },
            history: vec![],
            max_turn_retry: 3,
            retry_delay: DELAY,
            rerun_of: None,
            created_by: None,
            admit_now: false,
        },
        T0,
    );
    assert_eq!(r.state, TurnState::Waiting);
    assert!(effects.is_empty());
    assert_eq!(
        apply(
            &r,
            &Event::Started {
                attempt: 1,
                runner: runner(1),
                published_at: T0
            },
            T0
        ),
        Err(TransitionError::NotAdmitted { attempt: 1 })
    );
    let history = vec![HistoryEntry {
        role: Role::Bot,
        text: "the earlier turn's reply".into(),
    }];
    let (r, effects) = step(
        &r,
        Event::Admitted {
            history: history.clone(),
        },
        at(1),
    );
    assert_eq!(r.history, history, "snapshotted at admission");
    assert_eq!(r.state, TurnState::Queued);
    assert_eq!(
        effects,
        vec![Effect::DispatchAttempt {
            attempt: 1,
            not_before: None
        }]
    );
    assert_eq!(
        apply(&r, &Event::Admitted { history: vec![] }, at(2)),
        Ok(Step::Unchanged(Unchanged::Duplicate))
    );
}

#[test]
fn duplicate_late_superseded_and_future_events() {
    let r = new_turn(3);
    let started = Event::Started {
        attempt: 1,
        runner: runner(1),
        published_at: T0,
    };
    let (r, _) = step(&r, started.clone(), at(1));
    assert_eq!(
        apply(&r, &started, at(1)),
        Ok(Step::Unchanged(Unchanged::Duplicate))
    );
    assert_eq!(
        apply(
            &r,
            &Event::Started {
                attempt: 1,
                runner: runner(2),
                published_at: T0
            },
            at(1)
        ),
        Err(TransitionError::ConflictingRunner {
            attempt: 1,
            recorded: runner(1),
            claimed: runner(2)
        })
    );
    let exit = Event::Exited {
        attempt: 1,
        report: report(ExitClass::Crashed, 0, at(2)),
    };
    let (r, _) = step(&r, exit.clone(), at(2));
    assert_eq!(
        apply(&r, &exit, at(3)),
        Ok(Step::Unchanged(Unchanged::Superseded {
            attempt: 1,
            current: 2
        }))
    );
    assert_eq!(
        apply(
            &r,
            &Event::MessageLanded {
                attempt: 1,
                seq: 1,
                stream_seq: None
            },
            at(3)
        ),
        Ok(Step::Unchanged(Unchanged::Superseded {
            attempt: 1,
            current: 2
        }))
    );
    assert_eq!(
        apply(
            &r,
            &Event::Exited {
                attempt: 3,
                report: report(ExitClass::Clean, 1, at(3))
            },
            at(3)
        ),
        Err(TransitionError::FutureAttempt {
            attempt: 3,
            current: 2
        })
    );
    assert_eq!(
        apply(
            &r,
            &Event::MessageLanded {
                attempt: 0,
                seq: 1,
                stream_seq: None
            },
            at(3)
        ),
        Err(TransitionError::AttemptZero)
    );
    assert_eq!(
        apply(
            &r,
            &Event::MessageLanded {
                attempt: 2,
                seq: 0,
                stream_seq: None
            },
            at(3)
        ),
        Err(TransitionError::SeqZero)
    );
}

#[test]
fn a_dispatch_leaves_the_outbox_with_the_write_that_says_its_attempt_began() {
    let dispatch = Effect::DispatchAttempt {
        attempt: 1,
        not_before: None,
    };
    let mut admitted = new_turn(3);
    admitted.outbox = vec![dispatch.clone()];
    assert!(!dispatch.carried_out(&admitted), "not before it began");
    let started = Event::Started {
        attempt: 1,
        runner: runner(0),
        published_at: at(1),
    };
    let Step::Changed { record, effects } = apply(&admitted, &started, at(2)).expect("starts")
    else {
        panic!("starting changes the record")
    };
    assert!(dispatch.carried_out(&record));
    assert_eq!(next_outbox(&record, &effects), vec![]);
    // An ended turn keeps its effects: only leaving the live index says they were carried out.
    let (ended, effects) = run_attempt(&new_turn(3), 1, ExitClass::Clean, 1, at(3));
    assert!(
        effects.iter().all(|e| !e.carried_out(&ended)),
        "{effects:?}"
    );
}

#[test]
fn record_round_trips_in_both_codecs() {
    use crate::codec::Codec;
    let (r, effects) = run_attempt(&new_turn(3), 1, ExitClass::OomKilled, 0, at(1));
    let mut r = r;
    r.outbox = effects;
    for codec in [Codec::Json, Codec::Msgpack] {
        let bytes = codec.encode(&r).expect("encodes");
        let back: TurnRecord = codec.decode(&bytes).expect("decodes");
        assert_eq!(back, r, "{codec:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Property tests.

fn arb_class() -> impl Strategy<Value = ExitClass> {
    prop::sample::select(ExitClass::ALL.to_vec())
}

fn arb_event() -> impl Strategy<Value = Event> {
    let attempt = 0u32..7;
    prop_oneof![
        1 => Just(Event::Admitted { history: vec![] }),
        3 => (attempt.clone(), 0u32..3, 0u64..100).prop_map(|(a, r, t)| Event::Started {
            attempt: a,
            runner: runner(r),
            published_at: at(t),
        }),
        3 => (attempt.clone(), 0u32..3, proptest::option::of(0u64..1000)).prop_map(|(a, s, q)| {
            Event::MessageLanded { attempt: a, seq: s, stream_seq: q }
        }),
        // A reported span, or none, whatever the landed count.
        5 => (attempt, arb_class(), 0u32..2, 0u64..1000, proptest::option::of((0u64..99, 0u64..9)))
            .prop_map(|(a, c, l, t, span)| Event::Exited {
                attempt: a,
                report: ExitReport {
                    reply_span: span.map(|(first, n)| ReplySpan { first, last: first + n }),
                    ..report(c, l, at(t))
                },
            }),
        1 => (0u64..1000).prop_map(|t| Event::KillRequested {
            action: OperatorAction { by: "op".into(), at: at(t) },
        }),
        1 => Just(Event::Abandoned { reason: "payload too large".into() }),
    ]
}

/// Invariants over one trajectory; returns the final record.
fn check_trajectory(n: u32, events: &[Event]) -> Result<TurnRecord, TestCaseError> {
    let limit = n.max(1);
    let mut r = new_turn(n);
    r.outbox = vec![Effect::DispatchAttempt {
        attempt: 1,
        not_before: None,
    }];
    let mut notices_sent = 0;
    let mut ended_count = 0;
    let mut terminal: Option<TurnState> = None;
    let mut dispatched = vec![1u32];
    let mut no_more_dispatch = false;
    for (i, ev) in events.iter().enumerate() {
        let now = at(1000 + i as u64);
        let before = r.clone();
        match apply(&r, ev, now) {
            Err(_) | Ok(Step::Unchanged(_)) => continue,
            Ok(Step::Changed { record, effects }) => {
                r = *record;
                // Stored as the shells store it: no write ever clears the outbox.
                r.outbox = next_outbox(&r, &effects);
                if let Some(t) = terminal {
                    prop_assert!(false, "terminal {t:?} changed by {ev:?}");
                }
                for e in &effects {
                    match e {
                        Effect::Notify { .. } => notices_sent += 1,
                        Effect::Ended { state } => {
                            ended_count += 1;
                            prop_assert_eq!(*state, r.state);
                        }
                        Effect::DispatchAttempt { attempt, .. } => {
                            prop_assert!(
                                !no_more_dispatch,
                                "dispatch after a landed message, kill or clean exit: {ev:?}"
                            );
                            prop_assert!(!before.any_landed(), "retry after a bot message landed");
                            prop_assert_eq!(*attempt, dispatched.last().copied().unwrap_or(0) + 1);
                            dispatched.push(*attempt);
                        }
                        _ => {}
                    }
                }
                match ev {
                    Event::MessageLanded { .. }
                    | Event::KillRequested { .. }
                    | Event::Abandoned { .. } => no_more_dispatch = true,
                    Event::Exited { report, .. }
                        if matches!(
                            report.class,
                            ExitClass::Clean
                                | ExitClass::AgentFailed
                                | ExitClass::CouldNotStart
                                | ExitClass::OperatorKilled
                        ) || report.messages_landed > 0 =>
                    {
                        no_more_dispatch = true
                    }
                    _ => {}
                }
                if r.state.is_terminal() {
                    terminal = Some(r.state);
                }
            }
        }
        prop_assert!(r.attempt <= limit, "attempt {} > limit {limit}", r.attempt);
        for a in &r.attempts {
            // A span's ends are in order.
            prop_assert!(a.reply_span.is_none_or(|s| s.first <= s.last), "{a:?}");
        }
        prop_assert!(r.attempts.len() as u32 <= limit);
        // The outbox without clears: what is owed stays until proven done, nothing else piles up.
        let owed = Effect::DispatchAttempt {
            attempt: r.attempt,
            not_before: r.next_attempt_due,
        };
        if matches!(r.state, TurnState::Queued | TurnState::PendingRetry) {
            prop_assert!(
                r.outbox.contains(&owed),
                "owed dispatch lost: {:?}",
                r.outbox
            );
        }
        if r.state.is_terminal() {
            prop_assert!(
                r.outbox.contains(&Effect::Ended { state: r.state }),
                "ended turn's effects lost: {:?}",
                r.outbox
            );
        }
        prop_assert!(
            r.outbox.iter().all(|e| !e.carried_out(&r)),
            "{:?}",
            r.outbox
        );
        prop_assert!(r.outbox.len() <= 6, "outbox piles up: {:?}", r.outbox);
        prop_assert!(r.outbox.len() <= crate::sizes::OUTBOX_EFFECTS_MAX);
        prop_assert!(notices_sent <= 1, "more than one notice");
    }
    prop_assert_eq!(ended_count, u32::from(r.state.is_terminal()));
    prop_assert_eq!(r.notice.is_some(), notices_sent == 1);
    Ok(r)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Arbitrary events, including illegal, duplicated and out-of-order ones.
    #[test]
    fn random_events_keep_the_invariants(
        n in prop::sample::select(BUDGETS.to_vec()),
        events in prop::collection::vec(arb_event(), 0..60),
    ) {
        check_trajectory(n, &events)?;
    }

    /// A well-behaved world (each dispatched attempt starts, may land messages, and exits), with
    /// its events duplicated and stale ones replayed at random points. The turn always ends, in
    /// the state the table gives for the attempts' classes.
    #[test]
    fn faithful_runs_with_replays_end_as_the_table_says(
        n in prop::sample::select(BUDGETS.to_vec()),
        plan in prop::collection::vec((arb_class(), 0u32..2), 1..6),
        replays in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..20),
    ) {
        let limit = n.max(1);
        let mut r = new_turn(n);
        let mut log: Vec<Event> = Vec::new();
        let mut replays = replays.into_iter();
        let mut k = 1;
        let mut expected = None;
        while !r.state.is_terminal() {
            let (class, landed) = plan[(k as usize - 1) % plan.len()];
            let attempt_events = vec![
                Event::Started { attempt: k, runner: runner(k), published_at: at(0) },
            ].into_iter()
                .chain((1..=landed).map(|seq| Event::MessageLanded { attempt: k, seq, stream_seq: Some(u64::from(seq)) }))
                .chain(std::iter::once(Event::Exited { attempt: k, report: report(class, landed, at(u64::from(k))) }));
            for ev in attempt_events {
                log.push(ev.clone());
                if let Ok(Step::Changed { record, .. }) = apply(&r, &ev, at(u64::from(k))) {
                    r = *record;
                }
                // Replay an older event (or this one) now and then: it must change nothing but
                // duplicates of not-yet-seen facts, which are idempotent anyway.
                if let Some((a, b)) = replays.next() {
                    if a.index(3) == 0 {
                        let old = b.get(&log).clone();
                        let snapshot = r.clone();
                        if let Ok(Step::Changed { record, .. }) = apply(&r, &old, at(u64::from(k))) {
                            prop_assert!(false, "replay of {old:?} changed {snapshot:?} into {record:?}");
                        }
                    }
                }
            }
            expected = Some(match class {
                ExitClass::OperatorKilled => TurnState::Killed,
                ExitClass::Clean => TurnState::Done,
                ExitClass::AgentFailed | ExitClass::CouldNotStart => TurnState::Failed,
                _ if landed > 0 => TurnState::Failed,
                _ if k < limit => TurnState::PendingRetry,
                _ => TurnState::GaveUp,
            });
            prop_assert_eq!(Some(r.state), expected);
            k += 1;
            prop_assert!(k <= limit + 1, "more than {limit} attempts");
        }
        prop_assert!(expected.is_some_and(|s| s.is_terminal()));
        // And the whole log replayed on the terminal record changes nothing.
        for ev in &log {
            let changed = matches!(apply(&r, ev, at(5000)), Ok(Step::Changed { .. }));
            prop_assert!(!changed, "replay of {:?} changed a terminal turn", ev);
        }
        check_trajectory(n, &log)?;
    }
}

#[test]
fn landed_messages_record_where_they_are_stored_once_each() {
    let r = new_turn(3);
    let (r, _) = step(
        &r,
        Event::Started {
            attempt: 1,
            runner: runner(1),
            published_at: T0,
        },
        at(1),
    );
    let landed = |seq, stream_seq| Event::MessageLanded {
        attempt: 1,
        seq,
        stream_seq,
    };
    let (r, _) = step(&r, landed(1, Some(17)), at(2));
    // Redelivered: not recorded twice.
    assert_eq!(
        apply(&r, &landed(1, Some(17)), at(3)),
        Ok(Step::Unchanged(Unchanged::Duplicate))
    );
    // From an older runner: counted, with no location.
    let (r, _) = step(&r, landed(2, None), at(3));
    let a = &r.attempts[0];
    assert_eq!(
        (a.messages_landed, a.reply_span),
        (2, Some(ReplySpan::at(17)))
    );
}

#[test]
fn an_exit_report_handled_before_the_landed_events_still_says_where_replies_are() {
    let started = |r: &TurnRecord| {
        step(
            r,
            Event::Started {
                attempt: 1,
                runner: runner(1),
                published_at: T0,
            },
            at(1),
        )
        .0
    };
    let exit = |landed, reply_span| Event::Exited {
        attempt: 1,
        report: ExitReport {
            reply_span,
            ..report(ExitClass::Clean, landed, at(2))
        },
    };
    let r = started(&new_turn(3));
    let span = ReplySpan {
        first: 40,
        last: 41,
    };
    let (done, _) = step(&r, exit(2, Some(span)), at(2));
    assert_eq!(done.attempts[0].reply_span, Some(span));
    assert_eq!(done.state, TurnState::Done);
    // Landed events applied first, and the report: the span covers both.
    let (r, _) = step(
        &r,
        Event::MessageLanded {
            attempt: 1,
            seq: 1,
            stream_seq: Some(39),
        },
        at(1),
    );
    let (both, _) = step(&r, exit(2, Some(span)), at(2));
    assert_eq!(
        both.attempts[0].reply_span,
        Some(ReplySpan {
            first: 39,
            last: 41
        })
    );
}

#[test]
fn an_exit_report_handled_before_the_started_event_still_says_who_ran_the_attempt() {
    // Events are handled concurrently: the exit may be applied first, and the Started event that
    // follows is then fenced out (the attempt is over). The report carries the start itself.
    let r = new_turn(3);
    let exit = Event::Exited {
        attempt: 1,
        report: ExitReport {
            started: Some(AttemptStart {
                runner: runner(7),
                published_at: at(1),
                started_at: Some(at(2)),
                profile: None,
            }),
            ..report(ExitClass::Crashed, 0, at(2))
        },
    };
    let (pending, _) = step(&r, exit, at(3));
    let a = &pending.attempts[0];
    assert_eq!(a.runner, Some(runner(7)));
    assert_eq!(a.published_at, Some(at(1)));
    // ... and when its agent started (pages and order checks read it; it was lost before).
    assert_eq!(a.started_at, Some(at(2)));
    assert_eq!(pending.state, TurnState::PendingRetry);
    // Once started, a report's start changes nothing already recorded.
    let (running, _) = step(
        &r,
        Event::Started {
            attempt: 1,
            runner: runner(1),
            published_at: at(0),
        },
        at(1),
    );
    let exit = Event::Exited {
        attempt: 1,
        report: ExitReport {
            started: Some(AttemptStart {
                runner: runner(1),
                published_at: at(1),
                started_at: Some(at(2)),
                profile: None,
            }),
            ..report(ExitClass::Clean, 0, at(2))
        },
    };
    let (done, _) = step(&running, exit, at(3));
    assert_eq!(done.attempts[0].published_at, Some(at(0)));
    assert_eq!(done.attempts[0].started_at, Some(at(1)));
}

#[test]
fn a_turn_admitted_at_creation_is_the_waiting_turn_admitted() {
    // The dispatcher writes an idle chat's new turn once, admitted: it must be the record that
    // creating it waiting and then admitting it wrote (the coordinator cannot tell them apart).
    let chat = ChatId::new("chat-1").expect("valid");
    let (waiting, none) = create(
        NewTurn {
            turn: TurnId::for_message(&chat, "m1"),
            message: new_turn(3).message,
            history: Vec::new(),
            max_turn_retry: 3,
            retry_delay: DELAY,
            rerun_of: None,
            created_by: None,
            admit_now: false,
        },
        T0,
    );
    assert!(none.is_empty());
    let history = vec![HistoryEntry {
        role: Role::Bot,
        text: "before".into(),
    }];
    let at_once = admitted_at_creation(&waiting, history.clone());
    let (mut in_two, effects) = step(&waiting, Event::Admitted { history }, T0);
    in_two.outbox = next_outbox(&in_two, &effects);
    assert_eq!(at_once, in_two);
    assert_eq!(at_once.state, TurnState::Queued);
    assert_eq!(
        at_once.outbox,
        vec![Effect::DispatchAttempt {
            attempt: 1,
            not_before: None
        }]
    );
    // Anything but a waiting turn is left as it is.
    assert_eq!(admitted_at_creation(&at_once, Vec::new()), at_once);
}

// ---------------------------------------------------------------------------------------------
// Batches: a coordinator stores a turn's queued events in one write.

/// The events applied one at a time, each result stored before the next (the shell's write per
/// event): the record, the effects and each event's outcome.
fn one_by_one(
    start: &TurnRecord,
    events: &[(&Event, Timestamp)],
) -> (TurnRecord, Vec<Effect>, Vec<EventOutcome>) {
    let mut r = start.clone();
    let (mut effects, mut outcomes) = (Vec::new(), Vec::new());
    for (ev, now) in events {
        outcomes.push(match apply(&r, ev, *now) {
            Ok(Step::Changed { record, effects: e }) => {
                r = *record;
                r.outbox = next_outbox(&r, &e);
                effects.extend(e);
                EventOutcome::Changed
            }
            Ok(Step::Unchanged(why)) => EventOutcome::Unchanged(why),
            Err(e) => EventOutcome::Refused(e),
        });
    }
    (r, effects, outcomes)
}

#[test]
fn a_fast_attempts_started_and_exit_in_one_batch_end_the_turn_as_two_writes_would() {
    let mut r = new_turn(3);
    r.outbox = vec![Effect::DispatchAttempt {
        attempt: 1,
        not_before: None,
    }];
    let events = [
        (
            Event::Started {
                attempt: 1,
                runner: runner(1),
                published_at: at(1),
            },
            at(2),
        ),
        (
            Event::Exited {
                attempt: 1,
                report: ExitReport {
                    reply_span: Some(ReplySpan::at(40)),
                    ..report(ExitClass::Clean, 1, at(3))
                },
            },
            at(3),
        ),
    ];
    let events: Vec<(&Event, Timestamp)> = events.iter().map(|(e, t)| (e, *t)).collect();
    let batch = apply_batch(&r, &events);
    let (two_writes, effects, outcomes) = one_by_one(&r, &events);
    assert_eq!(
        batch.outcomes,
        vec![EventOutcome::Changed, EventOutcome::Changed]
    );
    assert_eq!(batch.outcomes, outcomes);
    assert_eq!(batch.effects, effects);
    let done = batch.record.expect("changed");
    assert_eq!(done, two_writes);
    assert_eq!(done.state, TurnState::Done);
    // The Started event proved attempt 1 dispatched: its dispatch is not owed any more, only
    // what the exit decided.
    assert!(!done
        .outbox
        .iter()
        .any(|e| matches!(e, Effect::DispatchAttempt { .. })));
    assert_eq!(done.attempts[0].started_at, Some(at(2)));
    assert_eq!(done.attempts[0].runner, Some(runner(1)));
}

#[test]
fn a_batch_that_changes_nothing_has_no_record_to_write() {
    let r = new_turn(3);
    let started = Event::Started {
        attempt: 1,
        runner: runner(1),
        published_at: at(1),
    };
    let (running, _) = step(&r, started.clone(), at(2));
    let landed_zero = Event::MessageLanded {
        attempt: 1,
        seq: 0,
        stream_seq: None,
    };
    let batch = apply_batch(&running, &[(&started, at(3)), (&landed_zero, at(3))]);
    assert_eq!(batch.record, None);
    assert!(batch.effects.is_empty());
    assert_eq!(
        batch.outcomes,
        vec![
            EventOutcome::Unchanged(Unchanged::Duplicate),
            EventOutcome::Refused(TransitionError::SeqZero)
        ]
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// However a turn's events happen to be grouped into batches (by when they arrive), the
    /// record stored last, the effects and each event's outcome are those of applying them one by
    /// one with a write each.
    #[test]
    fn any_grouping_into_batches_is_the_same_as_one_write_per_event(
        n in prop::sample::select(BUDGETS.to_vec()),
        events in prop::collection::vec(arb_event(), 0..40),
        cuts in prop::collection::vec(any::<bool>(), 40),
    ) {
        let mut start = new_turn(n);
        start.outbox = vec![Effect::DispatchAttempt { attempt: 1, not_before: None }];
        let timed: Vec<(&Event, Timestamp)> = events
            .iter()
            .enumerate()
            .map(|(i, e)| (e, at(1000 + i as u64)))
            .collect();
        let (expected, expected_effects, expected_outcomes) = one_by_one(&start, &timed);
        let (mut r, mut effects, mut outcomes) = (start, Vec::new(), Vec::new());
        let mut group = Vec::new();
        for (i, ev) in timed.iter().enumerate() {
            group.push(*ev);
            if cuts[i] || i + 1 == timed.len() {
                let batch = apply_batch(&r, &group);
                prop_assert_eq!(batch.outcomes.len(), group.len());
                if let Some(changed) = batch.record {
                    r = changed;
                } else {
                    prop_assert!(batch.effects.is_empty());
                    prop_assert!(!batch.outcomes.contains(&EventOutcome::Changed));
                }
                effects.extend(batch.effects);
                outcomes.extend(batch.outcomes);
                group.clear();
            }
        }
        prop_assert_eq!(r, expected);
        prop_assert_eq!(effects, expected_effects);
        prop_assert_eq!(outcomes, expected_outcomes);
    }
}

/// An error no retry can change ends the turn failed wherever it stands: the plain notice, the
/// chat flagged with the reason, the reason in the record, and nothing of it left to run.
#[test]
fn an_abandoned_turn_fails_for_good_from_any_live_state() {
    let abandon = Event::Abandoned {
        reason: format!("payload too large: {}", "x".repeat(10_000)),
    };
    let queued = new_turn(3);
    let (running, _) = step(
        &queued,
        Event::Started {
            attempt: 1,
            runner: runner(1),
            published_at: T0,
        },
        at(1),
    );
    let (pending, _) = run_attempt(&queued, 1, ExitClass::OomKilled, 0, at(2));
    assert_eq!(pending.state, TurnState::PendingRetry);
    let mut waiting = queued.clone();
    waiting.state = TurnState::Waiting;
    waiting.attempt = 0;
    waiting.attempts.clear();
    for (r, stop, made) in [
        (&waiting, None, 0),
        (&queued, Some(Effect::CancelAttempt { attempt: 1 }), 1),
        (&running, Some(Effect::ForwardKill { attempt: 1 }), 1),
        (&pending, Some(Effect::CancelAttempt { attempt: 2 }), 1),
    ] {
        let (done, effects) = step(r, abandon.clone(), at(5));
        assert_eq!(done.state, TurnState::Failed);
        let outcome = done.outcome.clone().expect("an outcome");
        assert_eq!(outcome.reason, OutcomeReason::PermanentError);
        assert_eq!(outcome.attempts, made, "from {:?}", r.state);
        let error = outcome.error.expect("the reason is kept");
        assert!(error.starts_with("payload too large: xxx"));
        assert!(crate::sizes::str_len(&error) <= crate::sizes::REASON_MAX);
        let mut expected = Vec::from_iter(stop);
        expected.extend([
            Effect::Notify {
                kind: NoticeKind::Plain,
                text: texts::PLAIN_FAILURE_NOTICE.into(),
                attempt: made,
            },
            Effect::FlagChatErrored {
                reason: error.clone(),
                cause: Some(ChatErrorCause::PermanentError),
            },
            Effect::Ended {
                state: TurnState::Failed,
            },
        ]);
        assert_eq!(effects, expected, "from {:?}", r.state);
        // Final: a second error, a late exit, a kill change nothing.
        assert_eq!(
            apply(&done, &abandon, at(6)),
            Ok(Step::Unchanged(Unchanged::AlreadyEnded {
                state: TurnState::Failed
            }))
        );
    }
}

/// Whatever error text a runner reports, the record keeps it bounded.
#[test]
fn an_exit_reports_error_is_kept_bounded() {
    let queued = new_turn(1);
    let huge = ExitReport {
        error: Some("\u{1}".repeat(100_000)),
        ..report(ExitClass::Crashed, 0, at(2))
    };
    let (r, _) = step(
        &queued,
        Event::Exited {
            attempt: 1,
            report: huge,
        },
        at(2),
    );
    let kept = r.attempts[0]
        .exit
        .as_ref()
        .and_then(|e| e.error.clone())
        .expect("kept");
    assert!(crate::sizes::str_len(&kept) <= crate::sizes::ERROR_MAX);
}

/// Issue 37: the workspace a run left becomes the chat's only by the exit that ends its turn
/// cleanly, before the turn's end lets the chat's next turn go; never by a death (the retry
/// starts from what the first attempt saw), a kill, or a superseded attempt.
#[test]
fn only_a_clean_end_saves_its_workspace_and_before_the_turn_ends() {
    let with_ws = |class, landed, k: u32| ExitReport {
        workspace: Some(format!("chat-1/t/{k}")),
        ..report(class, landed, at(5))
    };
    let exited = |r: &TurnRecord, k: u32, rep: ExitReport| {
        step(
            r,
            Event::Exited {
                attempt: k,
                report: rep,
            },
            at(5),
        )
    };
    let started = |r: &TurnRecord, k: u32| {
        step(
            r,
            Event::Started {
                attempt: k,
                runner: runner(k),
                published_at: at(1),
            },
            at(1),
        )
        .0
    };
    // Replied, or silent: saved, just before Ended.
    for landed in [1, 0] {
        let r = started(&new_turn(3), 1);
        let (r, effects) = exited(&r, 1, with_ws(ExitClass::Clean, landed, 1));
        assert_eq!(r.state, TurnState::Done);
        let save = effects
            .iter()
            .position(|e| matches!(e, Effect::SaveWorkspace { attempt: 1, object } if object == "chat-1/t/1"))
            .expect("saved");
        let ended = effects
            .iter()
            .position(|e| matches!(e, Effect::Ended { .. }))
            .expect("ended");
        assert!(save < ended, "{effects:?}");
    }
    // A death (even one that says it left a workspace), an agent's own failure, a kill: not
    // saved; the retry after the death and its clean end save the retry's.
    for class in [
        ExitClass::Crashed,
        ExitClass::OomKilled,
        ExitClass::AgentFailed,
    ] {
        let r = started(&new_turn(3), 1);
        let (r, effects) = exited(&r, 1, with_ws(class, 0, 1));
        assert!(
            !effects
                .iter()
                .any(|e| matches!(e, Effect::SaveWorkspace { .. })),
            "{class:?}: {effects:?}"
        );
        if class != ExitClass::AgentFailed {
            let r = started(&r, 2);
            let (_, effects) = exited(&r, 2, with_ws(ExitClass::Clean, 1, 2));
            assert!(effects
                .iter()
                .any(|e| matches!(e, Effect::SaveWorkspace { attempt: 2, .. })));
        }
    }
    let r = started(&new_turn(3), 1);
    let kill = OperatorAction {
        by: "op".into(),
        at: at(2),
    };
    let (r, _) = step(&r, Event::KillRequested { action: kill }, at(2));
    // A clean exit after a kill (the agent's own, racing the stop) ends the turn done, but
    // saves nothing: the kill fenced the attempt out.
    let (_, effects) = exited(&r, 1, with_ws(ExitClass::Clean, 1, 1));
    assert!(!effects
        .iter()
        .any(|e| matches!(e, Effect::SaveWorkspace { .. })));
    // A superseded attempt's clean exit changes nothing at all.
    let r = started(&new_turn(3), 1);
    let (r, _) = exited(&r, 1, report(ExitClass::RunnerLost, 0, at(3)));
    let r = started(&r, 2);
    let late = apply(
        &r,
        &Event::Exited {
            attempt: 1,
            report: with_ws(ExitClass::Clean, 1, 1),
        },
        at(6),
    )
    .expect("legal");
    assert!(matches!(late, Step::Unchanged(_)), "{late:?}");
}
