//! The dispatcher and the chat boundary with a real nats-server: per-chat order, history,
//! attachments (again on a retry), live progress, refused input.

use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::wire::{OutboundKind, Role};
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const T: Duration = Duration::from_secs(60);

#[tokio::test]
async fn one_chat_runs_in_order_while_other_chats_run_in_parallel() {
    let p = Pipeline::start(AGENT, |c| c.runner_slots = 4).await;
    let a1 = send(&p.bus, "order-a", "a1", "sleep:0.7").await;
    let a2 = send(&p.bus, "order-a", "a2", "sleep:0.7").await;
    let a3 = send(&p.bus, "order-a", "a3", "reply:third").await;
    let b1 = send(&p.bus, "order-b", "b1", "sleep:0.7").await;
    let c1 = send(&p.bus, "order-c", "c1", "sleep:0.7").await;
    let mut recs = Vec::new();
    for t in [&a1, &a2, &a3, &b1, &c1] {
        let r = wait_ended(&p.bus, t, T).await;
        assert_eq!(r.state, TurnState::Done, "{t}");
        recs.push(r);
    }
    let start = |i: usize| recs[i].attempts[0].started_at.expect("started");
    let end = |i: usize| recs[i].attempts[0].exit.as_ref().expect("exit").ended_at;
    // a1 → a2 → a3, one after another.
    assert!(start(1) >= end(0), "a2 started before a1 ended");
    assert!(start(2) >= end(1), "a3 started before a2 ended");
    // b1 and c1 did not wait for chat a.
    assert!(
        start(3) < end(0) && start(4) < end(0),
        "other chats waited for chat a"
    );
    // The replies arrived in order.
    let texts: Vec<_> = visible_items(&p.bus, "order-a")
        .await
        .into_iter()
        .map(|i| i.turn)
        .collect();
    assert_eq!(texts, vec![a1.clone(), a2.clone(), a3.clone()]);
    p.stop().await;
}

#[tokio::test]
async fn the_second_turns_history_holds_the_first_turns_reply() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let t1 = send(&p.bus, "hist", "h1", "reply:first answer").await;
    let t2 = send(&p.bus, "hist", "h2", "reply:second answer").await;
    wait_ended(&p.bus, &t1, T).await;
    let r2 = wait_ended(&p.bus, &t2, T).await;
    let history: Vec<_> = r2
        .history
        .iter()
        .map(|h| (h.role, h.text.as_str()))
        .collect();
    assert_eq!(
        history,
        vec![
            (Role::User, "reply:first answer"),
            (Role::Bot, "first answer")
        ]
    );
    p.stop().await;
}

#[tokio::test]
async fn replies_join_history_read_at_their_recorded_location_or_else_by_a_scan() {
    use turnpike_core::subjects;
    use turnpike_core::wire::{HistoryEntry, OutboundItem};
    use turnpike_core::ChatId;
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "located", "l1", "reply:found me").await;
    let record = wait_ended(&p.bus, &turn, T).await;
    // The runner reported where its reply is stored, and that is where it is.
    let span = record.attempts[0].reply_span.expect("a reply span");
    assert_eq!(span.first, span.last, "{record:?}");
    let stored = p
        .bus
        .js
        .get_stream(subjects::STREAM_CHAT_OUT)
        .await
        .expect("stream")
        .get_raw_message(span.first)
        .await
        .expect("stored reply");
    let item: OutboundItem =
        turnpike_jetstream::decode(Some(&stored.headers), &stored.payload).expect("item");
    assert_eq!(
        (item.turn.clone(), item.text.as_str()),
        (turn.clone(), "found me")
    );
    let expected = vec![
        (Role::User, "reply:found me".to_owned()),
        (Role::Bot, "found me".to_owned()),
    ];
    let chat = ChatId::new("located").expect("chat id");
    async fn history(bus: &turnpike_store::Bus, chat: &ChatId) -> Vec<(Role, String)> {
        turnpike_store::chats::update(bus, chat, |c| (false, c.history.clone()))
            .await
            .expect("chat record")
            .into_iter()
            .map(|h: HistoryEntry| (h.role, h.text))
            .collect()
    }
    assert_eq!(history(&p.bus, &chat).await, expected);
    // An older runner (no locations) and a wrong location both fall back to scanning the chat,
    // from the turn's first fence marker: no clock decides where to start, so times recorded by
    // a leader whose clock runs a minute ahead lose nothing.
    let mut unknown = record.clone();
    unknown.attempts[0].reply_span = None;
    let mut wrong = record.clone();
    wrong.attempts[0].reply_span = Some(turnpike_core::wire::ReplySpan::at(span.first - 1));
    let mut skewed = unknown.clone();
    fn ahead(t: turnpike_core::Timestamp) -> turnpike_core::Timestamp {
        t.saturating_add(std::time::Duration::from_secs(60))
    }
    skewed.created_at = ahead(skewed.created_at);
    for a in &mut skewed.attempts {
        a.published_at = a.published_at.map(ahead);
        a.started_at = a.started_at.map(ahead);
    }
    for variant in [unknown, wrong, skewed] {
        turnpike_store::chats::update(&p.bus, &chat, |c| {
            c.history.clear();
            c.live = Some(turn.clone());
            (true, ())
        })
        .await
        .expect("reset the chat");
        turnpike_store::chats::release(&p.bus, &variant)
            .await
            .expect("release");
        assert_eq!(
            history(&p.bus, &chat).await,
            expected,
            "{:?}",
            variant.attempts[0].reply_span
        );
    }
    p.stop().await;
}

#[tokio::test]
async fn history_is_bounded_by_history_limit() {
    let p = Pipeline::start(AGENT, |c| c.history_limit = 3).await;
    let mut last = None;
    for i in 0..4 {
        last = Some(send(&p.bus, "bounded", &format!("b{i}"), &format!("reply:r{i}")).await);
    }
    let r = wait_ended(&p.bus, last.as_ref().expect("a turn"), T).await;
    let history: Vec<_> = r.history.iter().map(|h| h.text.as_str()).collect();
    let note = turnpike_core::texts::history_cut_note(3);
    assert_eq!(
        history,
        vec![note.as_str(), "r1", "reply:r2", "r2"],
        "the last 3 entries, behind a note that 3 were left out"
    );
    p.stop().await;
}

#[tokio::test]
async fn attachments_reach_the_agent_byte_for_byte_and_again_on_a_retry() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let content: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut reader: &[u8] = &content;
    turnpike_store::attachments::put(&p.bus, "att/a1/notes.bin", &mut reader)
        .await
        .expect("upload");
    let turn = send_with_attachment(
        &p.bus,
        "att",
        "a1",
        "die-until:2 with-attachments",
        "notes.bin",
        "att/a1/notes.bin",
    )
    .await;
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(record.attempts.len(), 2);
    let want = format!("{} {}", content.len(), fnv1a(&content));
    let items = chat_items(&p.bus, "att").await;
    for k in 1..=2u32 {
        let seen = items
            .iter()
            .find(|i| {
                i.kind == OutboundKind::Status
                    && i.attempt == k
                    && i.text.starts_with("attachments:")
            })
            .expect("the agent described its attachments");
        assert!(
            seen.text.ends_with(&format!("notes.bin {want}")),
            "attempt {k}: {}",
            seen.text
        );
    }
    p.stop().await;
}

#[tokio::test]
async fn status_updates_share_one_status_id_and_a_final_item_closes_it() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "prog", "p1", "status:3").await;
    wait_ended(&p.bus, &turn, T).await;
    let items = chat_items(&p.bus, "prog").await;
    let status: Vec<_> = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Status)
        .collect();
    assert_eq!(
        status.len(),
        4,
        "three updates and the final one: {items:?}"
    );
    let id = status[0].status_id.clone().expect("status id");
    assert!(status
        .iter()
        .all(|s| s.status_id.as_deref() == Some(id.as_str())));
    assert!(status[..3].iter().all(|s| !s.r#final));
    assert!(status[3].r#final);
    assert_eq!(status[0].text, "working 1/3");
    p.stop().await;
}

#[tokio::test]
async fn a_killed_waiting_turn_leaves_the_queue_and_the_next_one_runs() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let first = send(&p.bus, "q", "q1", "sleep:1.5").await;
    let second = send(&p.bus, "q", "q2", "reply:never").await;
    let third = send(&p.bus, "q", "q3", "reply:third").await;
    wait_state(&p.bus, &second, TurnState::Waiting).await;
    let r = ops(
        &p.bus,
        turnpike_core::subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("op", second.clone()),
    )
    .await;
    assert!(r.ok, "{r:?}");
    assert_eq!(wait_ended(&p.bus, &first, T).await.state, TurnState::Done);
    assert_eq!(
        wait_ended(&p.bus, &second, T).await.state,
        TurnState::Killed
    );
    assert_eq!(wait_ended(&p.bus, &third, T).await.state, TurnState::Done);
    let turns: Vec<_> = visible_items(&p.bus, "q")
        .await
        .into_iter()
        .map(|i| i.turn)
        .collect();
    assert_eq!(turns, vec![first, third]);
    p.stop().await;
}

#[tokio::test]
async fn an_attachment_over_the_limit_gets_a_clear_error_reply() {
    let p = Pipeline::start(AGENT, |c| {
        c.attachment_max_bytes = turnpike_config::ByteSize(1000);
        c.attachments_max_total_bytes = turnpike_config::ByteSize(3000);
    })
    .await;
    for (object, size) in [
        ("big/b1/big.bin", 5000),
        ("big/b4/small.bin", 900),
        ("other/o1/secret.txt", 10),
    ] {
        let mut reader: &[u8] = &vec![0u8; size];
        turnpike_store::attachments::put(&p.bus, object, &mut reader)
            .await
            .expect("upload");
    }
    let turn =
        send_with_attachment(&p.bus, "big", "b1", "reply:x", "big.bin", "big/b1/big.bin").await;
    let missing = send_with_attachment(
        &p.bus,
        "big",
        "b2",
        "reply:x",
        "gone.bin",
        "big/b2/gone.bin",
    )
    .await;
    // Another chat's object: a chat reads only what was uploaded under its own name.
    let foreign = send_with_attachment(
        &p.bus,
        "big",
        "b3",
        "reply:x",
        "secret.txt",
        "other/o1/secret.txt",
    )
    .await;
    // An attachment bomb: one small object listed over and over, by count and by total bytes.
    let listed = |n| {
        (0..n)
            .map(|i| turnpike_core::wire::Attachment {
                name: format!("copy{i}.bin"),
                object: "big/b4/small.bin".into(),
            })
            .collect::<Vec<_>>()
    };
    let by_count = send_message(&p.bus, "big", "b4", "reply:x", listed(17)).await;
    let by_bytes = send_message(&p.bus, "big", "b5", "reply:x", listed(4)).await;
    let items = turnpike_testkit::eventually(T, "five error replies", || async {
        let items = visible_items(&p.bus, "big").await;
        (items.len() >= 5).then_some(items)
    })
    .await;
    let expected = [
        (&turn, "is 5000 bytes; the limit is 1000B"),
        (&missing, "not in the object store"),
        (&foreign, "is not under this chat's name \"big/\""),
        (&by_count, "lists 17 attachments; the limit is 16"),
        (&by_bytes, "add up to 3600 bytes; the limit is 3000B"),
    ];
    for (item, (turn, says)) in items.iter().zip(expected) {
        assert_eq!(&item.turn, turn);
        assert!(item.text.contains(says), "{} should say {says}", item.text);
    }
    assert!(items.iter().all(|i| i.kind == OutboundKind::Notice));
    assert_eq!(dead_letters(&p.bus).await.len(), 5);
    // The refused messages made no turn; the chat is free for the next one.
    let ok = send(&p.bus, "big", "b6", "reply:fine").await;
    assert_eq!(wait_ended(&p.bus, &ok, T).await.state, TurnState::Done);
    p.stop().await;
}

/// Issue 16, item 3: a chat whose turns each reply 60 KiB used to wedge for good after about 18
/// turns (the history, counted in entries only, pushed the chat record and the work item past
/// NATS's 1 MiB max_payload, and the failure was retried forever). History is bounded in bytes.
#[tokio::test]
async fn a_chat_of_long_replies_never_wedges_and_its_history_stays_in_budget() {
    let p = Pipeline::start(AGENT, |c| c.runner_slots = 1).await;
    let mut last = None;
    for i in 0..30 {
        last = Some(send(&p.bus, "heavy", &format!("h{i}"), "big-reply:61440").await);
    }
    let r = wait_ended(
        &p.bus,
        last.as_ref().expect("a turn"),
        Duration::from_secs(120),
    )
    .await;
    assert_eq!(r.state, TurnState::Done);
    assert_eq!(r.attempts.len(), 1, "answered at once, never retried");
    let kept: usize = r
        .history
        .iter()
        .filter(|h| h.role != Role::Note)
        .map(|h| h.text.len())
        .sum();
    assert!(kept <= 256 * 1024, "history of {kept} bytes");
    assert_eq!(r.history[0].role, Role::Note, "it says the history was cut");
    let replies = visible_items(&p.bus, "heavy")
        .await
        .into_iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .count();
    assert_eq!(replies, 30, "every turn replied once");
    p.stop().await;
}

/// An inbound message past the size limits is refused with a clear notice, not retried.
#[tokio::test]
async fn an_oversize_message_is_refused_with_a_notice() {
    let p = Pipeline::start(AGENT, |c| {
        c.message_max_bytes = turnpike_config::ByteSize(1024)
    })
    .await;
    let big = send(&p.bus, "sizes", "s1", &"reply:".repeat(200)).await;
    let small = send(&p.bus, "sizes", "s2", "reply:fits").await;
    let r = wait_ended(&p.bus, &small, T).await;
    assert_eq!(r.state, TurnState::Done);
    let items = visible_items(&p.bus, "sizes").await;
    let notice = items
        .iter()
        .find(|i| i.turn == big)
        .expect("a notice for the refused message");
    assert_eq!(notice.kind, OutboundKind::Notice);
    // The whole message counts, encoded: 1200 bytes of text and its id, sender and fields.
    assert!(
        notice.text.contains("bytes encoded; the limit is 1024"),
        "{}",
        notice.text
    );
    assert!(dead_letters(&p.bus)
        .await
        .iter()
        .any(|(_, reason)| reason.contains("bytes encoded; the limit is 1024")));
    p.stop().await;
}

/// Writes to the turns bucket so far, every key counted (each write is one stream message).
async fn turn_writes(bus: &turnpike_store::Bus) -> u64 {
    let mut stream = bus
        .js
        .get_stream("KV_turnpike_turns")
        .await
        .expect("turns bucket stream");
    stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence
}

#[tokio::test]
async fn an_idle_chats_turn_is_created_admitted_and_a_busy_chats_waits() {
    // Issue 19: the first message of an idle chat joins it first and is written once, already
    // admitted; a message for a chat whose turn is live is created waiting and admitted when that
    // turn ends. Only the dispatcher runs at first, so it is the bucket's only writer.
    let server = turnpike_testkit::NatsServer::start();
    let mut config = test_config(&server, AGENT);
    config.nats_url = server.url();
    let dispatcher = start_dispatcher(&config).await;
    let bus = turnpike_store::Bus::connect(&config, "test")
        .await
        .expect("bus");
    let first = send(&bus, "one-write", "w1", "reply:first").await;
    let r = wait_state(&bus, &first, TurnState::Queued).await;
    assert_eq!(r.attempt, 1);
    assert_eq!(
        turn_writes(&bus).await,
        1,
        "the idle chat's turn took one write"
    );
    let second = send(&bus, "one-write", "w2", "reply:second").await;
    wait_state(&bus, &second, TurnState::Waiting).await;
    assert_eq!(
        turn_writes(&bus).await,
        2,
        "the busy chat's turn is created waiting"
    );
    // The rest of the pipeline: both run, in order, the second with the first's reply.
    let coordinator = start_coordinator(&config).await;
    let runner = start_runner(&config).await;
    for t in [&first, &second] {
        assert_eq!(wait_ended(&bus, t, T).await.state, TurnState::Done, "{t}");
    }
    let r2 = wait_ended(&bus, &second, T).await;
    assert!(
        r2.history
            .iter()
            .any(|h| h.role == Role::Bot && h.text == "first"),
        "{:?}",
        r2.history
    );
    for role in [runner, coordinator, dispatcher] {
        role.stop().await;
    }
}

#[tokio::test]
async fn a_dispatcher_that_died_after_joining_an_idle_chat_leaves_a_turn_its_replay_runs_once() {
    // The window the first write of an idle chat's turn opens: the chat names the turn its live
    // one, and the record does not exist yet. The message, never acknowledged, comes back; the
    // replay must create, admit and run the turn once, and the chat must go on to the next.
    let server = turnpike_testkit::NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = turnpike_store::Bus::connect(&config, "test")
        .await
        .expect("bus");
    let chat = turnpike_core::ChatId::new("died-joining").expect("valid");
    let msg = turnpike_core::wire::InboundMessage::new(chat.clone(), "d1", "reply:once", None);
    let ack = turnpike_jetstream::publish_inbound(&bus.js, bus.codec, &msg)
        .await
        .expect("inbound accepted");
    let turn = msg.turn();
    let read = turnpike_store::chats::read(&bus, &chat)
        .await
        .expect("read");
    let joined = turnpike_store::chats::join_if_idle(&bus, &chat, &turn, ack.sequence, &read)
        .await
        .expect("join");
    assert!(joined.is_some(), "an idle chat is joined first");
    assert!(turnpike_store::turns::load(&bus, &turn)
        .await
        .expect("load")
        .is_none());
    // Now the roles start; the dispatcher gets the message as a redelivery would bring it.
    let p = Pipeline::start_on(server, config, 1, true).await;
    let next = send(&p.bus, "died-joining", "d2", "reply:next").await;
    let r = wait_ended(&p.bus, &turn, T).await;
    assert_eq!((r.state, r.attempts.len()), (TurnState::Done, 1));
    let r = wait_ended(&p.bus, &next, T).await;
    assert_eq!(r.state, TurnState::Done);
    let replies: Vec<_> = visible_items(&p.bus, "died-joining")
        .await
        .into_iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .map(|i| i.text)
        .collect();
    assert_eq!(replies, ["once", "next"]);
    p.stop().await;
}
