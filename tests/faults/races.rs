//! Hostile input and races: a flood of bad input, a kill racing a claim, a lease lapsing
//! during a slow exit report.

use super::*;

/// 7. A flood of bad input: malformed inbound messages, an oversize payload, events for turns
/// that do not exist and garbage events, forged publishes from a user without the right. Each is
/// refused or dead-lettered with a reason; no node crashes or restarts; real turns go on.
#[tokio::test]
async fn f7_bad_input_flood() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let urls: Vec<String> = c
        .ports
        .iter()
        .map(|p| format!("nats://127.0.0.1:{p}"))
        .collect();
    let mut chat = connect_as("chat", urls.clone()).await;
    let chat_js = async_nats::jetstream::new(chat.client.clone());
    // Runner 1's own user: its events name it.
    let runner_id = RunnerId::new(c.runner_id(1)).expect("runner id");
    let runner = connect_as(&turnpike_jetstream::accounts::runner_user(&runner_id), urls).await;
    let runner_js = async_nats::jetstream::new(runner.client.clone());

    let dead_before = dead_letters(&c.bus).await.len();
    let k = 10 * soak();
    let mut expects = Vec::new();
    let mut malformed = 0;
    let mut bad_events = 0;
    for i in 0..k {
        // Malformed inbound, as a chat adapter may send it.
        for (j, payload) in [
            b"\x00\xff not json at all".to_vec(),
            br#"{"id": "x", "chat": "f7"#.to_vec(),
            format!(r#"{{"v": 99, "id": "f7-v{i}", "chat": "f7", "text": "from the future"}}"#)
                .into_bytes(),
            format!(r#"{{"id": "f7-o{i}", "chat": "other-chat", "text": "subject mismatch"}}"#)
                .into_bytes(),
        ]
        .into_iter()
        .enumerate()
        {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", format!("f7-bad-{i}-{j}").as_str());
            chat_js
                .publish_with_headers("turnpike.chat.in.f7", h, payload.into())
                .await
                .expect("publish")
                .await
                .expect("the stream takes it (Turnpike judges it)");
            malformed += 1;
        }
        // An event for a turn that does not exist, and garbage, from a runner's account.
        let ghost = TurnId::for_message(&ChatId::new("f7").expect("chat"), &format!("ghost-{i}"));
        let event = RunnerEvent {
            v: FORMAT_VERSION,
            turn: ghost.clone(),
            chat: ChatId::new("f7").expect("chat"),
            attempt: 1,
            runner: runner_id.clone(),
            at: turnpike_jetstream::now(),
            kind: RunnerEventKind::Started {
                published_at: turnpike_jetstream::now(),
            },
        };
        for payload in [
            serde_json::to_vec(&event).expect("json"),
            b"{\"garbage\": true}".to_vec(),
        ] {
            runner_js
                .publish(subjects::events(&ghost, &runner_id), payload.into())
                .await
                .expect("publish")
                .await
                .expect("the events stream takes it");
            bad_events += 1;
        }
        // A real turn in the middle of it all.
        let t = send_acked(
            &c.bus,
            &format!("f7-ok-{i}"),
            &format!("f7-ok-m{i}"),
            "reply:ok",
            30,
        )
        .await;
        expects.push(expect_script(t, "reply:ok", 3));
    }
    // Oversize: refused before it is stored.
    let big = vec![b'x'; 2 << 20];
    let oversize = chat_js
        .publish("turnpike.chat.in.f7", big.into())
        .await
        .err()
        .map(|e| e.to_string());
    assert!(oversize.is_some(), "a 2 MiB inbound message was accepted");
    // Forged: a chat user acting as a runner, a coordinator, a dispatcher.
    let mut refused = 0;
    for forged in [
        "turnpike.events.t-000000000000000000000000.r1",
        "$KV.turnpike_turns.t-000000000000000000000000",
        "turnpike.work.run.t-000000000000000000000000",
    ] {
        let why = chat.refused(forged).await;
        assert!(why.contains("Permissions Violation"), "{forged}: {why:?}");
        refused += 1;
    }

    let mut tally = judge(&c.bus, "7 bad input flood", &expects, long()).await;
    // Every bad message is dead-lettered with a reason.
    let dead = eventually(Duration::from_secs(60), "dead letters", || async {
        let d = dead_letters(&c.bus).await;
        (d.len() >= dead_before + malformed + bad_events).then_some(d)
    })
    .await;
    let mut by_subject: HashMap<String, usize> = HashMap::new();
    for (subject, reason) in &dead[dead_before..] {
        assert!(
            !reason.is_empty(),
            "a dead letter on {subject} without a reason"
        );
        *by_subject.entry(subject.clone()).or_default() += 1;
    }
    // No node crashed or restarted.
    no_restarts(&c, &mut tally).await;
    // Nothing forged reached a turn or the queue.
    let info = c
        .bus
        .js
        .get_stream(subjects::STREAM_WORK)
        .await
        .expect("work stream")
        .get_last_raw_message_by_subject("turnpike.work.run.t-000000000000000000000000")
        .await;
    assert!(info.is_err(), "a forged work item was stored");
    tally.note = format!(
        "{malformed} malformed inbound, {bad_events} bad events dead-lettered ({by_subject:?}); \
         oversize refused; {refused} forged publishes refused"
    );
    tally.report();
}

/// 8. Kill racing a claim: each kill is sent the instant the attempt's claim appears, while the
/// runner is between its claim and its fence. A kill is a fence move the runner cannot miss: every
/// turn ends killed, with one attempt and not one bot message (the agent would reply 1.5 s in).
#[tokio::test]
async fn f8_kill_racing_a_claim() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let n = 8 * soak();
    let races = (0..n).map(|i| {
        let c = &c;
        async move {
            let chat = format!("f8-{i}");
            let id = format!("f8-m{i}");
            let turn = TurnId::for_message(&ChatId::new(&chat).expect("chat"), &id);
            let mut claims = turnpike_tests::bucket(&c.bus, turnpike_core::subjects::BUCKET_CLAIMS)
                .await
                .watch(subjects::claim_key(&turn, 1))
                .await
                .expect("watch the claim");
            send_acked(&c.bus, &chat, &id, "sleep:1.5", 30).await;
            claims
                .next()
                .await
                .expect("the claim appears")
                .expect("entry");
            let answer = turnpike_tests::kill_turn(&c.bus, &turn).await;
            assert!(answer.ok, "kill refused: {}", answer.message);
            Expect {
                turn,
                state: TurnState::Killed,
                attempts: Some(1),
                replies: 0,
            }
        }
    });
    let expects = futures::future::join_all(races).await;
    let mut tally = judge(&c.bus, "8 kill racing a claim", &expects, long()).await;
    // Each turn's final status is its last item: nothing of a killed attempt lands after it.
    let outbound = outbound_by_turn(&c.bus).await;
    for e in &expects {
        let items = outbound.get(e.turn.as_str()).cloned().unwrap_or_default();
        if !items.last().is_some_and(|i| i.r#final) {
            tally.wrong += 1;
            tally
                .problems
                .push(format!("{}: output after its final status", e.turn));
        }
    }
    tally.note = format!("{n} kills sent as each claim appeared; no killed turn posted");
    tally.report();
}

/// 9. Lease lapse during a slow exit report: the agent replies, and its runner is cut off before
/// it can report the clean exit that follows, for longer than the lease. The sweep declares the
/// attempt lost, counts the reply behind the fence, and the turn ends failed with the plain
/// notice, never retried; the late report, once the runner is back, changes nothing.
#[tokio::test]
async fn f9_lease_lapse_during_a_slow_exit_report() {
    init_logs();
    let opts = ClusterOpts {
        runners: 2,
        ..ClusterOpts::default()
    };
    let lease = opts.lease;
    let c = Cluster::start(opts).await;
    let mut expects = Vec::new();
    let mut outcomes = Vec::new();
    for i in 0..soak() {
        let chat = format!("f9-{i}");
        let turn = send_acked(&c.bus, &chat, &format!("f9-m{i}"), "reply-then-exit:3", 30).await;
        // Cut the runner off as soon as the reply is visible: its agent exits 3 s later.
        eventually(Duration::from_secs(60), "the reply lands", || async {
            visible_items(&c.bus, &chat)
                .await
                .iter()
                .any(|m| m.turn == turn && m.kind == OutboundKind::Message)
                .then_some(())
        })
        .await;
        // The reply can be visible before the coordinator has written the start that names the
        // runner (two roles, no order between them): wait for it rather than race it.
        let runner = eventually(
            Duration::from_secs(30),
            "the record names the attempt's runner",
            || async {
                record(&c, &turn)
                    .await
                    .attempts
                    .first()
                    .and_then(|a| a.runner.clone())
            },
        )
        .await;
        let name = runner_name(&c, &runner);
        c.disconnect(&name).await;
        // Past the lease: the sweep settles the attempt while the exit report waits.
        let ended = wait_all_ended(&c.bus, std::slice::from_ref(&turn), long()).await;
        let before = ended[0].clone().expect("turn");
        c.connect(&name).await;
        tokio::time::sleep(lease).await;
        let after = record(&c, &turn).await;
        let class = before.attempts[0].exit.as_ref().map(|x| x.class);
        outcomes.push(format!("{class:?}"));
        // By the table: a lost runner after a reply is a failed turn (plain notice); had the clean
        // exit got out before the cut, the turn would be done. Either way: one attempt, one reply.
        let state = if class == Some(ExitClass::Clean) {
            TurnState::Done
        } else {
            TurnState::Failed
        };
        expects.push(Expect {
            turn: turn.clone(),
            state,
            attempts: Some(1),
            replies: 1,
        });
        assert_eq!(
            (
                after.state,
                after.attempts.len(),
                after.attempts[0].exit.as_ref().map(|x| x.class)
            ),
            (before.state, before.attempts.len(), class),
            "the late exit report changed the outcome"
        );
    }
    let mut tally = judge(&c.bus, "9 lease lapse, slow exit", &expects, long()).await;
    tally.note = format!(
        "runner cut off between reply and clean exit, past the lease ({lease:?}); attempt 1 ended {}",
        outcomes.join(", ")
    );
    tally.report();
}
