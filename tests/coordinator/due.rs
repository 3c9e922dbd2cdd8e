//! Issue 36: the sweep looks at what is due, not at everything live. Built from the watches, a
//! coordinator's index sends a pass only the turns whose time has come: a queued first attempt
//! is looked for in the work queue with all the others in one listing, once a round; a waiting
//! turn owing nothing is never looked at; a new turn is looked at while it is fresh. What each
//! look decides is the sweep's as before: a queued attempt lost from the queue is dispatched
//! again. The live counts the coordinators answer come from the same index.

use super::*;
use turnpike_coordinator::due::Timing;
use turnpike_coordinator::follow;
use turnpike_coordinator::sweep::Sweeper;
use turnpike_core::wire::{ErroredChat, ErroredPage, ErroredQuery, LivePage, LiveQuery, LiveTurn};
use turnpike_testkit::eventually;

/// Create message `id` of `chat` as the dispatcher does.
async fn create(bus: &Bus, chat: &str, id: &str, seq: u64) -> TurnId {
    let chat = ChatId::new(chat).expect("chat");
    turnpike_testkit::plant::turn(bus, &chat, id, seq)
        .await
        .expect("create")
}

/// Flag chat `chat` errored (its turn gave up), as the coordinator would.
async fn flag(bus: &Bus, chat: &str) {
    let mut record: ChatRecord =
        serde_json::from_value(serde_json::json!({ "chat": chat })).expect("chat record");
    record.errored = Some(turnpike_core::wire::ChatError {
        turn: TurnId::new(format!("t-{chat}")).expect("turn"),
        at: turnpike_jetstream::now(),
        reason: "gave up".into(),
        cause: Some(turnpike_core::wire::ChatErrorCause::GaveUp),
    });
    turnpike_tests::bucket(bus, subjects::BUCKET_CHATS)
        .await
        .put(chat, serde_json::to_vec(&record).expect("json").into())
        .await
        .expect("flag");
}

/// Ask the coordinators' read model, as the operators' tools do (the query as JSON).
async fn ask(bus: &Bus, subject: &'static str, query: Vec<u8>) -> serde_json::Value {
    let answer = bus
        .client
        .request(subject, query.into())
        .await
        .expect("an answer");
    serde_json::from_slice(&answer.payload).expect("JSON")
}

/// The sweep's pass in this test: a turn changed is looked at a pass after its change.
const PASS: Duration = Duration::from_millis(200);

async fn state(bus: &Bus, turn: &TurnId) -> TurnState {
    turnpike_store::turns::load(bus, turn)
        .await
        .expect("read")
        .expect("record")
        .record
        .state
}

#[tokio::test]
async fn the_sweep_looks_at_what_is_due_not_at_what_is_live() {
    init_logs();
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    // A dispatch again goes under the first one's dedup id: out of the window, it is published.
    super::outbox::shorten_duplicate_window(
        &bus,
        subjects::STREAM_WORK,
        Duration::from_millis(200),
    )
    .await;
    // Chat a: one queued turn and twenty waiting behind it. Chat b: one queued turn whose work
    // item a purge of the work queue lost.
    let queued = create(&bus, "a", "a-0", 1).await;
    let mut waiting = Vec::new();
    for i in 1..=20 {
        waiting.push(create(&bus, "a", &format!("a-{i}"), i + 1).await);
    }
    let lost = create(&bus, "b", "b-0", 1).await;
    assert_eq!(state(&bus, &queued).await, TurnState::Queued);
    assert_eq!(state(&bus, &lost).await, TurnState::Queued);
    assert_eq!(state(&bus, &waiting[19]).await, TurnState::Waiting);
    bus.js
        .get_stream(subjects::STREAM_WORK)
        .await
        .expect("work stream")
        .purge()
        .filter(subjects::work_run(&lost))
        .await
        .expect("purge");
    let present = turnpike_store::work::queued_turns(&bus)
        .await
        .expect("list");
    assert!(
        present.contains(&queued) && !present.contains(&lost),
        "{present:?}"
    );
    // Past the window (the server drops expired ids on a timer of the window's length).
    tokio::time::sleep(Duration::from_secs(2)).await;

    flag(&bus, "z").await;

    let index = follow::Shared::new(Timing::new(PASS));
    let token = tokio_util::sync::CancellationToken::new();
    let follower = tokio::spawn(follow::follow(bus.clone(), index.clone(), token.clone()));
    eventually(T, "the index built", || async {
        index.lock().ready.then_some(())
    })
    .await;
    // The coordinators' live counts, from the index, are the stored records' counts.
    let stored = turnpike_store::views::count_by_state(
        &turnpike_store::views::live_turns(&bus).await.expect("live"),
    );
    assert_eq!(index.count_by_state(), Some(stored));
    assert_eq!(
        index.count_by_state(),
        Some(vec![(TurnState::Queued, 2), (TurnState::Waiting, 20)])
    );

    // The cluster view asked of a coordinator is the one read from the buckets, errored chats
    // included, those flagged before the index was built and after.
    flag(&bus, "y").await;
    eventually(T, "both errored chats in the model", || async {
        (index.status()?.errored.len() == 2).then_some(())
    })
    .await;
    let counters = std::sync::Arc::new(turnpike_coordinator::Counters::default());
    let ops = tokio::spawn(turnpike_coordinator::ops::serve(
        bus.clone(),
        config.clone(),
        counters.clone(),
        index.clone(),
        token.clone(),
    ));
    let at = turnpike_jetstream::now();
    // Asked of the coordinator itself (not the view's fallback, which reads).
    let asked: turnpike_store::views::Cluster = eventually(T, "a coordinator's answer", || async {
        let answer = bus
            .client
            .request(subjects::OPS_STATUS, bytes::Bytes::new())
            .await
            .ok()?;
        serde_json::from_slice(&answer.payload).ok()
    })
    .await;
    let read = turnpike_store::views::read_cluster(&bus, at)
        .await
        .expect("read");
    assert_eq!(asked, read);
    assert_eq!(
        turnpike_store::views::cluster(&bus, at)
            .await
            .expect("view"),
        read
    );
    assert_eq!((asked.errored_chats, asked.gave_up_last_hour), (2, 2));
    assert_eq!(asked.live_in(TurnState::Waiting), 20);

    // The lists, asked of the coordinator, page what the stored records hold.
    let records = turnpike_store::views::live_turns(&bus).await.expect("live");
    let stored: Vec<LiveTurn> = records.iter().map(LiveTurn::of).collect();
    for (state, offset, limit) in [
        (None, 0, 10),
        (None, 20, 10),
        (Some(TurnState::Queued), 0, 5),
    ] {
        let query = LiveQuery {
            v: 1,
            state,
            since: None,
            offset,
            limit,
        };
        let body = serde_json::to_vec(&query).expect("query");
        let asked: LivePage =
            serde_json::from_value(ask(&bus, subjects::OPS_LIVE, body).await).expect("a page");
        assert_eq!(asked, LivePage::of(stored.iter(), &query), "{query:?}");
    }
    let flagged: Vec<ErroredChat> = turnpike_store::views::chats(&bus)
        .await
        .expect("chats")
        .iter()
        .filter_map(ErroredChat::of)
        .collect();
    let query = ErroredQuery {
        v: 1,
        since: None,
        offset: 0,
        limit: 10,
    };
    let body = serde_json::to_vec(&query).expect("query");
    let asked: ErroredPage =
        serde_json::from_value(ask(&bus, subjects::OPS_ERRORED, body).await).expect("a page");
    assert_eq!(asked.total, 2);
    assert_eq!(asked, ErroredPage::of(flagged.iter(), &query));

    let mut sweeper = Sweeper::default();
    // The first pass is a round: both queued turns are looked for in the queue at once; the one
    // not found is looked at in full at the next pass, and dispatched again. No waiting turn is
    // looked at.
    let first = sweeper
        .pass_due(&bus, &config, &counters, &index)
        .await
        .expect("pass");
    assert_eq!(
        (first.live, first.looked_at, first.rescheduled),
        (22, 2, 0),
        "{first:?}"
    );
    let second = sweeper
        .pass_due(&bus, &config, &counters, &index)
        .await
        .expect("pass");
    assert_eq!(
        (second.live, second.looked_at, second.rescheduled),
        (22, 1, 1),
        "{second:?}"
    );
    let present = turnpike_store::work::queued_turns(&bus)
        .await
        .expect("list");
    assert!(present.contains(&lost), "dispatched again: {present:?}");
    // Until the next round, nothing is due.
    for _ in 0..3 {
        let again = sweeper
            .pass_due(&bus, &config, &counters, &index)
            .await
            .expect("pass");
        assert_eq!((again.looked_at, again.rescheduled), (0, 0), "{again:?}");
    }
    // A turn created now is looked at once, a pass after the watch has brought it (was its
    // work item published?), then only in rounds.
    let fresh = create(&bus, "c", "c-0", 1).await;
    eventually(T, "the new turn in the index", || async {
        (index.lock().index.live() == 23).then_some(())
    })
    .await;
    tokio::time::sleep(PASS).await;
    let looks = [
        sweeper.pass_due(&bus, &config, &counters, &index).await,
        sweeper.pass_due(&bus, &config, &counters, &index).await,
    ]
    .map(|r| r.expect("pass"));
    assert_eq!(
        looks
            .each_ref()
            .map(|r| (r.live, r.looked_at, r.rescheduled)),
        [(23, 1, 0), (23, 0, 0)],
        "{looks:?}"
    );
    assert_eq!(state(&bus, &fresh).await, TurnState::Queued);
    token.cancel();
    follower.await.expect("follower");
    ops.await.expect("ops").expect("ops served");
}

/// A view waits until the read model holds every write made before it was asked. A write that
/// lands between any two steps of the follower's start (each watch started, the buckets'
/// revisions read, the build) is counted: were the revisions read before a watch started, a
/// write in between would come through no watch and be in no baseline, and every view would
/// wait out its second in vain. One write at one step per start (a later write, seen by a
/// watch, would hide an earlier one missed), at every step in turn.
#[tokio::test]
async fn writes_made_while_the_model_starts_are_counted() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use turnpike_store::views::Watched;
    init_logs();
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    create(&bus, "a", "a-0", 1).await;
    let query = LiveQuery {
        v: 1,
        state: None,
        since: None,
        offset: 0,
        limit: 100,
    };
    for at in 0.. {
        let gate = std::sync::Arc::new(follow::StartGate::default());
        let index = follow::Shared::gated(Timing::new(PASS), gate.clone());
        let token = tokio_util::sync::CancellationToken::new();
        let follower = tokio::spawn(follow::follow(bus.clone(), index.clone(), token.clone()));
        // Before step `at`: a new turn (live index, record, chat) and a chat flagged errored.
        let steps = std::sync::Arc::new(AtomicUsize::new(0));
        let writer = {
            let (bus, gate, steps) = (bus.clone(), gate.clone(), steps.clone());
            tokio::spawn(async move {
                loop {
                    gate.step.notified().await;
                    if steps.fetch_add(1, Ordering::SeqCst) == at {
                        create(&bus, &format!("b{at}"), "m", 1).await;
                        flag(&bus, &format!("z{at}")).await;
                    }
                    gate.proceed.notify_one();
                }
            })
        };
        eventually(T, "the index built", || async {
            index.lock().ready.then_some(())
        })
        .await;
        // A hold lets the follower on only after its writes: none is in flight now.
        writer.abort();
        let _ = writer.await;
        let taken = steps.load(Ordering::SeqCst);
        assert!(taken >= 6, "a hold before every step: {taken}");
        let caught_up = index
            .catch_up(&bus, &[Watched::Live, Watched::Turns, Watched::Chats])
            .await;
        let live = turnpike_store::views::live_ids(&bus).await.expect("live");
        let page = index.live_page(&query).expect("built");
        let errored = index.status().expect("built").errored.len();
        token.cancel();
        follower.await.expect("follower");
        assert!(caught_up, "a write before step {at} of {taken} is counted");
        assert_eq!(page.total, live.len(), "{page:?}");
        assert_eq!(errored, live.len() - 1);
        if at >= taken {
            break;
        }
    }
}
