//! Operator kills that stick (issue 16, item 1). A kill is a durable fence move, not only a
//! fire-and-forget message: whatever the runner missed on the wire, a killed turn never posts,
//! and its run stops.

use futures::StreamExt;
use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::subjects;
use turnpike_core::wire::{ExitClass, OutboundKind};
use turnpike_core::TurnId;
use turnpike_store::Bus;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const T: Duration = Duration::from_secs(60);

/// Nothing of the turn but notices and its status posts, and its final status is its last item.
async fn assert_posted_nothing(bus: &Bus, chat: &str, turn: &TurnId) {
    let items: Vec<_> = chat_items(bus, chat)
        .await
        .into_iter()
        .filter(|i| &i.turn == turn)
        .collect();
    assert!(
        items.iter().all(|i| i.kind != OutboundKind::Message),
        "a killed turn posted: {items:#?}"
    );
    assert!(
        items.last().is_some_and(|i| i.r#final),
        "the final status is the turn's last item: {items:#?}"
    );
}

/// The turn ends killed: its runner reports the attempt killed (however late it saw the kill),
/// and, that report being its last act, nothing of it landed.
async fn assert_killed(bus: &Bus, chat: &str, turn: &TurnId) {
    let record = wait_ended(bus, turn, T).await;
    assert_eq!(record.state, TurnState::Killed);
    assert_eq!(
        exit_report(bus, turn, 1).await.class,
        ExitClass::OperatorKilled
    );
    assert_posted_nothing(bus, chat, turn).await;
}

#[tokio::test]
async fn a_kill_sent_the_instant_the_attempt_is_claimed_sticks() {
    init_logs();
    let f = Faulty::start(AGENT).await;
    let (proxy, config) = (&f.proxy, &f.config);
    let roles = [
        start_dispatcher(config).await,
        start_coordinator(config).await,
    ];
    // Every round trip of the runner takes over half a second, so the kill below is decided
    // while the runner is between its claim and everything after it, whatever the scheduling.
    proxy.set_delay(Duration::from_millis(300));
    let runner = start_runner(&f.through_proxy()).await;
    let bus = Bus::connect(config, "test").await.expect("bus");
    let turn = TurnId::for_message(&turnpike_core::ChatId::new("chat-k").expect("chat"), "m-1");
    let mut claims = turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_CLAIMS)
        .await
        .watch(subjects::claim_key(&turn, 1))
        .await
        .expect("watch the claim");
    send(&bus, "chat-k", "m-1", "sleep:1.5").await;
    claims
        .next()
        .await
        .expect("the claim appears")
        .expect("entry");
    let reply = kill_turn(&bus, &turn).await;
    assert!(reply.ok, "{reply:?}");
    assert_killed(&bus, "chat-k", &turn).await;
    runner.stop().await;
    for r in roles {
        r.stop().await;
    }
}

#[tokio::test]
async fn a_kill_the_runner_never_received_still_stops_its_run() {
    init_logs();
    let f = Faulty::start(AGENT).await;
    let (proxy, config) = (&f.proxy, &f.config);
    let roles = [
        start_dispatcher(config).await,
        start_coordinator(config).await,
    ];
    let runner = start_runner(&f.through_proxy()).await;
    let bus = Bus::connect(config, "test").await.expect("bus");
    let turn = send(&bus, "chat-l", "m-1", "hang").await;
    wait_state(&bus, &turn, TurnState::Running).await;
    // The runner is off the wire while the kill is sent: the message meant for it is gone.
    proxy.cut();
    let reply = kill_turn(&bus, &turn).await;
    assert!(reply.ok, "{reply:?}");
    proxy.restore();
    // It still stops: the fence moved, and a running attempt checks its fence every heartbeat.
    assert_killed(&bus, "chat-l", &turn).await;
    runner.stop().await;
    for r in roles {
        r.stop().await;
    }
}

/// The kill on the wire is what stops a run at once: with heartbeats ten minutes apart, the
/// fence check cannot be what ends this run within a minute. (Runners hear kills on one
/// subscription of their own and route them to the runs registered for them.)
#[tokio::test]
async fn a_kill_on_the_wire_stops_a_running_attempt_without_waiting_for_a_heartbeat() {
    init_logs();
    let server = turnpike_testkit::NatsServer::start();
    let config = turnpike_config::Config {
        heartbeat: Duration::from_secs(600),
        lease: Duration::from_secs(1800),
        ..test_config(&server, AGENT)
    };
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
        start_runner(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = send(&bus, "chat-w", "kill-wire-1", "hang").await;
    wait_state(&bus, &turn, TurnState::Running).await;
    let reply = kill_turn(&bus, &turn).await;
    assert!(reply.ok, "{reply:?}");
    assert_killed(&bus, "chat-w", &turn).await;
    for r in roles {
        r.stop().await;
    }
}
