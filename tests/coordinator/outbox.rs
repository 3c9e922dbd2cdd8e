//! The outbox and the sweep: lost schedules found again, outboxes replayed after a crash, ended
//! turns unlisted only once their effects are carried out, and never carried out again after;
//! counters; events from a runner without the claim.

use super::*;

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
        turnpike_store::outbox::execute(&bus, &created.record, &e)
            .await
            .expect("effect");
    }
    turnpike_store::outbox::run_outbox(&bus, created)
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
            workspace: None,
            class: ExitClass::Crashed,
            exit_code: Some(1),
            signal: None,
            error: None,
            messages_landed: 0,
            reply_span: None,
            output_cut: false,
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
        turnpike_store::outbox::execute(&bus, &current.record, &e)
            .await
            .expect("effect");
    }
    turnpike_store::outbox::run_outbox(&bus, current)
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
    let stats = ops_stats(&p.bus).await;
    let s = stats.counters;
    assert_eq!(
        (
            s.turns.turns_done,
            s.turns.turns_gave_up,
            s.turns.silent_turns
        ),
        (2, 1, 1),
        "{s:?}"
    );
    assert_eq!(s.turns.retries_scheduled, 1);
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
                workspace: None,
                class: ExitClass::Clean,
                exit_code: Some(0),
                signal: None,
                error: None,
                messages_landed: 1,
                reply_span: None,
                output_cut: false,
                ended_at: turnpike_jetstream::now(),
                started: None,
            },
        },
    };
    assert_ne!(forged.runner, holder);
    turnpike_jetstream::publish(
        &p.bus.js,
        p.bus.codec,
        subjects::events(&turn, &forged.runner),
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
    turnpike_store::outbox::run_outbox(&bus, applied.current().clone())
        .await
        .expect("outbox");
    // ...the dispatcher joins it and dies before admitting it...
    turnpike_store::chats::join(&bus, &chat, &turn, Some(1), None)
        .await
        .expect("join");
    // ...and the message comes back.
    turnpike_store::admission::create_in_chat(&bus, record, Some(1), None)
        .await
        .expect("replay");
    let c = chat_record(&bus, "c10").await;
    assert_eq!(c.live, None, "the ended turn holds its chat: {c:?}");
    assert_eq!(c.inbound_seq, 1);
}

/// Found by the model checker: an ended turn left the live index while carrying out its
/// `Ended` effect, before its outbox was carried out; a crash in between left effects that no
/// sweep would ever see. Carrying out the effects (and crashing before the end of the outbox)
/// must leave the turn listed, and the outbox's end unlist it.
#[tokio::test]
async fn an_ended_turn_stays_listed_until_its_outbox_is_carried_out() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let (record, _) = new_turn("c11", false);
    let turn = record.turn.clone();
    turnpike_store::admission::create_in_chat(&bus, record, Some(1), None)
        .await
        .expect("create");
    let applied = turnpike_store::turns::apply_event(&bus, &turn, &operator_kill())
        .await
        .expect("kill");
    let current = applied.current().clone();
    for e in &current.record.outbox {
        turnpike_store::outbox::execute(&bus, &current.record, e)
            .await
            .expect("effect");
    }
    let listed = || async {
        turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_LIVE)
            .await
            .get(turn.as_str())
            .await
            .expect("live get")
            .is_some_and(|v| !v.is_empty())
    };
    assert!(listed().await, "unlisted with its outbox not carried out");
    turnpike_store::outbox::run_outbox(&bus, current)
        .await
        .expect("outbox");
    assert!(!listed().await, "still listed once ended and carried out");
}

/// Make a stream forget message ids after `window` (its definition keeps them two minutes), so
/// a test can see a publish that the dedup would otherwise hide.
pub(crate) async fn shorten_duplicate_window(bus: &Bus, stream: &str, window: Duration) {
    let mut config = bus
        .js
        .get_stream(stream)
        .await
        .expect("stream")
        .info()
        .await
        .expect("info")
        .config
        .clone();
    config.duplicate_window = window;
    bus.js.update_stream(config).await.expect("update stream");
}

/// Messages stored on `subject` in `stream`.
async fn stored_on(bus: &Bus, stream: &str, subject: &str) -> usize {
    let s = bus.js.get_stream(stream).await.expect("stream");
    let mut counts = s.info_with_subjects(subject).await.expect("subjects");
    let mut n = 0;
    while let Some(c) = counts.next().await {
        n += c.expect("subject count").1;
    }
    n
}

/// Since an ended turn's outbox is no longer cleared, its removal from the live index is what
/// says its effects were carried out. A late duplicate event, a replay of its inbound message
/// and the sweep must then carry out none of them again: past the stream's duplicate window,
/// the notice would reach the user twice. (Fails with `run_owed` replaced by `run_outbox`, or
/// with the dispatcher listing a replayed turn with a put.)
#[tokio::test]
async fn an_ended_turns_effects_are_not_carried_out_again_after_it_left_the_live_index() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let (record, _) = new_turn("c13", false);
    let turn = record.turn.clone();
    let exit = give_up(&bus, &record).await;
    assert!(!turnpike_store::live::is_listed(&bus, &turn)
        .await
        .expect("live"));
    shorten_duplicate_window(&bus, subjects::STREAM_CHAT_OUT, Duration::from_millis(200)).await;
    // Past the window (the server drops expired ids on a timer of the window's length).
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The runner's exit, delivered again.
    let again = turnpike_store::turns::apply_event(&bus, &turn, &exit)
        .await
        .expect("apply again");
    assert!(matches!(
        again,
        turnpike_store::turns::Applied::Unchanged(..)
    ));
    turnpike_store::outbox::run_owed(&bus, again)
        .await
        .expect("nothing owed");
    // Its inbound message, delivered again, then a sweep.
    turnpike_store::admission::create_in_chat(&bus, record, Some(1), None)
        .await
        .expect("replay");
    assert!(!turnpike_store::live::is_listed(&bus, &turn)
        .await
        .expect("live"));
    let mut sweep_config = config.clone();
    sweep_config.heartbeat = Duration::from_millis(1);
    turnpike_coordinator::sweep::sweep_once(&bus, &sweep_config, &Default::default())
        .await
        .expect("sweep");
    let items = outbound(
        &bus.js,
        &subjects::chat_out(&ChatId::new("c13").expect("chat")),
    )
    .await;
    let notices = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Notice)
        .count();
    let finals = items.iter().filter(|i| i.r#final).count();
    assert_eq!((notices, finals), (1, 1), "{items:?}");
}

/// Create `record`'s turn in its chat and let its one attempt die: it gives up, its effects
/// carried out (the notice sent, the turn unlisted). Returns the exit event, to deliver again.
async fn give_up(bus: &Bus, record: &turnpike_core::TurnRecord) -> turnpike_core::lifecycle::Event {
    let exit = turnpike_core::lifecycle::Event::Exited {
        attempt: 1,
        report: turnpike_core::wire::ExitReport::without_output(
            ExitClass::Crashed,
            "test",
            turnpike_jetstream::now(),
        ),
    };
    turnpike_store::admission::create_in_chat(bus, record.clone(), Some(1), None)
        .await
        .expect("create");
    let applied = turnpike_store::turns::apply_event(bus, &record.turn, &exit)
        .await
        .expect("apply");
    assert_eq!(applied.current().record.state, TurnState::GaveUp);
    turnpike_store::outbox::run_owed(bus, applied)
        .await
        .expect("effects");
    exit
}

/// Issue 32: a sweep pass lists the live turns once, then works through them; a pass slower
/// than the duplicate window (a NATS brown-out, thousands of live turns) reached a turn that
/// had ended and left the index meanwhile, and sent its notice again. It decides on each turn
/// as it is when reached. (Fails without the re-check in `sweep_turn`'s `Finish`.)
#[tokio::test]
async fn a_sweep_pass_on_an_old_listing_does_not_send_an_ended_turns_notice_again() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let (record, _) = new_turn("c16", false);
    // The pass lists the live turns: this one is there, still running.
    let listing = vec![record.turn.to_string()];
    give_up(&bus, &record).await;
    shorten_duplicate_window(&bus, subjects::STREAM_CHAT_OUT, Duration::from_millis(200)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The pass reaches it only now, past the window.
    let mut sweep_config = config.clone();
    sweep_config.heartbeat = Duration::from_millis(1);
    turnpike_coordinator::sweep::sweep_listed(
        &bus,
        &sweep_config,
        &Default::default(),
        listing,
        &mut |_| turnpike_core::recovery::Lease::Live,
    )
    .await
    .expect("sweep");
    let items = outbound(
        &bus.js,
        &subjects::chat_out(&ChatId::new("c16").expect("chat")),
    )
    .await;
    let notices = items
        .iter()
        .filter(|i| i.kind == OutboundKind::Notice)
        .count();
    assert_eq!(notices, 1, "{items:?}");
}

/// An admitted turn's dispatch stays in its outbox until its attempt begins (no write clears
/// it), so the sweep must not carry it out again: a turn waiting in a long queue would be
/// published again at every sweep, past the duplicate window. It looks for the attempt
/// instead, and dispatches it again only if it is nowhere. (Fails with the dispatch counted
/// among a stale record's leftovers, and without the look for a queued turn's attempt.)
#[tokio::test]
async fn the_sweep_dispatches_a_queued_turns_lost_attempt_once_and_a_waiting_one_not_again() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    shorten_duplicate_window(&bus, subjects::STREAM_WORK, Duration::from_millis(200)).await;
    let (waiting, _) = new_turn("c14", false);
    let (lost, _) = new_turn("c15", false);
    for record in [waiting.clone(), lost.clone()] {
        turnpike_store::admission::create_in_chat(&bus, record, Some(1), None)
            .await
            .expect("create");
    }
    // The lost one's work item is gone, as if its dispatcher died before publishing it.
    bus.js
        .get_stream(subjects::STREAM_WORK)
        .await
        .expect("work stream")
        .purge()
        .filter(subjects::work_run(&lost.turn))
        .await
        .expect("purge");
    // Both records stale, and the ids forgotten by the work stream.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut sweep_config = config.clone();
    sweep_config.heartbeat = Duration::from_millis(1);
    for _ in 0..3 {
        turnpike_coordinator::sweep::sweep_once(&bus, &sweep_config, &Default::default())
            .await
            .expect("sweep");
    }
    for record in [&waiting, &lost] {
        let outbox = &turnpike_store::turns::load(&bus, &record.turn)
            .await
            .expect("load")
            .expect("record")
            .record
            .outbox;
        assert!(!outbox.is_empty(), "the dispatch is still in the outbox");
        let n = stored_on(
            &bus,
            subjects::STREAM_WORK,
            &subjects::work_run(&record.turn),
        )
        .await;
        assert_eq!(n, 1, "work items for {}", record.turn);
    }
}
