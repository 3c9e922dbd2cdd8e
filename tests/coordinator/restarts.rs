//! Restarts and duplicates: a coordinator or nats-server restarted inside the retry delay, every
//! event delivered twice, two coordinators sharing the work.

use super::*;

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
    let claim = turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_CLAIMS)
        .await
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
