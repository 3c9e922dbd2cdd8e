//! Issue 32: every payload Turnpike builds fits `max_payload` by construction. A generative test
//! over the real encoders (JSON and MessagePack): budgets the configuration allows, inbound
//! messages that pass validation with every field at or near its limit and the characters that
//! encode largest (control characters, quotes, backslashes, 4-byte UTF-8), histories built by the
//! real `history::append`, agents' errors of any size, and turns driven through the lifecycle by
//! random events: at every step, the turn record, every work item, the chat record, the runner
//! events, the notices and the bot messages stay within the budgets, and the budgets within
//! `max_payload`.

use proptest::prelude::*;
use std::time::Duration;
use turnpike_core::history::{self, Budget};
use turnpike_core::lifecycle::{self, Effect, Event, NewTurn, Step};
use turnpike_core::sizes::{self, encoded_len, Budgets};
use turnpike_core::wire::{
    Attachment, AttemptStart, ChatError, ChatErrorCause, ExitClass, ExitReport, HistoryEntry,
    InboundLimits, InboundMessage, OperatorAction, OutboundItem, OutboundKind, ProfileUsed,
    ReplySpan, Role, RunnerEvent, RunnerEventKind, PROFILE_NAME_MAX,
};
use turnpike_core::{chat, texts, ChatId, RunnerId, Timestamp, TurnId, FORMAT_VERSION};

const T0: Timestamp = Timestamp(1_800_000_000_000);
/// The longest timestamp.
const LAST: Timestamp = Timestamp::LAST;

/// Characters that encode largest in JSON, and the rest.
fn nasty_char() -> impl Strategy<Value = char> {
    prop_oneof![
        3 => Just('\u{1}'),
        2 => Just('"'),
        2 => Just('\\'),
        1 => Just('\n'),
        1 => Just('😀'),
        1 => Just('é'),
        1 => any::<char>(),
    ]
}

/// A text of `len` characters from `pattern`, repeated: long texts are built cheaply.
fn text_of(pattern: &[char], len: usize) -> String {
    pattern.iter().cycle().take(len).collect()
}

fn pattern() -> impl Strategy<Value = Vec<char>> {
    prop::collection::vec(nasty_char(), 1..8)
}

/// A string of at most `max` encoded bytes, at the bound or near it.
fn at_most(pattern: &[char], max: usize) -> String {
    sizes::cut(&text_of(pattern, max), max).into_owned()
}

fn budgets() -> impl Strategy<Value = Budgets> {
    (
        prop::sample::select(vec![512 * 1024, 1 << 20, 2 << 20, 8 << 20]),
        1024usize..96 * 1024,
        1024usize..512 * 1024,
        1u32..=100,
        1usize..3000,
    )
        .prop_map(
            |(max_payload, message, history, attempts, chat_queue)| Budgets {
                max_payload,
                message,
                history,
                attempts,
                chat_queue,
            },
        )
        .prop_filter("a configuration the checks allow", |b| b.check().is_ok())
}

/// An inbound message that passes validation, every field at or near its limit.
fn inbound(b: &Budgets, p: &[char], attachments: usize, chat: &ChatId) -> InboundMessage {
    let mut m = InboundMessage {
        v: FORMAT_VERSION,
        id: at_most(p, sizes::MESSAGE_ID_MAX),
        chat: chat.clone(),
        text: String::new(),
        sender: Some(at_most(p, sizes::SENDER_MAX)),
        attachments: (0..attachments)
            .map(|i| Attachment {
                name: at_most(p, sizes::ATTACHMENT_NAME_MAX),
                object: at_most(
                    &format!("{chat}/{i}/")
                        .chars()
                        .chain(p.iter().copied())
                        .collect::<Vec<_>>(),
                    sizes::ATTACHMENT_OBJECT_MAX,
                ),
            })
            .collect(),
    };
    // As many attachments as leave room for a text; the text takes whatever room is left, then
    // shrinks until the whole message is accepted.
    while encoded_len(&m) + 64 > b.message && m.attachments.pop().is_some() {}
    let mut room = b.message.saturating_sub(encoded_len(&m));
    loop {
        m.text = at_most(p, room);
        let limits = InboundLimits {
            message_max: b.message,
            attachments_max: 256,
        };
        match m.check(&limits) {
            Ok(()) => return m,
            Err(_) if room > 0 => room = room.saturating_sub(16.max(room / 64)),
            Err(e) => panic!("no text fits: {e}"),
        }
    }
}

fn op(p: &[char]) -> OperatorAction {
    OperatorAction {
        by: at_most(p, sizes::OPERATOR_MAX),
        at: T0,
    }
}

/// What can happen to a turn, at the sizes the shells let through: any error text (the record
/// bounds it), operator names within their bound, any reason for a permanent error.
#[derive(Debug, Clone)]
enum Step_ {
    Start(u32),
    Land(u32, u32),
    Exit(u32, ExitClass, u32, usize, bool),
    Kill,
    Abandon(usize),
}

fn steps() -> impl Strategy<Value = Vec<Step_>> {
    let class = prop::sample::select(ExitClass::ALL.to_vec());
    prop::collection::vec(
        prop_oneof![
            2 => (1u32..6).prop_map(Step_::Start),
            2 => (1u32..6, 1u32..2000).prop_map(|(a, s)| Step_::Land(a, s)),
            4 => (1u32..6, class, 0u32..3, 0usize..200_000, any::<bool>())
                .prop_map(|(a, c, l, e, cut)| Step_::Exit(a, c, l, e, cut)),
            1 => Just(Step_::Kill),
            1 => (0usize..100_000).prop_map(Step_::Abandon),
        ],
        0..24,
    )
}

/// A work item stamped with the longest profile name a dispatch writes.
fn with_profile(
    mut work: turnpike_core::wire::WorkItem,
    p: &[char],
) -> turnpike_core::wire::WorkItem {
    let name = text_of(p, PROFILE_NAME_MAX);
    work.profile = Some(turnpike_core::sizes::cut(&name, PROFILE_NAME_MAX).into_owned());
    work
}

fn runner(p: &[char]) -> RunnerId {
    // The longest runner id the wire allows.
    let _ = p;
    RunnerId::new("r".repeat(RunnerId::MAX_LEN)).expect("valid")
}

fn event(s: &Step_, p: &[char], record: &turnpike_core::TurnRecord) -> Event {
    // Attempts past the current one are refused by the lifecycle; keep most events current.
    let current = |a: u32| {
        if a > record.attempt {
            record.attempt.max(1)
        } else {
            a
        }
    };
    match s {
        Step_::Start(a) => Event::Started {
            attempt: current(*a),
            runner: runner(p),
            published_at: T0,
        },
        Step_::Land(a, seq) => Event::MessageLanded {
            attempt: current(*a),
            seq: *seq,
            stream_seq: Some(u64::MAX - u64::from(*seq)),
        },
        Step_::Exit(a, class, landed, error, cut) => Event::Exited {
            attempt: current(*a),
            report: ExitReport {
                workspace: None,
                class: *class,
                exit_code: Some(i64::MIN),
                signal: Some(i32::MIN),
                error: Some(text_of(p, *error)),
                messages_landed: *landed,
                reply_span: Some(ReplySpan {
                    first: 1,
                    last: u64::MAX,
                }),
                output_cut: *cut,
                ended_at: T0,
                started: Some(AttemptStart {
                    runner: runner(p),
                    published_at: T0,
                    started_at: Some(T0),
                    profile: Some(ProfileUsed {
                        name: text_of(p, 4 * PROFILE_NAME_MAX),
                        memory_limit: u64::MAX,
                    }),
                }),
            },
        },
        Step_::Kill => Event::KillRequested { action: op(p) },
        Step_::Abandon(n) => Event::Abandoned {
            reason: text_of(p, *n),
        },
    }
}

fn chat_id() -> ChatId {
    ChatId::new("c".repeat(ChatId::MAX_LEN)).expect("valid")
}

/// A chat's history at its budget: built by the real append, from entries of any size.
fn history_at_budget(b: &Budgets, p: &[char], turns: usize) -> (Vec<HistoryEntry>, u64) {
    let budget = Budget {
        entries: 1000,
        bytes: b.history,
    };
    let (mut h, mut dropped) = (Vec::new(), 0);
    for t in 0..turns {
        let said = [
            HistoryEntry {
                role: Role::User,
                text: text_of(p, b.message),
            },
            HistoryEntry {
                role: Role::Bot,
                text: text_of(p, 1 + t * 997 % 5000),
            },
        ];
        history::append(&mut h, &mut dropped, said, budget);
    }
    (h, dropped)
}

fn outbound(kind: OutboundKind, text: String, attempt: u32) -> OutboundItem {
    OutboundItem {
        v: FORMAT_VERSION,
        kind,
        chat: chat_id(),
        turn: TurnId::for_message(&chat_id(), "m"),
        attempt,
        text,
        status_id: (kind == OutboundKind::Status).then(|| "s".repeat(80)),
        r#final: true,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_payload_outgrows_max_payload_at_any_step(
        b in budgets(),
        p in pattern(),
        attachments in 0usize..40,
        turns in 1usize..12,
        steps in steps(),
        agent_text in 0usize..200_000,
    ) {
        let room = b.room();
        let fits = |what: &str, size: usize, bound: usize| -> Result<(), TestCaseError> {
            prop_assert!(size <= bound, "{what}: {size} > its budget {bound} ({b:?})");
            prop_assert!(bound <= room, "{what}: budget {bound} > room {room} ({b:?})");
            Ok(())
        };
        let chat = chat_id();
        let message = inbound(&b, &p, attachments, &chat);
        fits("inbound message", encoded_len(&message), b.message)?;
        let (history, dropped) = history_at_budget(&b, &p, turns);
        fits("history", encoded_len(&history), b.history_max())?;

        // The turn, created waiting and admitted with the chat's history.
        let (waiting, _) = lifecycle::create(
            NewTurn {
                turn: message.turn(),
                message: message.clone(),
                history: Vec::new(),
                max_turn_retry: b.attempts,
                retry_delay: Duration::from_secs(10),
                rerun_of: Some(TurnId::for_rerun(&message.turn(), u32::MAX)),
                created_by: Some(op(&p)),
                admit_now: false,
            },
            T0,
        );
        let mut record = lifecycle::admitted_at_creation(&waiting, history.clone());
        fits("turn record", encoded_len(&record), b.record_max())?;
        for s in &steps {
            let ev = event(s, &p, &record);
            if let Event::Exited { report, .. } = &ev {
                // What the runner publishes: the report bounded as it bounds it.
                let published = RunnerEvent {
                    v: FORMAT_VERSION,
                    turn: record.turn.clone(),
                    chat: chat.clone(),
                    attempt: record.attempt,
                    runner: runner(&p),
                    at: T0,
                    kind: RunnerEventKind::Exited { report: report.clone().bounded() },
                };
                fits("exit report", encoded_len(&published), b.event_max())?;
            }
            let Ok(Step::Changed { record: next, effects }) = lifecycle::apply(&record, &ev, T0) else {
                continue;
            };
            record = *next;
            record.outbox = lifecycle::next_outbox(&record, &effects);
            fits("turn record", encoded_len(&record), b.record_max())?;
            for e in &record.outbox {
                fits("an effect", encoded_len(e), sizes::EFFECT_MAX)?;
                match e {
                    Effect::DispatchAttempt { attempt, .. } => {
                        fits("work item", encoded_len(&with_profile(record.work_item(*attempt), &p)), b.work_item_max())?;
                    }
                    Effect::Notify { text, attempt, .. } => {
                        let item = outbound(OutboundKind::Notice, text.clone(), *attempt);
                        fits("notice", encoded_len(&item), b.outbound_max())?;
                    }
                    _ => {}
                }
            }
        }

        // What the agent says, as landed: each message and status cut to the message budget,
        // the cut marker, progress events.
        let said = text_of(&p, agent_text);
        let landed = sizes::cut(&said, b.message).into_owned();
        fits("bot message", encoded_len(&outbound(OutboundKind::Message, landed.clone(), 100)), b.outbound_max())?;
        let progress = RunnerEvent {
            v: FORMAT_VERSION,
            turn: record.turn.clone(),
            chat: chat.clone(),
            attempt: 100,
            runner: runner(&p),
            at: T0,
            kind: RunnerEventKind::Progress { text: landed },
        };
        fits("progress event", encoded_len(&progress), b.event_max())?;
        let cut = texts::output_cut_notice(u32::MAX, u64::MAX);
        fits("cut marker", encoded_len(&outbound(OutboundKind::Notice, cut, 100)), b.outbound_max())?;
        let refused = message.check(&InboundLimits { message_max: 1024, attachments_max: 0 });
        if let Err(why) = refused {
            let notice = texts::refusal_notice(&why.to_string());
            fits("refusal notice", encoded_len(&outbound(OutboundKind::Notice, notice, 0)), b.outbound_max())?;
        }

        // The chat record at its largest: a full queue, the history, the flag, the clears.
        let mut c = chat::empty(&chat);
        c.history = history;
        c.history_dropped = dropped.max(u64::MAX / 2);
        c.inbound_seq = u64::MAX;
        c.live = Some(record.turn.clone());
        for i in 0..b.chat_queue + 5 {
            let t = TurnId::for_message(&chat, &i.to_string());
            chat::join_bounded(&mut c, &t, None, b.chat_queue);
        }
        let flag = ChatError {
            turn: record.turn.clone(),
            at: T0,
            reason: sizes::cut(&text_of(&p, 10_000), sizes::REASON_MAX).into_owned(),
            cause: Some(ChatErrorCause::PermanentError),
        };
        for _ in 0..=sizes::CLEARED_KEPT {
            c.errored = Some(flag.clone());
            prop_assert!(chat::clear_errored(&mut c, op(&p)));
        }
        prop_assert!(!chat::clear_errored(&mut c, op(&p)), "not flagged: nothing to clear");
        prop_assert_eq!(c.cleared.len(), sizes::CLEARED_KEPT);
        c.errored = Some(flag);
        fits("chat record", encoded_len(&c), b.chat_record_max())?;
    }
}

/// The constants the budgets are made of hold for the largest values each part can take.
#[test]
fn the_fixed_parts_hold_their_worst_case() {
    let p = ['\u{1}'];
    let b = Budgets {
        max_payload: 1 << 20,
        message: 1024,
        history: 1024,
        attempts: 100,
        chat_queue: 1,
    };
    let chat = chat_id();
    let message = inbound(&b, &p, 0, &chat);
    let (mut record, _) = lifecycle::create(
        NewTurn {
            turn: message.turn(),
            message: message.clone(),
            history: Vec::new(),
            max_turn_retry: 100,
            retry_delay: Duration::from_secs(u32::MAX.into()),
            rerun_of: Some(message.turn()),
            created_by: Some(op(&p)),
            admit_now: true,
        },
        LAST,
    );
    // Every attempt dies with the largest error; the last one is killed, then abandoned.
    for k in 1..=100 {
        let report = ExitReport {
            workspace: None,
            class: ExitClass::OomKilled,
            exit_code: Some(i64::MIN),
            signal: Some(i32::MIN),
            error: Some(text_of(&p, 1 << 20)),
            messages_landed: 0,
            reply_span: Some(ReplySpan {
                first: u64::MAX - 1,
                last: u64::MAX,
            }),
            output_cut: true,
            ended_at: LAST,
            started: Some(AttemptStart {
                runner: runner(&p),
                published_at: LAST,
                started_at: Some(LAST),
                profile: Some(ProfileUsed {
                    name: text_of(&p, 4 * PROFILE_NAME_MAX),
                    memory_limit: u64::MAX,
                }),
            }),
        };
        let started = Event::Started {
            attempt: k,
            runner: runner(&p),
            published_at: LAST,
        };
        for ev in [started, Event::Exited { attempt: k, report }] {
            if let Ok(Step::Changed {
                record: next,
                effects,
            }) = lifecycle::apply(&record, &ev, LAST)
            {
                record = *next;
                record.outbox = lifecycle::next_outbox(&record, &effects);
            }
        }
    }
    assert_eq!(record.attempts.len(), 100);
    let worst_attempt = record.attempts.iter().map(encoded_len).max().unwrap_or(0);
    assert!(worst_attempt <= sizes::ATTEMPT_MAX, "{worst_attempt}");
    let attempts: usize = record.attempts.iter().map(encoded_len).sum();
    let outbox: usize = record.outbox.iter().map(encoded_len).sum();
    let rest = encoded_len(&record) - attempts - outbox - encoded_len(&record.message);
    assert!(rest <= sizes::RECORD_FIXED_MAX, "{rest}");
    assert!(encoded_len(&record) <= b.record_max());
}
