use super::*;
use crate::codec::Codec;

#[test]
fn exit_classes_display_as_serde_spells_them() {
    for c in ExitClass::ALL {
        assert_eq!(
            serde_json::to_value(c).expect("json"),
            serde_json::json!(c.to_string())
        );
    }
}
#[test]
fn outbound_kinds_are_named_as_serde_spells_them() {
    for k in [
        OutboundKind::Message,
        OutboundKind::Status,
        OutboundKind::Notice,
    ] {
        assert_eq!(
            serde_json::to_value(k).expect("json"),
            serde_json::json!(k.as_str())
        );
    }
}

#[test]
fn roles_display_as_serde_spells_them() {
    for r in [Role::User, Role::Bot, Role::Note] {
        assert_eq!(
            serde_json::to_value(r).expect("json"),
            serde_json::json!(r.to_string())
        );
    }
}

use serde::de::DeserializeOwned;
use std::fmt::Debug;

fn chat() -> ChatId {
    ChatId::new("chat-1").expect("valid")
}
fn turn() -> TurnId {
    TurnId::for_message(&chat(), "m1")
}
fn runner() -> RunnerId {
    RunnerId::new("runner-a").expect("valid")
}
fn inbound() -> InboundMessage {
    InboundMessage {
        v: FORMAT_VERSION,
        id: "m1".into(),
        chat: chat(),
        text: "hello ✓".into(),
        sender: Some("ann".into()),
        attachments: vec![Attachment {
            name: "report.pdf".into(),
            object: "att/t-1/report.pdf".into(),
        }],
    }
}

fn round_trip<T: Serialize + DeserializeOwned + Versioned + PartialEq + Debug>(value: T) {
    for codec in [Codec::Json, Codec::Msgpack] {
        let bytes = codec.encode(&value).expect("encodes");
        let back: T = codec.decode(&bytes).expect("decodes");
        assert_eq!(back, value, "{codec:?}");
    }
    // Every payload carries its format version.
    let json: serde_json::Value =
        serde_json::from_slice(&Codec::Json.encode(&value).expect("encodes")).expect("json");
    assert_eq!(json["v"], serde_json::json!(FORMAT_VERSION));
}

fn work() -> WorkItem {
    WorkItem {
        workspace: None,
        v: FORMAT_VERSION,
        turn: turn(),
        chat: chat(),
        attempt: 2,
        max_attempts: 3,
        message: inbound(),
        history: vec![
            HistoryEntry {
                role: Role::User,
                text: "q".into(),
            },
            HistoryEntry {
                role: Role::Bot,
                text: "a".into(),
            },
        ],
        profile: Some("big".into()),
    }
}

#[test]
fn every_message_round_trips_in_both_codecs() {
    round_trip(inbound());
    round_trip(work());
    round_trip(AgentInput::from_work(
        &work(),
        vec!["/turnpike/attachments/report.pdf".into()],
        Timestamp(1_800_000_300_000),
    ));
    let at = Timestamp(1_800_000_000_000);
    for kind in [
        RunnerEventKind::Started { published_at: at },
        RunnerEventKind::MessageLanded {
            seq: 1,
            stream_seq: Some(42),
        },
        RunnerEventKind::MessageLanded {
            seq: 2,
            stream_seq: None,
        },
        RunnerEventKind::Progress {
            text: "thinking".into(),
        },
    ]
    .into_iter()
    .chain(
        ExitClass::ALL
            .into_iter()
            .map(|class| RunnerEventKind::Exited {
                report: ExitReport {
                    workspace: None,
                    class,
                    exit_code: Some(137),
                    signal: Some(9),
                    error: Some("why".into()),
                    messages_landed: 1,
                    reply_span: Some(ReplySpan::at(7)),
                    output_cut: class == ExitClass::Clean,
                    ended_at: at,
                    started: Some(AttemptStart {
                        runner: runner(),
                        published_at: at,
                        started_at: Some(at),
                        profile: None,
                    }),
                },
            }),
    ) {
        round_trip(RunnerEvent {
            v: FORMAT_VERSION,
            turn: turn(),
            chat: chat(),
            attempt: 1,
            runner: runner(),
            at,
            kind,
        });
    }
    for kind in [
        OutboundKind::Message,
        OutboundKind::Status,
        OutboundKind::Notice,
    ] {
        round_trip(OutboundItem {
            v: FORMAT_VERSION,
            kind,
            chat: chat(),
            turn: turn(),
            attempt: 1,
            text: "hi".into(),
            status_id: (kind == OutboundKind::Status).then(|| "status-x".into()),
            r#final: kind == OutboundKind::Status,
        });
    }
    round_trip(ChatRecord {
        workspace: None,
        v: FORMAT_VERSION,
        chat: chat(),
        live: Some(turn()),
        waiting: vec![turn()],
        history: vec![HistoryEntry {
            role: Role::User,
            text: "q".into(),
        }],
        history_dropped: 3,
        inbound_seq: 42,
        errored: Some(ChatError {
            turn: turn(),
            at,
            reason: "gave up".into(),
            cause: Some(ChatErrorCause::GaveUp),
        }),
        cleared: vec![OperatorAction {
            by: "op".into(),
            at,
        }],
    });
    for holder in [
        ClaimHolder::Runner { runner: runner() },
        ClaimHolder::Cancelled,
    ] {
        round_trip(ClaimRecord {
            v: FORMAT_VERSION,
            turn: turn(),
            attempt: 1,
            holder,
            at,
            token: Some("p-1".into()),
        });
    }
    round_trip(RunnerPresence {
        v: FORMAT_VERSION,
        runner: runner(),
        host: "h".into(),
        backend: "docker".into(),
        slots: 4,
        slots_in_use: 1,
        version: "0.1.0".into(),
        at,
    });
}

#[test]
fn outbound_json_matches_the_public_contract() {
    let item = OutboundItem {
        v: FORMAT_VERSION,
        kind: OutboundKind::Status,
        chat: chat(),
        turn: turn(),
        attempt: 2,
        text: "working".into(),
        status_id: Some("status-1".into()),
        r#final: false,
    };
    let json: serde_json::Value = serde_json::to_value(&item).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"v": 1, "kind": "status", "chat": "chat-1", "turn": turn().as_str(),
            "attempt": 2, "text": "working", "status_id": "status-1"})
    );
}

#[test]
fn agent_lines_parse_as_documented() {
    let m: AgentLine = serde_json::from_str(r#"{"type":"message","text":"hi"}"#).expect("message");
    assert_eq!(m, AgentLine::Message { text: "hi".into() });
    let r: AgentLine =
        serde_json::from_str(r#"{"type":"result","status":"error","error":"x"}"#).expect("result");
    assert_eq!(
        r,
        AgentLine::Result {
            status: AgentStatus::Error,
            error: Some("x".into())
        }
    );
    assert!(serde_json::from_str::<AgentLine>(r#"{"type":"nope"}"#).is_err());
}

#[test]
fn a_kill_request_targets_its_attempt_and_an_unreadable_one_every_attempt() {
    let kill = KillRequest {
        v: FORMAT_VERSION,
        turn: TurnId::new("t-1").expect("id"),
        attempt: 2,
        by: "alice".into(),
    };
    let json = kill.to_json();
    assert!(KillRequest::targets(&json, 2));
    assert!(!KillRequest::targets(&json, 3));
    // An older coordinator's bare attempt number.
    assert!(KillRequest::targets(b"2", 2));
    assert!(!KillRequest::targets(b"2", 3));
    assert!(KillRequest::targets(b"", 3));
    assert!(KillRequest::targets(b"{garbage", 3));
}

#[test]
fn outcome_reasons_display_as_serde_spells_them() {
    use crate::record::OutcomeReason::*;
    for r in [
        Replied,
        SilentTurn,
        AgentFailed,
        CouldNotStart,
        DiedAfterReply,
        BudgetSpent,
        OperatorKilled,
    ] {
        assert_eq!(
            serde_json::to_value(r).expect("json"),
            serde_json::json!(r.to_string())
        );
    }
}

/// Records and reports written before reply spans listed every sequence (`replies`); they are
/// read as their span, in either codec, without keeping the list.
#[test]
fn an_older_list_of_reply_sequences_is_read_as_its_span() {
    let old = serde_json::json!({
        "class": "clean", "messages_landed": 3, "replies": [12, 10, 11],
        "ended_at": "2026-12-01T00:00:00Z"
    });
    let report: ExitReport = serde_json::from_value(old.clone()).expect("reads");
    assert_eq!(
        report.reply_span,
        Some(ReplySpan {
            first: 10,
            last: 12
        })
    );
    let packed = rmp_serde::to_vec_named(&old).expect("packs");
    let report: ExitReport = rmp_serde::from_slice(&packed).expect("reads msgpack");
    assert_eq!(report.reply_span.map(|s| s.last), Some(12));
    // What this release writes: the span, under its own name.
    let written = serde_json::to_value(&report).expect("writes");
    assert_eq!(
        written["reply_span"],
        serde_json::json!({"first": 10, "last": 12})
    );
    assert!(written.get("replies").is_none());
    let empty = serde_json::json!({
        "class": "clean", "messages_landed": 0, "replies": [],
        "ended_at": "2026-12-01T00:00:00Z"
    });
    let report: ExitReport = serde_json::from_value(empty).expect("reads");
    assert_eq!(report.reply_span, None);
}

#[test]
fn an_ops_request_bounds_what_it_records() {
    let turn = TurnId::new("t-1").expect("id");
    assert_eq!(OpsRequest::turn("carol", turn.clone()).check(), Ok(()));
    assert!(OpsRequest::turn("", turn.clone()).check().is_err());
    assert!(OpsRequest::turn("x".repeat(200), turn.clone())
        .check()
        .is_err());
    let long_id = OpsRequest::turn("carol", turn.clone()).with_id("i".repeat(200));
    assert!(long_id.check().is_err());
    assert_eq!(
        OpsRequest::turn("carol", turn).with_id("click-1").check(),
        Ok(())
    );
}

#[test]
fn coordinators_counters_add_up_and_their_hour_is_the_shortest() {
    let one = CountersSnapshot {
        turns: TurnCounts {
            turns_done: 2,
            ..TurnCounts::default()
        },
        events_applied: 5,
        last_hour: TurnCounts {
            turns_done: 1,
            runner_lost: 1,
            ..TurnCounts::default()
        },
        window_start_ms: 1_000,
        ..CountersSnapshot::default()
    };
    let other = CountersSnapshot {
        turns: TurnCounts {
            turns_done: 3,
            ..TurnCounts::default()
        },
        queued_long: 4,
        last_hour: TurnCounts {
            turns_done: 2,
            ..TurnCounts::default()
        },
        window_start_ms: 7_000,
        ..CountersSnapshot::default()
    };
    let mut total = CountersSnapshot::default();
    total.add(&one);
    total.add(&other);
    assert_eq!(
        total,
        CountersSnapshot {
            turns: TurnCounts {
                turns_done: 5,
                ..TurnCounts::default()
            },
            events_applied: 5,
            queued_long: 4,
            last_hour: TurnCounts {
                turns_done: 3,
                runner_lost: 1,
                ..TurnCounts::default()
            },
            window_start_ms: 7_000,
            ..CountersSnapshot::default()
        }
    );
}

#[test]
fn counters_keep_their_turn_counts_at_the_top_of_the_object() {
    let s = CountersSnapshot {
        turns: TurnCounts {
            turns_done: 2,
            ..TurnCounts::default()
        },
        last_hour: TurnCounts {
            turns_done: 1,
            ..TurnCounts::default()
        },
        ..CountersSnapshot::default()
    };
    let json: serde_json::Value = serde_json::to_value(&s).expect("encode");
    assert_eq!(json["turns_done"], 2, "{json}");
    assert_eq!(json["last_hour"]["turns_done"], 1, "{json}");
    assert!(json.get("turns").is_none(), "{json}");
    // An older coordinator's answer, flat as ever, reads the same.
    let old: CountersSnapshot =
        serde_json::from_str(r#"{"turns_done":2,"last_hour":{"turns_done":1}}"#).expect("decode");
    assert_eq!(old, s);
}

#[test]
fn the_agents_input_is_one_flat_document() {
    let input = AgentInput::from_work(
        &work(),
        vec!["/turnpike/attachments/a.txt".into()],
        Timestamp(1_800_000_300_000),
    );
    let json: serde_json::Value = serde_json::to_value(&input).expect("encode");
    for field in [
        "v",
        "turn",
        "chat",
        "attempt",
        "max_attempts",
        "prompt",
        "message",
        "history",
        "attachments",
        "deadline",
    ] {
        assert!(json.get(field).is_some(), "{field} missing: {json}");
    }
    assert_eq!(json["deadline"], "2027-01-15T08:05:00.000Z", "{json}");
    assert!(json.get("work").is_none(), "{json}");
}

mod pages {
    use super::*;
    use crate::record::TurnState;
    use proptest::prelude::*;

    fn live(i: usize, created: u64, state: TurnState) -> LiveTurn {
        LiveTurn {
            turn: crate::TurnId::new(format!("t-{i:04}")).expect("id"),
            chat: crate::ChatId::new(format!("c-{}", i % 7)).expect("id"),
            state,
            attempt: 1,
            max_attempts: 3,
            runner: None,
            started_at: None,
            next_attempt_due: None,
            created_at: Timestamp::from_millis(created),
        }
    }

    const STATES: [TurnState; 3] = [TurnState::Queued, TurnState::Running, TurnState::Waiting];

    proptest! {
        /// A page picked by selection is exactly the page of the whole list sorted: newest
        /// first, ties by id, whatever the offset and limit (past the end included).
        #[test]
        fn a_live_page_is_the_sorted_lists_page(
            created in proptest::collection::vec((0u64..20, 0usize..3), 0..60),
            state in proptest::option::of(0usize..3),
            offset in 0usize..70,
            limit in 0usize..70,
        ) {
            let turns: Vec<LiveTurn> = created
                .iter()
                .enumerate()
                .map(|(i, (c, s))| live(i, *c, STATES[*s]))
                .collect();
            let query = LiveQuery {
                v: FORMAT_VERSION,
                state: state.map(|s| STATES[s]),
                since: None,
                offset,
                limit,
            };
            let mut sorted: Vec<&LiveTurn> = turns.iter().filter(|t| t.matches(&query)).collect();
            sorted.sort_by(|a, b| b.created_at.cmp(&a.created_at).then_with(|| a.turn.cmp(&b.turn)));
            let want: Vec<LiveTurn> = sorted.iter().skip(offset).take(limit).map(|t| (*t).clone()).collect();
            let got = LivePage::of(turns.iter(), &query);
            prop_assert_eq!(got.total, sorted.len());
            prop_assert_eq!(got.turns, want);
        }

        /// The same for errored chats: most recently flagged first, ties by chat.
        #[test]
        fn an_errored_page_is_the_sorted_lists_page(
            at in proptest::collection::vec(0u64..20, 0..60),
            since in proptest::option::of(0u64..20),
            offset in 0usize..70,
            limit in 0usize..70,
        ) {
            let chats: Vec<ErroredChat> = at
                .iter()
                .enumerate()
                .map(|(i, at)| {
                    let chat = crate::ChatId::new(format!("c-{i:04}")).expect("id");
                    ErroredChat {
                        error: ChatError {
                            turn: crate::TurnId::for_message(&chat, "m"),
                            at: Timestamp::from_millis(*at),
                            reason: "gave up".into(),
                            cause: None,
                        },
                        chat,
                        cleared_last: None,
                    }
                })
                .collect();
            let query = ErroredQuery {
                v: FORMAT_VERSION,
                since: since.map(Timestamp::from_millis),
                offset,
                limit,
            };
            let mut sorted: Vec<&ErroredChat> = chats
                .iter()
                .filter(|c| query.since.is_none_or(|t| c.error.at >= t))
                .collect();
            sorted.sort_by(|a, b| b.error.at.cmp(&a.error.at).then_with(|| a.chat.cmp(&b.chat)));
            let want: Vec<ErroredChat> = sorted.iter().skip(offset).take(limit).map(|c| (*c).clone()).collect();
            let got = ErroredPage::of(chats.iter(), &query);
            prop_assert_eq!(got.total, sorted.len());
            prop_assert_eq!(got.chats, want);
        }
    }
}
