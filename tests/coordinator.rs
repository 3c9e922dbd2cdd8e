//! The coordinator against a real nats-server 2.15.1 with process-backend runners and the test
//! agent: retries, give-ups, notices, operator actions, restarts inside the retry delay (of the
//! coordinator and of nats-server), duplicated events, and two coordinators at once.

use futures::StreamExt;
use std::time::Duration;
use turnpike_config::Config;
use turnpike_core::lifecycle::TurnState;
use turnpike_core::subjects;
use turnpike_core::texts;
use turnpike_core::wire::{ChatRecord, ExitClass, OutboundItem, OutboundKind};
use turnpike_core::{ChatId, TurnId};
use turnpike_jetstream::{decode_kv, Bus};
use turnpike_testkit::NatsServer;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const ROLE: &str = env!("CARGO_BIN_EXE_test-role");
const T: Duration = Duration::from_secs(60);

fn of_turn<'a>(items: &'a [OutboundItem], turn: &TurnId) -> Vec<&'a OutboundItem> {
    items.iter().filter(|i| &i.turn == turn).collect()
}

#[tokio::test]
async fn dying_twice_then_replying_takes_three_attempts_with_the_preambles() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "c1", "m1", "die-until:3 show-prompt").await;
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(record.attempts.len(), 3);
    assert_eq!(
        record.attempts[1].preamble.as_deref(),
        Some(texts::retry_preamble(2, 3).as_str())
    );
    assert_eq!(
        record.attempts[2].preamble.as_deref(),
        Some(texts::retry_preamble(3, 3).as_str())
    );
    let items = chat_items(&p.bus, "c1").await;
    // What the agent itself saw on each attempt (its first status line quotes its prompt).
    for k in 2..=3u32 {
        let seen = items
            .iter()
            .find(|i| i.kind == OutboundKind::Status && i.attempt == k)
            .expect("status line of the attempt");
        assert!(
            seen.text
                .starts_with(&format!("prompt: {}\n", texts::retry_preamble(k, 3))),
            "{}",
            seen.text
        );
    }
    let first = items
        .iter()
        .find(|i| i.kind == OutboundKind::Status && i.attempt == 1)
        .expect("status of attempt 1");
    assert_eq!(
        first.text, "prompt: die-until:3 show-prompt",
        "no preamble on attempt 1"
    );
    let replies: Vec<_> = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .collect();
    assert_eq!(replies.len(), 1);
    assert!(
        items.iter().all(|i| i.kind != OutboundKind::Notice),
        "no notice"
    );
    p.stop().await;
}

#[tokio::test]
async fn dying_every_time_gets_exactly_the_budget_then_one_give_up_notice() {
    for n in [0u32, 1, 3, 5] {
        let p = Pipeline::start(AGENT, |c| c.max_turn_retry = n).await;
        let chat = format!("budget-{n}");
        let turn = send(&p.bus, &chat, "m1", "die-until:99").await;
        let record = wait_ended(&p.bus, &turn, T).await;
        let limit = n.max(1);
        assert_eq!(record.state, TurnState::GaveUp, "N={n}");
        assert_eq!(record.attempts.len() as u32, limit, "N={n}");
        assert!(record
            .attempts
            .iter()
            .all(|a| a.exit.as_ref().map(|e| e.class) == Some(ExitClass::Crashed)));
        let items = visible_items(&p.bus, &chat).await;
        let notices: Vec<_> = items
            .iter()
            .filter(|i| i.kind == OutboundKind::Notice)
            .collect();
        assert_eq!(notices.len(), 1, "N={n}: {items:?}");
        assert_eq!(notices[0].text, texts::give_up_notice(limit));
        let flag: ChatRecord = decode_kv(
            &p.bus
                .chats
                .get(&chat)
                .await
                .expect("get")
                .expect("chat flagged"),
        )
        .expect("chat record");
        assert_eq!(flag.errored.map(|e| e.turn), Some(turn));
        p.stop().await;
    }
}

#[tokio::test]
async fn a_partial_reply_then_death_is_not_retried_and_gets_the_plain_notice() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "c3", "m1", "crash-after-reply").await;
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Failed);
    assert_eq!(record.attempts.len(), 1);
    let items = visible_items(&p.bus, "c3").await;
    let kinds: Vec<_> = items.iter().map(|i| i.kind).collect();
    assert_eq!(kinds, vec![OutboundKind::Message, OutboundKind::Notice]);
    assert_eq!(items[1].text, texts::PLAIN_FAILURE_NOTICE);
    assert!(!record.chat_flagged);
    p.stop().await;
}

#[tokio::test]
async fn an_operator_kill_is_recorded_killed_with_no_retry_and_no_notice() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "c4", "m1", "hang").await;
    wait_state(&p.bus, &turn, TurnState::Running).await;
    let r = ops(
        &p.bus,
        subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("alice", turn.clone()),
    )
    .await;
    assert!(r.ok, "{r:?}");
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Killed);
    assert_eq!(record.attempts.len(), 1);
    assert_eq!(record.kill.as_ref().map(|k| k.by.as_str()), Some("alice"));
    assert_eq!(
        record.attempts[0].exit.as_ref().map(|e| e.class),
        Some(ExitClass::OperatorKilled)
    );
    assert!(visible_items(&p.bus, "c4").await.is_empty(), "no notice");
    // A kill after the end answers so.
    let again = ops(
        &p.bus,
        subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("alice", turn.clone()),
    )
    .await;
    assert!(!again.ok);
    assert!(
        again.message.contains("already ended (killed)"),
        "{again:?}"
    );
    let unknown = ops(
        &p.bus,
        subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("alice", TurnId::new("t-nope").expect("id")),
    )
    .await;
    assert!(
        !unknown.ok && unknown.message.contains("no turn"),
        "{unknown:?}"
    );
    p.stop().await;
}

#[tokio::test]
async fn a_kill_during_pending_retry_cancels_the_scheduled_attempt() {
    let p = Pipeline::start(AGENT, |c| c.retry_delay = Duration::from_secs(3)).await;
    let turn = send(&p.bus, "c5", "m1", "die-until:3").await;
    wait_state(&p.bus, &turn, TurnState::PendingRetry).await;
    let r = ops(
        &p.bus,
        subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("bob", turn.clone()),
    )
    .await;
    assert!(r.ok && r.state.as_deref() == Some("killed"), "{r:?}");
    // Well past the due time: attempt 2 never starts.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Killed);
    assert!(record
        .attempts
        .iter()
        .all(|a| a.n == 1 || a.started_at.is_none()));
    let claim = p
        .bus
        .claims
        .get(subjects::claim_key(&turn, 2))
        .await
        .expect("get")
        .expect("the attempt's claim is taken");
    let claim: turnpike_core::wire::ClaimRecord = decode_kv(&claim).expect("claim");
    assert_eq!(claim.holder, turnpike_core::wire::ClaimHolder::Cancelled);
    assert!(visible_items(&p.bus, "c5").await.is_empty());
    p.stop().await;
}

#[tokio::test]
async fn operators_clear_a_chat_and_rerun_an_ended_turn() {
    let p = Pipeline::start(AGENT, |c| c.max_turn_retry = 1).await;
    let turn = send(&p.bus, "c6", "m1", "die-until:2").await;
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::GaveUp);
    let cleared = ops(
        &p.bus,
        subjects::OPS_CLEAR,
        turnpike_core::wire::OpsRequest::chat("carol", ChatId::new("c6").expect("id")),
    )
    .await;
    assert!(cleared.ok, "{cleared:?}");
    let chat: ChatRecord =
        decode_kv(&p.bus.chats.get("c6").await.expect("get").expect("record")).expect("chat");
    assert!(chat.errored.is_none());
    assert_eq!(chat.cleared[0].by, "carol");
    // Re-run: a new turn linked to the old one; the old keeps its one terminal state.
    let rerun = ops(
        &p.bus,
        subjects::OPS_RERUN,
        turnpike_core::wire::OpsRequest::turn("carol", turn.clone()),
    )
    .await;
    assert!(rerun.ok, "{rerun:?}");
    let new_turn = rerun.turn.expect("new turn id");
    assert_ne!(new_turn, turn);
    let again = wait_ended(&p.bus, &new_turn, T).await;
    assert_eq!(again.rerun_of.as_ref(), Some(&turn));
    assert_eq!(
        again.created_by.as_ref().map(|a| a.by.as_str()),
        Some("carol")
    );
    assert_eq!(again.message, record.message);
    assert_eq!(wait_ended(&p.bus, &turn, T).await.state, TurnState::GaveUp);
    p.stop().await;
}

#[tokio::test]
async fn bad_events_are_dead_lettered_and_the_coordinator_keeps_going() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let unknown = serde_json::json!({"v": 1, "turn": "t-unknown", "chat": "c7", "attempt": 1,
        "runner": "r", "at": "2026-12-02T00:00:00Z",
        "kind": {"type": "started", "published_at": "2026-12-02T00:00:00Z"}});
    for (subject, payload) in [
        ("turnpike.events.t-unknown".to_owned(), unknown.to_string()),
        ("turnpike.events.t-garbage".to_owned(), "{{{".to_owned()),
        ("turnpike.events.t-other".to_owned(), unknown.to_string()),
    ] {
        p.bus
            .js
            .publish(subject, bytes::Bytes::from(payload))
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let turn = send(&p.bus, "c7", "m1", "reply:still here").await;
    assert_eq!(wait_ended(&p.bus, &turn, T).await.state, TurnState::Done);
    let mut reasons: Vec<String> = dead_letters(&p.bus)
        .await
        .into_iter()
        .map(|(_, r)| r)
        .collect();
    reasons.sort();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("not in the turns bucket")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("undecodable")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("another turn")),
        "{reasons:?}"
    );
    // Every refusal goes one way, so every one is counted (the subject mismatch and the unknown
    // turn were dead-lettered without being counted before).
    let reply = p
        .bus
        .client
        .request(subjects::OPS_STATS, bytes::Bytes::new())
        .await
        .expect("stats answered");
    let stats: turnpike_core::wire::OpsStats =
        serde_json::from_slice(&reply.payload).expect("stats JSON");
    assert_eq!(stats.counters.dead_lettered, 3, "{:?}", stats.counters);
    p.stop().await;
}

/// Restarts inside the real 10 s delay: the attempt still happens, once, with the right count, and
/// the recorded death → publish gap stays within 1 s of the delay.
async fn check_retry_across_restart(
    restart: impl AsyncFnOnce(&mut NatsServer, &Config, &mut Option<RoleProcess>),
) {
    let mut server = NatsServer::start();
    let config = Config {
        retry_delay: Duration::from_secs(10),
        ..test_config(&server, AGENT)
    };
    let dispatcher = start_dispatcher(&config).await;
    let runner = start_runner(&config).await;
    let mut coordinator = Some(RoleProcess::start(ROLE, "coordinator", &config));
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = send(&bus, "restart", "m1", "die-until:2 show-prompt").await;
    wait_state(&bus, &turn, TurnState::PendingRetry).await;
    restart(&mut server, &config, &mut coordinator).await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(record.attempts.len(), 2, "{record:#?}");
    assert_eq!(record.retry_count, 1);
    let died = record.attempts[0].exit.as_ref().expect("exit").ended_at;
    let published = record.attempts[1].published_at.expect("published");
    let gap = published.since(died);
    assert!(
        gap >= Duration::from_secs(10) && gap <= Duration::from_secs(11),
        "death → publish gap {gap:?}"
    );
    let items = visible_items(&bus, "restart").await;
    let replies: Vec<_> = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .collect();
    assert_eq!(replies.len(), 1, "exactly once: {items:?}");
    assert!(replies[0].text.contains(&texts::retry_preamble(2, 3)));
    // Exactly one run of attempt 2: its claim (created once, ever) names the runner that ran it.
    let claim = bus
        .claims
        .get(subjects::claim_key(&turn, 2))
        .await
        .expect("get")
        .expect("attempt 2 claimed");
    let claim: turnpike_core::wire::ClaimRecord = decode_kv(&claim).expect("claim");
    assert!(matches!(
        claim.holder,
        turnpike_core::wire::ClaimHolder::Runner { ref runner } if Some(runner) == record.attempts[1].runner.as_ref()
    ));
    runner.stop().await;
    dispatcher.stop().await;
    drop(coordinator);
}

#[tokio::test]
async fn a_coordinator_killed_inside_the_delay_still_gets_the_attempt_made_once() {
    check_retry_across_restart(async |_server, config, coordinator| {
        if let Some(c) = coordinator.as_mut() {
            c.kill9();
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        *coordinator = Some(RoleProcess::start(ROLE, "coordinator", config));
    })
    .await;
}

#[tokio::test]
async fn a_nats_server_restart_inside_the_delay_still_gets_the_attempt_made_once() {
    check_retry_across_restart(async |server, _config, _coordinator| {
        tokio::time::sleep(Duration::from_secs(1)).await;
        server.restart();
    })
    .await;
}

/// Re-publish every runner event once more (fresh dedup id), as a flaky network might.
fn duplicate_every_event(bus: &Bus) -> tokio::task::JoinHandle<()> {
    let bus = bus.clone();
    tokio::spawn(async move {
        let mut sub = bus
            .client
            .subscribe(subjects::EVENTS_ALL)
            .await
            .expect("subscribe");
        let mut n = 0u64;
        while let Some(m) = sub.next().await {
            if m.headers.as_ref().and_then(|h| h.get("Test-Dup")).is_some() {
                continue;
            }
            n += 1;
            let mut h = async_nats::HeaderMap::new();
            h.insert("Test-Dup", "1");
            h.insert("Nats-Msg-Id", format!("dup-{n}").as_str());
            if let Some(ct) = m.headers.as_ref().and_then(|x| x.get("Content-Type")) {
                h.insert("Content-Type", ct.as_str());
            }
            if let Ok(ack) = bus
                .js
                .publish_with_headers(m.subject.clone(), h, m.payload.clone())
                .await
            {
                let _ = ack.await;
            }
        }
    })
}

/// The table's outcome for a directive under budget `limit`: (state, attempts).
fn expected(directive: &str, limit: u32) -> (TurnState, u32) {
    match directive.split_once(':') {
        Some(("die-until", k)) => {
            let k: u32 = k.parse().expect("number");
            if k <= limit {
                (TurnState::Done, k.max(1))
            } else {
                (TurnState::GaveUp, limit)
            }
        }
        _ => match directive {
            "crash-after-reply" | "fail" => (TurnState::Failed, 1),
            "silent" => (TurnState::Done, 1),
            _ => (TurnState::Done, 1),
        },
    }
}

fn directive(i: usize) -> String {
    // A fixed mix (deterministic, so a failure is reproducible): mostly deaths.
    match (i * 7 + 3) % 9 {
        0 => "crash-after-reply".into(),
        1 => "fail".into(),
        2 => "silent".into(),
        3 => "reply:ok".into(),
        r => format!("die-until:{}", r - 3),
    }
}

#[tokio::test]
async fn every_event_delivered_twice_changes_no_outcome() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let dup = duplicate_every_event(&p.bus);
    let mut turns = Vec::new();
    for i in 0..12 {
        let d = directive(i);
        // Message ids are unique per stream (JetStream dedup is stream-wide), not per chat.
        turns.push((
            send(&p.bus, &format!("dup{i}"), &format!("m{i}"), &d).await,
            d,
            i,
        ));
    }
    for (turn, d, i) in &turns {
        let record = wait_ended(&p.bus, turn, T).await;
        let (state, attempts) = expected(d, p.config.attempt_limit());
        assert_eq!(
            (record.state, record.attempts.len() as u32),
            (state, attempts),
            "{d}"
        );
        let items = visible_items(&p.bus, &format!("dup{i}")).await;
        let notices = of_turn(&items, turn)
            .into_iter()
            .filter(|x| x.kind == OutboundKind::Notice)
            .count();
        assert!(notices <= 1, "{d}: {items:?}");
    }
    dup.abort();
    p.stop().await;
}

#[tokio::test]
async fn two_coordinators_over_200_turns_give_every_turn_its_table_outcome() {
    let p = Pipeline::start(AGENT, |c| {
        c.runner_slots = 8;
        c.retry_delay = Duration::from_millis(200);
    })
    .await;
    let second = start_coordinator(&p.config).await;
    let extra_runner = start_runner(&Config {
        runner_id: Some("second".into()),
        ..p.config.clone()
    })
    .await;
    let mut turns = Vec::new();
    for i in 0..200 {
        let d = directive(i);
        // A few chats, many turns each: turns of one chat run in parallel here (ordering is
        // the dispatcher's concern, tested elsewhere).
        let chat = format!("many{}", i % 10);
        turns.push((send(&p.bus, &chat, &format!("m{i}"), &d).await, d, chat));
    }
    let limit = p.config.attempt_limit();
    for (turn, d, chat) in &turns {
        let record = wait_ended(&p.bus, turn, Duration::from_secs(180)).await;
        let (state, attempts) = expected(d, limit);
        assert_eq!(
            (record.state, record.attempts.len() as u32),
            (state, attempts),
            "{turn} {d}"
        );
        let _ = chat;
    }
    // Exactly one notice per turn that should have one, and no duplicate bot message.
    for c in 0..10 {
        let chat = format!("many{c}");
        let items = visible_items(&p.bus, &chat).await;
        for (turn, d, _) in turns.iter().filter(|(_, _, ch)| *ch == chat) {
            let mine = of_turn(&items, turn);
            let notices = mine
                .iter()
                .filter(|i| i.kind == OutboundKind::Notice)
                .count();
            let messages = mine
                .iter()
                .filter(|i| i.kind == OutboundKind::Message)
                .count();
            let (state, _) = expected(d, limit);
            let want_notice =
                matches!(state, TurnState::GaveUp | TurnState::Failed) || d == "silent";
            assert_eq!(notices, usize::from(want_notice), "{turn} {d}");
            assert!(messages <= 1, "{turn} {d}: {messages} messages");
        }
    }
    second.stop().await;
    extra_runner.stop().await;
    p.stop().await;
}

#[tokio::test]
async fn a_pending_retry_whose_schedule_was_lost_is_scheduled_again_by_the_sweep() {
    let p = Pipeline::start(AGENT, |c| c.retry_delay = Duration::from_secs(3)).await;
    let turn = send(&p.bus, "c8", "m1", "die-until:2").await;
    wait_state(&p.bus, &turn, TurnState::PendingRetry).await;
    // Lose the schedule, as if the effect had never been carried out.
    p.bus
        .js
        .get_stream(subjects::STREAM_WORK)
        .await
        .expect("work stream")
        .purge()
        .filter(subjects::work_schedule(&turn, 2))
        .await
        .expect("purge the schedule");
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(record.attempts.len(), 2);
    let replies = visible_items(&p.bus, "c8")
        .await
        .into_iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .count();
    assert_eq!(replies, 1);
    p.stop().await;
}

#[tokio::test]
async fn replaying_an_outbox_after_a_crash_sends_one_notice_and_one_attempt() {
    use turnpike_core::lifecycle::{Effect, Event};
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let (mut record, effects) = new_turn("c9", true);
    record.outbox = effects;
    let turn = record.turn.clone();
    let (created, _) = turnpike_store::turns::create(&bus, record)
        .await
        .expect("create");
    // Attempt 1 dispatched twice (a crash before the outbox was cleared, then a replay).
    for e in created.record.outbox.clone() {
        turnpike_store::turns::execute(&bus, &created.record, &e)
            .await
            .expect("effect");
    }
    turnpike_store::turns::run_outbox(&bus, created)
        .await
        .expect("outbox");
    let work = bus
        .js
        .get_stream(subjects::STREAM_WORK)
        .await
        .expect("work")
        .info()
        .await
        .expect("info")
        .state
        .messages;
    assert_eq!(work, 1, "one work item for attempt 1");
    // The attempt dies: give-up effects, carried out twice.
    let exit = Event::Exited {
        attempt: 1,
        report: turnpike_core::wire::ExitReport {
            class: ExitClass::Crashed,
            exit_code: Some(1),
            signal: None,
            error: None,
            messages_landed: 0,
            replies: vec![],
            ended_at: turnpike_jetstream::now(),
            started: None,
        },
    };
    let applied = turnpike_store::turns::apply_event(&bus, &turn, &exit)
        .await
        .expect("apply");
    let current = applied.current().clone();
    assert!(current
        .record
        .outbox
        .iter()
        .any(|e| matches!(e, Effect::Notify { .. })));
    for e in current.record.outbox.clone() {
        turnpike_store::turns::execute(&bus, &current.record, &e)
            .await
            .expect("effect");
    }
    turnpike_store::turns::run_outbox(&bus, current)
        .await
        .expect("outbox");
    let notices: Vec<_> = visible_items(&bus, "c9")
        .await
        .into_iter()
        .filter(|i| i.kind == OutboundKind::Notice)
        .collect();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].text, texts::give_up_notice(1));
}

#[tokio::test]
async fn counters_are_served_to_operators() {
    let p = Pipeline::start(AGENT, |c| c.max_turn_retry = 2).await;
    let a = send(&p.bus, "c10", "m1", "reply:hi").await;
    let b = send(&p.bus, "c11", "m2", "die-until:99").await;
    let c = send(&p.bus, "c12", "m3", "silent").await;
    for t in [&a, &b, &c] {
        wait_ended(&p.bus, t, T).await;
    }
    let reply = p
        .bus
        .client
        .request(subjects::OPS_STATS, bytes::Bytes::new())
        .await
        .expect("stats answered");
    let stats: turnpike_core::wire::OpsStats =
        serde_json::from_slice(&reply.payload).expect("stats JSON");
    let s = stats.counters;
    assert_eq!(
        (s.turns_done, s.turns_gave_up, s.silent_turns),
        (2, 1, 1),
        "{s:?}"
    );
    assert_eq!(s.retries_scheduled, 1);
    // All of it happened within the last hour.
    let h = s.last_hour;
    assert_eq!(
        (
            h.turns_done,
            h.turns_gave_up,
            h.silent_turns,
            h.retries_scheduled
        ),
        (2, 1, 1, 1),
        "{h:?}"
    );
    assert!(stats.live.is_empty(), "{:?}", stats.live);
    // The standard service API shows the same counters.
    let reply = p
        .bus
        .client
        .request("$SRV.STATS.turnpike-coordinator", bytes::Bytes::new())
        .await
        .expect("$SRV.STATS answered");
    let v: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON");
    assert_eq!(v["endpoints"][0]["data"]["turns_gave_up"], 1, "{v}");
    p.stop().await;
}

/// Issue 16, security: an event is believed only from the runner that holds the attempt's claim.
/// A forged exit report from another runner id used to end a running turn; it is dead-lettered
/// and changes nothing.
#[tokio::test]
async fn an_event_from_a_runner_that_does_not_hold_the_claim_is_refused() {
    use turnpike_core::wire::{ExitReport, RunnerEvent, RunnerEventKind};
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "forged", "m-1", "hang").await;
    let running = wait_state(&p.bus, &turn, TurnState::Running).await;
    let holder = running.attempts[0].runner.clone().expect("its runner");
    let forged = RunnerEvent {
        v: turnpike_core::FORMAT_VERSION,
        turn: turn.clone(),
        chat: running.chat.clone(),
        attempt: 1,
        runner: turnpike_core::RunnerId::new("mallory").expect("id"),
        at: turnpike_jetstream::now(),
        kind: RunnerEventKind::Exited {
            report: ExitReport {
                class: ExitClass::Clean,
                exit_code: Some(0),
                signal: None,
                error: None,
                messages_landed: 1,
                replies: vec![],
                ended_at: turnpike_jetstream::now(),
                started: None,
            },
        },
    };
    assert_ne!(forged.runner, holder);
    turnpike_jetstream::publish(
        &p.bus.js,
        p.bus.codec,
        subjects::events(&turn),
        Some("forged-exit"),
        &forged,
    )
    .await
    .expect("the events stream takes it");
    let dead = turnpike_testkit::eventually(T, "the forged event dead-lettered", || async {
        dead_letters(&p.bus)
            .await
            .into_iter()
            .find(|(_, reason)| reason.contains("mallory"))
    })
    .await;
    assert!(dead.1.contains("claim"), "{dead:?}");
    let still = turnpike_store::turns::load(&p.bus, &turn)
        .await
        .expect("read")
        .expect("turn")
        .record;
    assert_eq!(still.state, TurnState::Running, "{still:#?}");
    assert!(kill_turn(&p.bus, &turn).await.ok);
    assert_eq!(wait_ended(&p.bus, &turn, T).await.state, TurnState::Killed);
    p.stop().await;
}

/// A new turn of `chat` (message `m1`) as the dispatcher creates it, and its effects.
fn new_turn(
    chat: &str,
    admit_now: bool,
) -> (
    turnpike_core::TurnRecord,
    Vec<turnpike_core::lifecycle::Effect>,
) {
    use turnpike_core::lifecycle::{self, NewTurn};
    let chat = turnpike_core::ChatId::new(chat).expect("chat");
    let message = turnpike_core::wire::InboundMessage {
        v: 1,
        id: "m1".into(),
        chat: chat.clone(),
        text: "x".into(),
        sender: None,
        attachments: vec![],
    };
    lifecycle::create(
        NewTurn {
            turn: TurnId::for_message(&chat, "m1"),
            message,
            history: vec![],
            max_turn_retry: 1,
            retry_delay: Duration::from_secs(1),
            rerun_of: None,
            created_by: None,
            admit_now,
        },
        turnpike_jetstream::now(),
    )
}

fn operator_kill() -> turnpike_core::lifecycle::Event {
    turnpike_core::lifecycle::Event::KillRequested {
        action: turnpike_core::wire::OperatorAction {
            by: "op".into(),
            at: turnpike_jetstream::now(),
        },
    }
}

/// Found by the model checker: a turn killed before it joined its chat, then joined by a
/// dispatcher that died before admitting it. The replay of its message found the turn ended
/// and only counted the message taken: the ended turn stayed the chat's live one, and the
/// chat never moved again.
#[tokio::test]
async fn a_turn_killed_before_it_joined_does_not_hold_its_chat_after_a_replay() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let (record, _) = new_turn("c10", false);
    let chat = record.chat.clone();
    let turn = record.turn.clone();
    // The dispatcher creates the turn...
    turnpike_store::turns::create(&bus, record.clone())
        .await
        .expect("create");
    // ...an operator kills it before it joins (its release finds nothing to release)...
    let applied = turnpike_store::turns::apply_event(&bus, &turn, &operator_kill())
        .await
        .expect("kill");
    turnpike_store::turns::run_outbox(&bus, applied.current().clone())
        .await
        .expect("outbox");
    // ...the dispatcher joins it and dies before admitting it...
    turnpike_store::chats::join(&bus, &chat, &turn, Some(1))
        .await
        .expect("join");
    // ...and the message comes back.
    turnpike_store::turns::create_in_chat(&bus, record, Some(1))
        .await
        .expect("replay");
    let c: ChatRecord =
        decode_kv(&bus.chats.get("c10").await.expect("get").expect("record")).expect("chat");
    assert_eq!(c.live, None, "the ended turn holds its chat: {c:?}");
    assert_eq!(c.inbound_seq, 1);
}

/// Found by the model checker: an ended turn left the live index while carrying out its
/// `Ended` effect, before its outbox was cleared; a crash in between left an outbox that no
/// sweep would ever see. Carrying out the effects (and crashing before the clear) must leave
/// the turn listed, and the clear unlist it.
#[tokio::test]
async fn an_ended_turn_stays_listed_until_its_outbox_is_cleared() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let (record, _) = new_turn("c11", false);
    let turn = record.turn.clone();
    turnpike_store::turns::create_in_chat(&bus, record, Some(1))
        .await
        .expect("create");
    let applied = turnpike_store::turns::apply_event(&bus, &turn, &operator_kill())
        .await
        .expect("kill");
    let current = applied.current().clone();
    for e in &current.record.outbox {
        turnpike_store::turns::execute(&bus, &current.record, e)
            .await
            .expect("effect");
    }
    let listed = || async {
        bus.live
            .get(turn.as_str())
            .await
            .expect("live get")
            .is_some_and(|v| !v.is_empty())
    };
    assert!(listed().await, "unlisted with its outbox not cleared");
    turnpike_store::turns::run_outbox(&bus, current)
        .await
        .expect("outbox");
    assert!(!listed().await, "still listed once ended and cleared");
}
