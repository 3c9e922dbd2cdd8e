//! Recovery from deaths between protocol steps that the scripted faults never hit (issue 16).

use futures::StreamExt;
use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::subjects;
use turnpike_core::wire::ExitClass;
use turnpike_core::{ChatId, TurnId};
use turnpike_store::Bus;
use turnpike_testkit::eventually;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const ROLE: &str = env!("CARGO_BIN_EXE_test-role");
const T: Duration = Duration::from_secs(60);

fn classes(record: &turnpike_core::TurnRecord) -> Vec<Option<ExitClass>> {
    record
        .attempts
        .iter()
        .map(|a| a.exit.as_ref().map(|e| e.class))
        .collect()
}

/// Item 2: the runner that claimed a retry dies before it reports starting it. The turn is
/// `pending_retry` with a claim, and must still get its next attempt (the claim's lease lapses).
#[tokio::test]
async fn a_retry_whose_runner_dies_between_claim_and_start_is_retried_again() {
    init_logs();
    let f = Faulty::start(AGENT).await;
    let (proxy, config) = (&f.proxy, &f.config);
    let roles = [
        start_dispatcher(config).await,
        start_coordinator(config).await,
    ];
    let bus = Bus::connect(config, "test").await.expect("bus");
    let turn = TurnId::for_message(&ChatId::new("chat-r").expect("chat"), "m-1");
    let mut claim2 = turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_CLAIMS)
        .await
        .watch(subjects::claim_key(&turn, 2))
        .await
        .expect("watch the claim");
    // A runner in its own process whose every round trip is slow, so that after claiming it
    // still has several to go before it could report the attempt started.
    proxy.set_delay(Duration::from_millis(300));
    let mut doomed = RoleProcess::start(
        ROLE,
        "runner",
        &turnpike_config::Config {
            runner_id: Some("doomed".into()),
            ..f.through_proxy()
        },
    );
    send(&bus, "chat-r", "m-1", "die-until:3").await;
    // Attempt 1 dies on it; the moment it claims the retry, it is killed -9.
    claim2
        .next()
        .await
        .expect("attempt 2 claimed")
        .expect("entry");
    doomed.kill9();
    let pending = turnpike_store::turns::load(&bus, &turn)
        .await
        .expect("read")
        .expect("turn")
        .record;
    assert_eq!(pending.state, TurnState::PendingRetry, "{pending:#?}");
    let healthy = start_runner(&turnpike_config::Config {
        runner_id: Some("healthy".into()),
        ..config.clone()
    })
    .await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:#?}");
    assert_eq!(
        classes(&record),
        vec![
            Some(ExitClass::Crashed),
            Some(ExitClass::RunnerLost),
            Some(ExitClass::Clean)
        ]
    );
    assert_eq!(record.retry_count, 2);
    healthy.stop().await;
    for r in roles {
        r.stop().await;
    }
}

/// Item 10: a kill that lands between the dispatcher's create and its join used to leave the
/// killed turn as its chat's live turn forever, so the chat's next message never ran. Since
/// issue 19 an idle chat's new turn joins before its record exists (the record is created
/// admitted), so that window is a busy chat's: a turn is running when the message comes.
#[tokio::test]
async fn a_turn_killed_before_it_joined_its_chat_does_not_wedge_the_chat() {
    init_logs();
    let f = Faulty::start(AGENT).await;
    let (proxy, config) = (&f.proxy, &f.config);
    // The dispatcher's every round trip is slow, so the kill lands between its steps.
    proxy.set_delay(Duration::from_millis(300));
    let dispatcher = start_dispatcher(&f.through_proxy()).await;
    let roles = [start_coordinator(config).await, start_runner(config).await];
    let bus = Bus::connect(config, "test").await.expect("bus");
    let running = send(&bus, "chat-w", "m-0", "hang").await;
    wait_state(&bus, &running, TurnState::Running).await;
    let first = TurnId::for_message(&ChatId::new("chat-w").expect("chat"), "m-1");
    let mut created = turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_TURNS)
        .await
        .watch(first.as_str())
        .await
        .expect("watch");
    send(&bus, "chat-w", "m-1", "hang").await;
    tokio::time::timeout(T, created.next())
        .await
        .expect("the turn created in time")
        .expect("created")
        .expect("entry");
    let reply = kill_turn(&bus, &first).await;
    assert!(reply.ok, "{reply:?}");
    let second = send(&bus, "chat-w", "m-2", "reply:after the kill").await;
    // The running turn ends too (whether before or after the killed one joined: both are
    // orders a chat may see); then the chat must go on to its next message.
    assert!(kill_turn(&bus, &running).await.ok);
    let r = wait_ended(&bus, &second, T).await;
    assert_eq!(r.state, TurnState::Done, "{r:#?}");
    let killed = wait_ended(&bus, &first, T).await;
    assert_eq!(killed.state, TurnState::Killed);
    assert!(killed.attempts.is_empty(), "it never ran: {killed:#?}");
    let chat = turnpike_store::chats::update(&bus, &ChatId::new("chat-w").expect("chat"), |c| {
        (false, c.clone())
    })
    .await
    .expect("chat record");
    assert_eq!(chat.live, None, "{chat:#?}");
    assert!(chat.waiting.is_empty(), "{chat:#?}");
    dispatcher.stop().await;
    for r in roles {
        r.stop().await;
    }
}

/// Item 4: once the server says a lease lapsed, the runner never renews it again and stops its
/// run; it used to re-create the lease with its next renewal and keep a zombie run going beside
/// the retry. The lapse is made by marking the lease deleted, as its TTL would.
#[tokio::test]
async fn a_runner_whose_lease_lapsed_stops_its_run_and_never_renews_it() {
    init_logs();
    let p = Pipeline::start(AGENT, |c| c.max_turn_retry = 1).await;
    let turn = send(&p.bus, "chat-z", "m-1", "hang").await;
    wait_state(&p.bus, &turn, TurnState::Running).await;
    let key = lease_key(&p.bus, &turn, 1).await;
    turnpike_jetstream::kv_delete(&p.bus.js, subjects::BUCKET_LEASES, &key, None)
        .await
        .expect("delete the lease");
    // The runner's own report: it stopped the run because its lease was gone.
    let report = exit_report(&p.bus, &turn, 1).await;
    assert_eq!(report.class, ExitClass::RunnerLost, "{report:?}");
    assert!(
        report
            .error
            .as_deref()
            .is_some_and(|e| e.contains("LeaseLost")),
        "{report:?}"
    );
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::GaveUp);
    // And the lease stays gone: nobody renewed it.
    let lease = turnpike_tests::bucket(&p.bus, turnpike_core::subjects::BUCKET_LEASES)
        .await
        .get(&key)
        .await
        .expect("read lease");
    assert!(
        lease.as_ref().is_none_or(|v| v.is_empty()),
        "renewed: {lease:?}"
    );
    p.stop().await;
}

/// Item 12: an ended turn leaves the live index with a purge marker that expires by itself, so
/// the sweep's listing of the index grows with live turns, not with every turn that ever ended.
#[tokio::test]
async fn an_ended_turn_leaves_the_live_index_with_a_marker_that_expires() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "chat-m", "m-1", "reply:done").await;
    wait_ended(&p.bus, &turn, T).await;
    let stream = p
        .bus
        .js
        .get_stream(format!("KV_{}", subjects::BUCKET_LIVE))
        .await
        .expect("live stream");
    let marker = eventually(T, "the purge marker", || async {
        stream
            .get_last_raw_message_by_subject(&format!("$KV.{}.{turn}", subjects::BUCKET_LIVE))
            .await
            .ok()
            .filter(|m| m.headers.get("KV-Operation").is_some())
    })
    .await;
    assert_eq!(
        marker.headers.get("KV-Operation").map(|v| v.as_str()),
        Some("PURGE")
    );
    assert_eq!(
        marker.headers.get("Nats-TTL").map(|v| v.as_str()),
        Some("60"),
        "{:?}",
        marker.headers
    );
    p.stop().await;
}

/// Item 9: a dispatcher dies holding a chat's first two messages (delivered, never handled); they
/// come back only after the consumer's ack wait, while the chat's third message is delivered at
/// once to the next dispatcher. The third must still run after the first two.
#[tokio::test]
async fn a_chats_order_survives_a_dispatcher_that_died_holding_its_messages() {
    init_logs();
    let f = Faulty::start(AGENT).await;
    let (proxy, config) = (&f.proxy, &f.config);
    let roles = [start_coordinator(config).await, start_runner(config).await];
    let bus = Bus::connect(config, "test").await.expect("bus");
    let doomed = start_dispatcher(&f.through_proxy()).await;
    // Warm up: the doomed dispatcher is pulling.
    let warm = send(&bus, "chat-warm", "w", "reply:warm").await;
    wait_ended(&bus, &warm, T).await;
    proxy.hold().await;
    let m1 = send(&bus, "chat-o", "m-1", "reply:first").await;
    let m2 = send(&bus, "chat-o", "m-2", "reply:second").await;
    let consumer = bus
        .js
        .get_stream(subjects::STREAM_CHAT_IN)
        .await
        .expect("stream")
        .get_consumer::<async_nats::jetstream::consumer::pull::Config>(
            subjects::CONSUMER_DISPATCHER,
        )
        .await
        .expect("consumer");
    eventually(T, "both delivered to the doomed dispatcher", || {
        let mut c = consumer.clone();
        async move {
            c.info()
                .await
                .ok()
                .filter(|i| i.num_ack_pending == 2)
                .map(|_| ())
        }
    })
    .await;
    doomed.abort();
    proxy.release();
    let survivor = start_dispatcher(config).await;
    let m3 = send(&bus, "chat-o", "m-3", "reply:third").await;
    let mut ended = Vec::new();
    for t in [&m1, &m2, &m3] {
        let r = wait_ended(&bus, t, Duration::from_secs(120)).await;
        assert_eq!(r.state, TurnState::Done);
        ended.push(r);
    }
    let started = |i: usize| ended[i].attempts[0].started_at.expect("started");
    let finished = |i: usize| ended[i].attempts[0].exit.as_ref().expect("exit").ended_at;
    assert!(started(1) >= finished(0), "m-2 ran before m-1 ended");
    assert!(started(2) >= finished(1), "m-3 ran before m-2 ended");
    let order: Vec<_> = visible_items(&bus, "chat-o")
        .await
        .into_iter()
        .map(|i| i.text)
        .collect();
    assert_eq!(order, vec!["first", "second", "third"]);
    survivor.stop().await;
    for r in roles {
        r.stop().await;
    }
}

/// Found by the model checker (`Bugs::trust_uncertain_count`): a bot message whose publish is
/// stored but never acknowledged. The runner used to give up on it after five tries and report
/// the attempt as having landed nothing, so a turn that had replied was retried. Now an attempt
/// with such a publish is fenced out and counted from the stream before anything is reported.
#[tokio::test]
async fn a_reply_stored_without_an_acknowledgement_is_never_followed_by_a_retry() {
    init_logs();
    let f = Faulty::start(AGENT).await;
    // A lease long enough that the runner, not the sweep, reports the attempt: it outlives the
    // runner's six unacknowledged tries (5 s each). The fixed runner cannot fence its attempt
    // out while the acknowledgements are held, so it sends no report and the sweep settles the
    // attempt once this lease lapses.
    let mut config = f.config.clone();
    config.lease = Duration::from_secs(45);
    let mut cut_off = f.through_proxy();
    cut_off.lease = config.lease;
    let proxy = &f.proxy;
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
        start_runner(&cut_off).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = send(&bus, "chat-u", "u", "crash-after-reply:1").await;
    let record = || async {
        turnpike_store::turns::load(&bus, &turn)
            .await
            .ok()
            .flatten()
            .map(|v| v.record)
    };
    eventually(T, "the attempt running", || async {
        record().await.filter(|r| r.state == TurnState::Running)
    })
    .await;
    // Its reply (1 s from now) reaches the server; no acknowledgement comes back.
    proxy.hold_replies().await;
    // The runner gives up on the acknowledgement. The old runner then reported "nothing landed"
    // (a retry follows); with the fix, the attempt is fenced out (by the runner, or by the sweep
    // once the lease lapses) before anything is counted.
    eventually(
        Duration::from_secs(120),
        "the runner's next move",
        || async {
            let fenced_out = turnpike_store::fence::last(&bus, &turn)
                .await
                .ok()
                .flatten()
                .and_then(|l| l.marker)
                .is_some_and(|m| m.holder == turnpike_core::fence::FenceHolder::Lost);
            let decided = record()
                .await
                .is_some_and(|r| r.state.is_terminal() || r.attempts.len() > 1);
            (fenced_out || decided).then_some(())
        },
    )
    .await;
    proxy.release();
    let record = eventually(Duration::from_secs(180), "the turn decided", || async {
        record()
            .await
            .filter(|r| r.state.is_terminal() || r.attempts.len() > 1)
    })
    .await;
    let items = visible_items(&bus, "chat-u").await;
    assert!(
        items
            .iter()
            .any(|i| i.text == "partial answer before crashing"),
        "the reply landed: {items:?}"
    );
    assert_eq!(
        record.attempts.len(),
        1,
        "no retry after a reply: {record:#?}"
    );
    assert_eq!(record.attempts[0].messages_landed, 1, "{record:#?}");
    for r in roles {
        r.stop().await;
    }
}

/// A heartbeat far longer than the tests below last: no runner writes a lease meanwhile.
fn long_heartbeat(c: &mut turnpike_config::Config) {
    c.heartbeat = Duration::from_secs(20);
    c.lease = Duration::from_secs(60);
}

/// Issue 19: a run writes its lease a heartbeat after its claim, so a run shorter than that
/// writes none; and a sweep that finds a claimed attempt with no lease yet leaves it alone until
/// it has found none for a whole lease (fails with the lease taken before the claim, and with the
/// sweep calling such an attempt lost at once).
#[tokio::test]
async fn a_run_within_its_first_heartbeat_has_no_lease_and_is_not_declared_lost() {
    init_logs();
    let p = Pipeline::start(AGENT, long_heartbeat).await;
    let quick = send(&p.bus, "chat-q", "q-1", "reply:quick").await;
    assert_eq!(wait_ended(&p.bus, &quick, T).await.state, TurnState::Done);
    let key = lease_key(&p.bus, &quick, 1).await;
    let lease = turnpike_tests::bucket(&p.bus, turnpike_core::subjects::BUCKET_LEASES)
        .await
        .entry(&key)
        .await
        .expect("read lease");
    assert!(lease.is_none(), "a short run wrote a lease: {lease:?}");

    let told = ToldTurn::start(&p.bus, "chat-s", "s-1").await;
    let slow = told.turn.clone();
    // Two passes of one sweeper, well within a lease of each other.
    let mut sweeper = turnpike_coordinator::sweep::Sweeper::default();
    for _ in 0..2 {
        let report = sweeper
            .pass(&p.bus, &p.config, &Default::default())
            .await
            .expect("sweep");
        assert_eq!(report.runner_lost, 0, "{report:?}");
    }
    // The run is untouched: its reply lands, and the turn is still on its first attempt.
    told.tell();
    eventually(T, "the reply", || async {
        visible_items(&p.bus, "chat-s")
            .await
            .iter()
            .any(|i| i.turn == slow && i.text.contains("once told"))
            .then_some(())
    })
    .await;
    let record = wait_state(&p.bus, &slow, TurnState::Running).await;
    assert_eq!(record.attempts.len(), 1);
    assert!(record.attempts[0].exit.is_none(), "{record:#?}");
    kill_turn(&p.bus, &slow).await;
    p.stop().await;
}

/// Issue 19: a claimed attempt of which the sweeper has found no lease for a whole lease is lost
/// (its runner died before writing one): fenced out, reported `runner_lost`, and its lease key
/// marked, so a runner that could still write its first lease finds the marker and stops. The
/// sweeper's lease is made shorter than the runner's to stand for the time that passed.
#[tokio::test]
async fn an_attempt_without_a_lease_for_a_whole_lease_is_lost_and_its_lease_key_marked() {
    init_logs();
    let p = Pipeline::start(AGENT, |c| {
        long_heartbeat(c);
        c.max_turn_retry = 1;
    })
    .await;
    let turn = send(&p.bus, "chat-d", "d-1", "hang").await;
    wait_state(&p.bus, &turn, TurnState::Running).await;
    let sweep_config = turnpike_config::Config {
        lease: Duration::from_millis(300),
        ..p.config.clone()
    };
    let mut sweeper = turnpike_coordinator::sweep::Sweeper::default();
    let first = sweeper
        .pass(&p.bus, &sweep_config, &Default::default())
        .await
        .expect("sweep");
    assert_eq!(first.runner_lost, 0, "found none once: not yet");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let second = sweeper
        .pass(&p.bus, &sweep_config, &Default::default())
        .await
        .expect("sweep");
    assert_eq!(second.runner_lost, 1, "{second:?}");
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::GaveUp, "{record:#?}");
    assert_eq!(
        record.attempts[0].exit.as_ref().map(|e| e.class),
        Some(ExitClass::RunnerLost)
    );
    let stream = p
        .bus
        .js
        .get_stream(format!("KV_{}", subjects::BUCKET_LEASES))
        .await
        .expect("leases stream");
    let key = lease_key(&p.bus, &turn, 1).await;
    let marker = stream
        .get_last_raw_message_by_subject(&format!("$KV.{}.{key}", subjects::BUCKET_LEASES))
        .await
        .expect("a marker on the lease key");
    // A delete marker, not a purge: the leases bucket refuses roll-ups (a runner could wipe it).
    assert_eq!(
        marker.headers.get("KV-Operation").map(|v| v.as_str()),
        Some("DEL")
    );
    p.stop().await;
}

/// Issue 32: a claim stored whose acknowledgement never came back (the connection dropped
/// while it was on its way) is its writer's. async-nats's `create` reads the key back after
/// a failed write and calls it "already exists"; taken for another runner's, the runner
/// dropped the attempt it held, and the turn spent an attempt on nothing. The claim as
/// stored decides: the same holder and token are ours; anyone else's stays theirs. (Fails
/// with an existing claim taken for another's without reading whose it is.)
#[tokio::test]
async fn a_claim_whose_acknowledgement_was_lost_is_its_writers() {
    use turnpike_core::wire::{ClaimHolder, ClaimRecord};
    use turnpike_store::claims::{self, Created};
    init_logs();
    let f = Faulty::start(AGENT).await;
    let cut_off = Bus::connect(&f.through_proxy(), "claimer")
        .await
        .expect("bus");
    let direct = Bus::connect(&f.config, "observer").await.expect("bus");
    let turn = TurnId::for_message(&ChatId::new("claims").expect("chat"), "m-1");
    let claim = |token: &str| ClaimRecord {
        v: 1,
        turn: turn.clone(),
        attempt: 1,
        holder: ClaimHolder::Runner {
            runner: turnpike_core::RunnerId::new("r-1").expect("id"),
        },
        at: turnpike_jetstream::now(),
        token: Some(token.to_owned()),
    };
    f.proxy.hold_replies().await;
    let mine = claim("delivery-1");
    let creating = tokio::spawn(async move { claims::create(&cut_off, &mine).await });
    let key = subjects::claim_key(&turn, 1);
    eventually(T, "the claim stored", || async {
        turnpike_tests::bucket(&direct, turnpike_core::subjects::BUCKET_CLAIMS)
            .await
            .get(&key)
            .await
            .ok()
            .flatten()
    })
    .await;
    // Its acknowledgement is lost with the connection; the client connects again.
    f.proxy.cut();
    f.proxy.release();
    f.proxy.restore();
    let created = tokio::time::timeout(T, creating)
        .await
        .expect("the create settles")
        .expect("task");
    assert_eq!(created.expect("create"), Created::Ours);
    // The same runner handling another delivery of the attempt, or anyone else: not theirs.
    let second = claims::create(&direct, &claim("delivery-2"))
        .await
        .expect("create");
    assert!(matches!(second, Created::Held(_)), "{second:?}");
}

/// Issue 32: a turn waiting (in its chat's queue, or for a runner) never expires from the turns
/// bucket while it waits; only an ended turn's record is kept just `retention_turns`. Here the
/// retention is two seconds and no runner comes for longer: both turns still run, in order,
/// once one does. (Failed with the bucket's age limit: the records went, and the chat with
/// them.)
#[tokio::test]
async fn turns_waiting_longer_than_the_retention_still_run_and_then_expire() {
    init_logs();
    let server = turnpike_testkit::NatsServer::start();
    let mut config = test_config(&server, AGENT);
    config.retention_turns = Duration::from_secs(2);
    let p = Pipeline::start_on(server, config, 0, true).await;
    let first = send(&p.bus, "patient", "p1", "reply:first").await;
    let second = send(&p.bus, "patient", "p2", "reply:second").await;
    wait_state(&p.bus, &second, TurnState::Waiting).await;
    // Past the retention several times over, with nothing to run them.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let runner = start_runner(&p.config).await;
    for t in [&first, &second] {
        assert_eq!(wait_ended(&p.bus, t, T).await.state, TurnState::Done);
    }
    let texts: Vec<String> = visible_items(&p.bus, "patient")
        .await
        .into_iter()
        .map(|i| i.text)
        .collect();
    assert_eq!(texts, ["first", "second"]);
    // Ended, they are kept only the retention.
    eventually(T, "the ended records to expire", || async {
        let gone = turnpike_store::turns::load(&p.bus, &first)
            .await
            .ok()?
            .is_none()
            && turnpike_store::turns::load(&p.bus, &second)
                .await
                .ok()?
                .is_none();
        gone.then_some(())
    })
    .await;
    runner.stop().await;
    p.stop().await;
}
