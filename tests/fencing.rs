//! A runner cut off from NATS mid-run: it stops its own run before its lease lapses, the
//! coordinator declares the attempt lost (moving the turn's fence), the turn is retried on
//! another runner, and the bot message the cut-off runner buffered — flushed when it reconnects —
//! is refused by the server and never lands.

use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::wire::{ExitClass, OutboundKind};
use turnpike_store::Bus;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const T: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_cut_off_runners_late_output_is_refused_and_the_turn_retried_elsewhere() {
    init_logs();
    let f = Faulty::start(AGENT).await;
    let (proxy, config) = (&f.proxy, &f.config);
    let roles = [
        start_dispatcher(config).await,
        start_coordinator(config).await,
    ];
    // The runner that will be cut off talks to NATS only through the proxy.
    let cut_runner = start_runner(&turnpike_config::Config {
        runner_id: Some("cut-off".into()),
        ..f.through_proxy()
    })
    .await;
    let bus = Bus::connect(config, "test").await.expect("bus");
    // Replies after 1.5 s: while the runner is cut off, before it gives up on its lease.
    let turn = send(&bus, "chat-f", "m-1", "sleep:1.5").await;
    wait_state(&bus, &turn, TurnState::Running).await;
    proxy.cut();
    // A healthy runner joins to take the retry.
    let healthy = start_runner(&turnpike_config::Config {
        runner_id: Some("healthy".into()),
        ..config.clone()
    })
    .await;
    // The coordinator declares attempt 1 lost once its lease lapses; attempt 2 runs elsewhere.
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(record.attempts.len(), 2, "{record:#?}");
    assert_eq!(
        record.attempts[0].exit.as_ref().map(|e| e.class),
        Some(ExitClass::RunnerLost)
    );
    assert_eq!(record.attempts[0].messages_landed, 0);
    assert_eq!(
        record.attempts[1].runner.as_ref().map(|r| r.as_str()),
        Some("healthy")
    );
    // Reconnect the cut-off runner: whatever it buffered is flushed now, and refused.
    proxy.restore();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let items = visible_items(&bus, "chat-f").await;
    let messages: Vec<_> = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .collect();
    assert_eq!(
        messages.len(),
        1,
        "only attempt 2's reply landed: {items:?}"
    );
    assert_eq!(messages[0].attempt, 2);
    // Its late exit report changed nothing.
    let after = wait_ended(&bus, &turn, T).await;
    assert_eq!(after.state, TurnState::Done);
    assert_eq!(after.attempts.len(), 2);
    cut_runner.stop().await;
    healthy.stop().await;
    for r in roles {
        r.stop().await;
    }
}
