//! The lifecycle table end to end: retries with preambles, the budget and its one notice, a
//! partial reply, operator kills and clears, bad events.

use super::*;

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
            &turnpike_tests::bucket(&p.bus, turnpike_core::subjects::BUCKET_CHATS)
                .await
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
    let claim = turnpike_tests::bucket(&p.bus, turnpike_core::subjects::BUCKET_CLAIMS)
        .await
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
    let chat = chat_record(&p.bus, "c6").await;
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

/// Issue 32: a re-run request sent twice (a second click, a retry after a time-out) makes one
/// new turn; each new request makes its own. (Failed before requests had ids: every click made
/// another turn.)
#[tokio::test]
async fn a_rerun_request_sent_twice_makes_one_turn() {
    use turnpike_core::wire::OpsRequest;
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "c17", "m1", "reply:once").await;
    wait_ended(&p.bus, &turn, T).await;
    let rerun = |id: &str| {
        let req = OpsRequest::turn("carol", turn.clone()).with_id(id);
        let bus = p.bus.clone();
        async move { ops(&bus, subjects::OPS_RERUN, req).await }
    };
    let first = rerun("click-1").await;
    let again = rerun("click-1").await;
    assert!(first.ok && again.ok, "{first:?} {again:?}");
    assert_eq!(first.turn, again.turn, "the same request, the same turn");
    assert_eq!(first.turn, Some(TurnId::for_rerun(&turn, 1)));
    let other = rerun("click-2").await;
    assert_eq!(other.turn, Some(TurnId::for_rerun(&turn, 2)));
    for t in [TurnId::for_rerun(&turn, 1), TurnId::for_rerun(&turn, 2)] {
        assert_eq!(wait_ended(&p.bus, &t, T).await.state, TurnState::Done);
    }
    let third = turnpike_store::turns::load(&p.bus, &TurnId::for_rerun(&turn, 3))
        .await
        .expect("read");
    assert!(third.is_none(), "a third re-run: {third:?}");
    p.stop().await;
}

#[tokio::test]
async fn bad_events_are_dead_lettered_and_the_coordinator_keeps_going() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let unknown = serde_json::json!({"v": 1, "turn": "t-unknown", "chat": "c7", "attempt": 1,
        "runner": "r", "at": "2026-12-02T00:00:00Z",
        "kind": {"type": "started", "published_at": "2026-12-02T00:00:00Z"}});
    for (subject, payload) in [
        (
            "turnpike.events.t-unknown.r".to_owned(),
            unknown.to_string(),
        ),
        ("turnpike.events.t-garbage.r".to_owned(), "{{{".to_owned()),
        ("turnpike.events.t-other.r".to_owned(), unknown.to_string()),
        // The subject names the sender; the payload may not claim to be another runner.
        (
            "turnpike.events.t-unknown.r2".to_owned(),
            unknown.to_string(),
        ),
        // The shape before runners had subjects of their own: it names no sender.
        ("turnpike.events.t-unknown".to_owned(), unknown.to_string()),
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
    // Refused in their own time: a start waits a moment for more of its turn first.
    let mut reasons: Vec<String> = turnpike_testkit::eventually(T, "5 dead letters", || async {
        let reasons: Vec<String> = dead_letters(&p.bus)
            .await
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        (reasons.len() >= 5).then_some(reasons)
    })
    .await;
    reasons.sort();
    assert_eq!(reasons.len(), 5, "{reasons:?}");
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
    assert!(
        reasons.iter().any(|r| r.contains("another runner")),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("names no turn and runner")),
        "{reasons:?}"
    );
    // Every refusal goes one way, so every one is counted (the subject mismatch and the unknown
    // turn were dead-lettered without being counted before).
    let stats = ops_stats(&p.bus).await;
    assert_eq!(stats.counters.dead_lettered, 5, "{:?}", stats.counters);
    p.stop().await;
}
