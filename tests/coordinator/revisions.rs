//! Writes at a revision the writer already knows (issue 19: no read before a compare-and-set).
//! A known record may be stale; each test makes it so and checks that nothing is decided on it:
//! it may only cost a failed write and a read.

use super::*;
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
    assert!(joined.is_some(), "the first turn of an idle chat is live");
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
    assert_eq!(again, None, "the ended turn was given its chat back");
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
    assert_eq!(joined, None, "the second turn waits");
    let c = chat_record(&bus, "rev3").await;
    assert_eq!(c.live, Some(first));
    assert_eq!(c.waiting, vec![second]);
    assert_eq!(c.inbound_seq, 2);
}
