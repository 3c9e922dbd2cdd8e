//! Recovery from deaths between protocol steps that the scripted faults never hit (issue 16).

use futures::StreamExt;
use std::time::Duration;
use turnpike_core::lifecycle::TurnState;
use turnpike_core::subjects;
use turnpike_core::wire::ExitClass;
use turnpike_core::{ChatId, TurnId};
use turnpike_jetstream::Bus;
use turnpike_testkit::{CutProxy, NatsServer};
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const ROLE: &str = env!("CARGO_BIN_EXE_test-role");
const T: Duration = Duration::from_secs(60);

fn classes(record: &turnpike_core::TurnRecord) -> Vec<Option<ExitClass>> {
    record
        .attempts
        .iter()
        .map(|a| a.exit.as_ref().map(|e| e.class))
        .collect()
}

/// Item 2: the runner that claimed a retry dies before it reports starting it. The turn is
/// `pending_retry` with a claim, and must still get its next attempt (the claim's lease lapses).
#[tokio::test]
async fn a_retry_whose_runner_dies_between_claim_and_start_is_retried_again() {
    init_logs();
    let server = NatsServer::start();
    let proxy = CutProxy::start(server.port()).await;
    let config = test_config(&server, AGENT);
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = TurnId::for_message(&ChatId::new("chat-r").expect("chat"), "m-1");
    let mut claim2 = bus
        .claims
        .watch(subjects::claim_key(&turn, 2))
        .await
        .expect("watch the claim");
    // A runner in its own process whose every round trip is slow, so that after claiming it
    // still has several to go before it could report the attempt started.
    proxy.set_delay(Duration::from_millis(300));
    let mut doomed = RoleProcess::start(
        ROLE,
        "runner",
        &turnpike_config::Config {
            nats_url: proxy.url(),
            runner_id: Some("doomed".into()),
            ..config.clone()
        },
    );
    send(&bus, "chat-r", "m-1", "die-until:3").await;
    // Attempt 1 dies on it; the moment it claims the retry, it is killed -9.
    claim2
        .next()
        .await
        .expect("attempt 2 claimed")
        .expect("entry");
    doomed.kill9();
    let pending = turnpike_jetstream::turns::load(&bus, &turn)
        .await
        .expect("read")
        .expect("turn")
        .record;
    assert_eq!(pending.state, TurnState::PendingRetry, "{pending:#?}");
    let healthy = start_runner(&turnpike_config::Config {
        runner_id: Some("healthy".into()),
        ..config.clone()
    })
    .await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:#?}");
    assert_eq!(
        classes(&record),
        vec![
            Some(ExitClass::Crashed),
            Some(ExitClass::RunnerLost),
            Some(ExitClass::Clean)
        ]
    );
    assert_eq!(record.retry_count, 2);
    healthy.stop().await;
    for r in roles {
        r.stop().await;
    }
}

/// Item 10: a kill that lands between the dispatcher's create and its join used to leave the
/// killed turn as its chat's live turn forever, so the chat's next message never ran.
#[tokio::test]
async fn a_turn_killed_before_it_joined_its_chat_does_not_wedge_the_chat() {
    init_logs();
    let server = NatsServer::start();
    let proxy = CutProxy::start(server.port()).await;
    let config = test_config(&server, AGENT);
    // The dispatcher's every round trip is slow, so the kill lands between its steps.
    proxy.set_delay(Duration::from_millis(300));
    let dispatcher = start_dispatcher(&turnpike_config::Config {
        nats_url: proxy.url(),
        ..config.clone()
    })
    .await;
    let roles = [
        start_coordinator(&config).await,
        start_runner(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let first = TurnId::for_message(&ChatId::new("chat-w").expect("chat"), "m-1");
    let mut created = bus.turns.watch(first.as_str()).await.expect("watch");
    send(&bus, "chat-w", "m-1", "hang").await;
    created.next().await.expect("created").expect("entry");
    let reply = ops(
        &bus,
        subjects::OPS_KILL,
        serde_json::json!({"v": 1, "by": "tester", "turn": first}),
    )
    .await;
    assert!(reply.ok, "{reply:?}");
    let second = send(&bus, "chat-w", "m-2", "reply:after the kill").await;
    let r = wait_ended(&bus, &second, T).await;
    assert_eq!(r.state, TurnState::Done, "{r:#?}");
    let killed = wait_ended(&bus, &first, T).await;
    assert_eq!(killed.state, TurnState::Killed);
    assert!(killed.attempts.is_empty(), "it never ran: {killed:#?}");
    let chat =
        turnpike_jetstream::chats::update(&bus, &ChatId::new("chat-w").expect("chat"), |c| {
            (false, c.clone())
        })
        .await
        .expect("chat record");
    assert_eq!(chat.live, None, "{chat:#?}");
    assert!(chat.waiting.is_empty(), "{chat:#?}");
    dispatcher.stop().await;
    for r in roles {
        r.stop().await;
    }
}
