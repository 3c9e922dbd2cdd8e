//! Writes at a revision the writer already knows (issue 19: no read before a compare-and-set).
//! A known record may be stale; each test makes it so and checks that nothing is decided on it:
//! it may only cost a failed write and a read.

use super::*;
use turnpike_core::chat::Joined;
use turnpike_core::lifecycle::{self, Event, NewTurn};
use turnpike_core::wire::{ExitReport, InboundMessage};
use turnpike_store::turns::{self, Applied};

fn fresh_turn(chat: &str) -> turnpike_core::TurnRecord {
    let chat = ChatId::new(chat).expect("chat");
    let message = InboundMessage::new(chat, "m1", "x", None);
    let (mut record, effects) = lifecycle::create(
        NewTurn {
            turn: message.turn(),
            message,
            history: vec![],
            max_turn_retry: 3,
            retry_delay: Duration::from_secs(1),
            rerun_of: None,
            created_by: None,
            admit_now: true,
        },
        turnpike_jetstream::now(),
    );
    record.outbox = effects;
    record
}

/// Applied at a stale revision, an event of the turn's next attempt would look like one from
/// the future and be dropped; it must be judged on the stored record instead.
#[tokio::test]
async fn an_event_applied_at_a_stale_revision_is_judged_on_the_stored_record() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let (created, _) = turns::create(&bus, fresh_turn("rev1"))
        .await
        .expect("create");
    let turn = created.record.turn.clone();
    // Another writer: attempt 1 dies empty-handed, attempt 2 is scheduled.
    let died = Event::Exited {
        attempt: 1,
        report: ExitReport::without_output(ExitClass::Crashed, "died", turnpike_jetstream::now()),
    };
    let after = turns::apply_event(&bus, &turn, &died).await.expect("exit");
    assert_eq!(after.current().record.state, TurnState::PendingRetry);
    assert_eq!(after.current().record.attempt, 2);
    // Attempt 2 starts; this writer still knows the record as created (attempt 1).
    let runner = turnpike_core::RunnerId::new("r1").expect("runner id");
    let started = Event::Started {
        attempt: 2,
        runner: runner.clone(),
        published_at: turnpike_jetstream::now(),
    };
    let applied = turns::apply_event_from(
        &bus,
        &turn,
        &started,
        turnpike_jetstream::now(),
        Some(created),
    )
    .await
    .expect("a stale revision costs a read, never the event");
    let Applied::Changed { current, .. } = applied else {
        panic!("the event was dropped as judged on the stale record: {applied:?}");
    };
    assert_eq!(current.record.state, TurnState::Running);
    assert_eq!(current.record.attempts[1].runner.as_ref(), Some(&runner));
    let stored = turns::load(&bus, &turn)
        .await
        .expect("load")
        .expect("record");
    assert_eq!(stored.revision, current.revision);
}

/// A join decided on a stale chat read would give an ended turn its chat back (the read said it
/// was live); the join must decide on the stored record: the turn has left.
#[tokio::test]
async fn a_join_on_a_stale_chat_read_does_not_give_an_ended_turn_its_chat_back() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let chat = ChatId::new("rev2").expect("chat");
    let turn = TurnId::for_message(&chat, "m1");
    let joined = turnpike_store::chats::join(&bus, &chat, &turn, Some(1), None)
        .await
        .expect("join");
    assert!(
        matches!(joined, Joined::Live(_)),
        "the first turn of an idle chat is live"
    );
    let stale = turnpike_store::chats::read(&bus, &chat)
        .await
        .expect("read");
    // The turn ends and lets the chat go.
    turnpike_store::chats::update(&bus, &chat, |c| {
        c.live = None;
        (true, ())
    })
    .await
    .expect("release");
    // Its message is replayed, and the dispatcher still holds the read from before.
    let again = turnpike_store::chats::join(&bus, &chat, &turn, Some(1), Some(stale))
        .await
        .expect("join again");
    assert_eq!(
        again,
        Joined::Left,
        "the ended turn was given its chat back"
    );
    let c = chat_record(&bus, "rev2").await;
    assert_eq!(c.live, None);
}

/// A join at a stale revision writes nothing over the newer record: it fails, reads, and joins
/// behind the turn that became live meanwhile.
#[tokio::test]
async fn a_join_at_a_stale_revision_queues_behind_the_turn_that_went_first() {
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let chat = ChatId::new("rev3").expect("chat");
    let (first, second) = (
        TurnId::for_message(&chat, "m1"),
        TurnId::for_message(&chat, "m2"),
    );
    let stale = turnpike_store::chats::read(&bus, &chat)
        .await
        .expect("read");
    turnpike_store::chats::join(&bus, &chat, &first, Some(1), None)
        .await
        .expect("join first");
    let joined = turnpike_store::chats::join(&bus, &chat, &second, Some(2), Some(stale))
        .await
        .expect("join second");
    assert_eq!(joined, Joined::Waiting, "the second turn waits");
    let c = chat_record(&bus, "rev3").await;
    assert_eq!(c.live, Some(first));
    assert_eq!(c.waiting, vec![second]);
    assert_eq!(c.inbound_seq, 2);
}

/// A runner's event for `turn` attempt 1, as runner `r1` publishes it.
async fn publish_event(
    bus: &Bus,
    record: &turnpike_core::TurnRecord,
    id: &str,
    kind: turnpike_core::wire::RunnerEventKind,
) {
    let ev = turnpike_core::wire::RunnerEvent {
        v: turnpike_core::FORMAT_VERSION,
        turn: record.turn.clone(),
        chat: record.chat.clone(),
        attempt: 1,
        runner: turnpike_core::RunnerId::new("r1").expect("id"),
        at: turnpike_jetstream::now(),
        kind,
    };
    turnpike_jetstream::publish(
        &bus.js,
        bus.codec,
        subjects::events(&record.turn, &ev.runner),
        Some(id),
        &ev,
    )
    .await
    .expect("the events stream takes it");
}

/// Issue 19: a fast attempt's Started and Exited reach the coordinator together, and the turn
/// record is written once for both (it was written once for each). A malformed event between
/// them is refused alone. The events are in the stream before the coordinator starts, and it
/// waits up to 10 s for more of a started turn, so the batch does not depend on timing.
/// Failing first: on the coordinator before batches (7c483dd, without this test's setting) the
/// record was written twice after its creation.
#[tokio::test]
async fn a_fast_attempts_start_and_exit_are_written_to_the_turn_record_at_once() {
    use turnpike_core::wire::{ClaimHolder, ClaimRecord, RunnerEventKind};
    let server = NatsServer::start();
    let mut config = test_config(&server, AGENT);
    config.event_batch_wait = Duration::from_secs(10);
    // A dispatcher alone: attempt 1 is published, and nobody runs it but this test.
    let p = Pipeline::start_on(server, config.clone(), 0, false).await;
    let turn = send(&p.bus, "batch", "batch-m1", "x").await;
    let queued = turnpike_testkit::eventually(T, "the turn admitted", || async {
        turns::load(&p.bus, &turn)
            .await
            .ok()
            .flatten()
            .filter(|v| v.record.state == TurnState::Queued)
    })
    .await;
    let claim = ClaimRecord {
        v: 1,
        turn: turn.clone(),
        attempt: 1,
        holder: ClaimHolder::Runner {
            runner: turnpike_core::RunnerId::new("r1").expect("id"),
        },
        at: turnpike_jetstream::now(),
        token: None,
    };
    turnpike_tests::bucket(&p.bus, turnpike_core::subjects::BUCKET_CLAIMS)
        .await
        .create(
            subjects::claim_key(&turn, 1),
            serde_json::to_vec(&claim).expect("json").into(),
        )
        .await
        .expect("claimed");
    let started_at = turnpike_jetstream::now();
    publish_event(
        &p.bus,
        &queued.record,
        "batch-started",
        RunnerEventKind::Started {
            published_at: started_at,
        },
    )
    .await;
    publish_event(
        &p.bus,
        &queued.record,
        "batch-landed-0",
        RunnerEventKind::MessageLanded {
            seq: 0,
            stream_seq: None,
        },
    )
    .await;
    publish_event(
        &p.bus,
        &queued.record,
        "batch-exited",
        RunnerEventKind::Exited {
            report: ExitReport::without_output(
                ExitClass::Clean,
                "no reply",
                turnpike_jetstream::now(),
            ),
        },
    )
    .await;
    let coordinator = start_coordinator(&config).await;
    let done = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(done.state, TurnState::Done);
    let a = &done.attempts[0];
    assert_eq!(
        a.runner.as_ref().map(|r| r.as_str()),
        Some("r1"),
        "the start was applied"
    );
    assert!(a.started_at.is_some());
    // Revisions are the bucket stream's sequence, and this is the only turn: their difference
    // is the count of writes since the turn was admitted.
    let last = turns::load(&p.bus, &turn)
        .await
        .expect("load")
        .expect("record")
        .revision;
    assert_eq!(
        last - queued.revision,
        1,
        "the turn record was written {} times after its creation: once per event",
        last - queued.revision
    );
    let refused = turnpike_testkit::eventually(T, "the malformed event dead-lettered", || async {
        dead_letters(&p.bus)
            .await
            .into_iter()
            .find(|(_, reason)| reason.contains("start at 1; got 0"))
    })
    .await;
    assert_eq!(dead_letters(&p.bus).await.len(), 1, "{refused:?}");
    coordinator.stop().await;
    p.stop().await;
}
