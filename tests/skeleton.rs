//! The walking skeleton end to end with a real nats-server: inbound message → turn → attempt 1 →
//! runner (process backend, test agent) → reply on the chat's outbound subject → `done`.

use std::time::Duration;
use turnpike_core::record::{OutcomeReason, TurnState};
use turnpike_core::texts;
use turnpike_core::wire::{ExitClass, OutboundKind};
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const T: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_message_gets_a_reply_and_the_turn_is_done() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let (bus, config) = (&p.bus, &p.config);

    let turn = send(bus, "chat-a", "m-1", "reply:hello there").await;
    let record = wait_ended(bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(
        record.outcome.as_ref().map(|o| o.reason),
        Some(OutcomeReason::Replied)
    );
    assert_eq!(record.attempts.len(), 1);
    let a = &record.attempts[0];
    assert_eq!(a.messages_landed, 1);
    assert_eq!(a.exit.as_ref().map(|e| e.class), Some(ExitClass::Clean));
    assert!(a.runner.is_some() && a.started_at.is_some() && a.published_at.is_some());
    assert!(record.notice.is_none());

    let items = visible_items(bus, "chat-a").await;
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0].kind, OutboundKind::Message);
    assert_eq!(items[0].text, "hello there");
    assert_eq!(items[0].turn, turn);

    // The runner announces itself with its capacity.
    let mut keys = turnpike_tests::bucket(bus, turnpike_core::subjects::BUCKET_RUNNERS)
        .await
        .keys()
        .await
        .expect("runner keys");
    let key = futures::StreamExt::next(&mut keys)
        .await
        .expect("one runner present")
        .expect("key");
    let presence: turnpike_core::wire::RunnerPresence = turnpike_jetstream::decode_kv(
        &turnpike_tests::bucket(bus, turnpike_core::subjects::BUCKET_RUNNERS)
            .await
            .get(&key)
            .await
            .expect("get")
            .expect("value"),
    )
    .expect("presence decodes");
    assert_eq!(presence.slots, config.runner_slots);
    assert_eq!(presence.backend, "process");

    // The live index no longer holds the ended turn.
    assert!(
        turnpike_tests::bucket(bus, turnpike_core::subjects::BUCKET_LIVE)
            .await
            .get(turn.as_str())
            .await
            .expect("live get")
            .is_none_or(|v| v.is_empty())
    );
    p.stop().await;
}

#[tokio::test]
async fn a_replayed_inbound_message_makes_one_turn_and_one_reply() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let bus = &p.bus;
    let turn = send(bus, "chat-b", "m-1", "reply:once").await;
    wait_ended(bus, &turn, T).await;
    // The same message again, after the dedup window would matter: same turn, nothing new.
    let again = send(bus, "chat-b", "m-1", "reply:once").await;
    assert_eq!(again, turn);
    // Bypass JetStream dedup (a fresh Nats-Msg-Id): the KV create still refuses a second turn.
    let chat = turnpike_core::ChatId::new("chat-b").expect("valid");
    turnpike_jetstream::Publish::new(
        bus.codec,
        turnpike_core::subjects::chat_in(&chat),
        &serde_json::json!({"id": "m-1", "chat": "chat-b", "text": "reply:once"}),
    )
    .expect("encodes")
    .msg_id("another-dedup-id")
    .send(&bus.js)
    .await
    .expect("accepted");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let items = visible_items(bus, "chat-b").await;
    assert_eq!(items.len(), 1, "one reply only: {items:?}");
    let record = wait_ended(bus, &turn, T).await;
    assert_eq!(record.attempts.len(), 1);
    p.stop().await;
}

#[tokio::test]
async fn a_run_that_dies_is_retried_with_the_preamble_then_replies() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let (bus, config) = (&p.bus, &p.config);
    let turn = send(bus, "chat-c", "m-1", "die-until:3 show-prompt").await;
    let record = wait_ended(bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(record.attempts.len(), 3);
    assert_eq!(record.retry_count, 2);
    let classes: Vec<_> = record
        .attempts
        .iter()
        .map(|a| a.exit.as_ref().map(|e| e.class))
        .collect();
    assert_eq!(
        classes,
        vec![
            Some(ExitClass::Crashed),
            Some(ExitClass::Crashed),
            Some(ExitClass::Clean)
        ]
    );
    let items: Vec<_> = visible_items(bus, "chat-c")
        .await
        .into_iter()
        .filter(|i| i.kind != OutboundKind::Status)
        .collect();
    assert_eq!(items.len(), 1, "one reply, no notice: {items:?}");
    assert_eq!(items[0].attempt, 3);
    assert!(
        items[0].text.contains(&texts::retry_preamble(3, 3)),
        "the agent saw the preamble: {}",
        items[0].text
    );
    // The retry waited for the delay, measured from the recorded death to the publish.
    for k in 1..3 {
        let died = record.attempts[k - 1].exit.as_ref().expect("exit").ended_at;
        let published = record.attempts[k].published_at.expect("published");
        let gap = published.since(died);
        assert!(
            gap >= config.retry_delay,
            "attempt {} published {gap:?} after the death",
            k + 1
        );
    }
    p.stop().await;
}

#[tokio::test]
async fn bad_inbound_input_is_dead_lettered_and_the_dispatcher_keeps_going() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let bus = &p.bus;
    for (subject, payload) in [
        ("turnpike.chat.in.chat-d", &b"not json"[..]),
        (
            "turnpike.chat.in.chat-d",
            br#"{"id":"x","chat":"other","text":"t"}"#,
        ),
        (
            "turnpike.chat.in.chat-d",
            br#"{"id":"x","chat":"bad.chat","text":"t"}"#,
        ),
    ] {
        bus.js
            .publish(subject, bytes::Bytes::from_static(payload))
            .await
            .expect("publish")
            .await
            .expect("stored");
    }
    let turn = send(bus, "chat-d", "ok", "reply:still alive").await;
    let record = wait_ended(bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    let dead = dead_letters(bus).await;
    assert!(
        dead.iter()
            .all(|(subject, _)| subject == "turnpike.dead.dispatcher"),
        "{dead:?}"
    );
    let reasons: Vec<String> = dead.into_iter().map(|(_, r)| r).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert!(reasons[0].contains("undecodable"), "{reasons:?}");
    assert!(reasons[1].contains("published on"), "{reasons:?}");
    assert!(reasons[2].contains("only A-Z"), "{reasons:?}");
    p.stop().await;
}
