//! The fault suite: Turnpike as containers (3-node R3 NATS cluster, 2 coordinators, a
//! dispatcher, Docker runners; see `cluster.rs`) on a private Docker network, with nodes killed,
//! cut off and restarted under load. Every case judges turn records and chat output, never logs,
//! and adds a row (case, turns, lost, duplicated, wrong outcome) to target/fault-summary.tsv,
//! which `tests/run.sh` prints as a table.
//!
//! Run alone, one case at a time: `cargo nextest run -p turnpike-tests --test faults
//! --test-threads 1`. `TURNPIKE_SOAK=<k>` multiplies every load by k (the long run).

use futures::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use turnpike_core::lifecycle::TurnState;
use turnpike_core::wire::{Attachment, ExitClass, OutboundKind, RunnerEvent, RunnerEventKind};
use turnpike_core::{subjects, ChatId, RunnerId, TurnId, TurnRecord, FORMAT_VERSION};
use turnpike_store::turns;
use turnpike_testkit::eventually;
use turnpike_tests::cluster::*;
use turnpike_tests::{
    connect_as, dead_letters, init_logs, send_message, visible_items, wait_state,
};

/// How long a case waits for its turns to end: generous (an R3 cluster and six roles share two
/// cores here), and longer for a soak.
fn long() -> Duration {
    Duration::from_secs(300 * soak() as u64)
}

async fn record(c: &Cluster, turn: &TurnId) -> TurnRecord {
    turns::load(&c.bus, turn)
        .await
        .expect("read turn")
        .expect("turn exists")
        .record
}

/// Count every node of the cluster that is not running, or has restarted, as a wrong outcome.
async fn no_restarts(c: &Cluster, tally: &mut Tally) {
    let mut names: Vec<String> = vec!["nats-1".into(), "nats-2".into(), "nats-3".into()];
    names.extend((1..=c.opts.coordinators).map(|k| format!("coordinator-{k}")));
    names.push("dispatcher".into());
    names.extend((1..=c.opts.runners).map(|k| format!("runner-{k}")));
    for name in &names {
        let (running, restarts) = c.state(name).await;
        if !running || restarts > 0 {
            tally.wrong += 1;
            tally
                .problems
                .push(format!("{name}: running {running}, restarts {restarts}"));
        }
    }
}

fn runner_name(c: &Cluster, runner: &RunnerId) -> String {
    let prefix = format!("tpf{}-", c.id);
    runner
        .as_str()
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("runner {runner} is not this cluster's"))
        .to_owned()
}

/// 1. `docker kill` a runner while it runs attempts: each of its turns is retried on another
/// runner, with attempt 1 recorded as runner lost; nothing lost or doubled. Restarted, the runner
/// removes the containers its earlier life left.
#[tokio::test]
async fn f1_runner_killed_while_running_attempts() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let victim = c.runner_id(1);
    let mut expects = Vec::new();
    for i in 0..9 * soak() {
        let t = send_acked(
            &c.bus,
            &format!("f1-{i}"),
            &format!("f1-m{i}"),
            "sleep:8",
            30,
        )
        .await;
        expects.push(Expect {
            turn: t,
            state: TurnState::Done,
            attempts: None,
            replies: 1,
        });
    }
    eventually(
        Duration::from_secs(90),
        "runner-1 running attempts",
        || async {
            let running = c.agents_of(&victim).await.iter().filter(|a| a.3).count();
            (running >= 1).then_some(())
        },
    )
    .await;
    c.kill("runner-1").await;
    let mut tally = judge(&c.bus, "1 runner killed", &expects, long()).await;

    let mut moved = 0;
    for e in &expects {
        let r = record(&c, &e.turn).await;
        if r.attempts[0].runner.as_ref().map(|x| x.as_str()) != Some(victim.as_str()) {
            continue;
        }
        moved += 1;
        let first = r.attempts[0].exit.as_ref().map(|x| x.class);
        let second = r.attempts.get(1).and_then(|a| a.runner.clone());
        if r.attempts.len() != 2
            || first != Some(ExitClass::RunnerLost)
            || second.as_ref().map(|x| x.as_str()) == Some(victim.as_str())
        {
            tally.wrong += 1;
            tally.problems.push(format!(
                "{}: {} attempts, first {first:?}, second on {second:?}",
                e.turn,
                r.attempts.len()
            ));
        }
    }
    assert!(moved >= 1, "the killed runner held no attempt");
    // The restarted runner reaps what its earlier life left running.
    c.start_container("runner-1").await;
    eventually(
        Duration::from_secs(90),
        "runner-1's leftovers removed",
        || async { c.agents_of(&victim).await.is_empty().then_some(()) },
    )
    .await;
    tally.note = format!("{moved} turns moved off the killed runner");
    tally.report();
}

/// 2. Cut a runner off its network mid-run: it kills its own container before its lease ends,
/// the turn is retried elsewhere, and once reconnected nothing it sends for the stale attempt
/// lands or changes the outcome.
#[tokio::test]
async fn f2_runner_cut_off_mid_run() {
    init_logs();
    let opts = ClusterOpts {
        runners: 2,
        ..ClusterOpts::default()
    };
    let lease = opts.lease;
    let c = Cluster::start(opts).await;
    let mut expects = Vec::new();
    let mut victims = Vec::new();
    for i in 0..soak() {
        let turn = send_acked(
            &c.bus,
            &format!("f2-{i}"),
            &format!("f2-m{i}"),
            "sleep:20",
            30,
        )
        .await;
        let r = wait_state(&c.bus, &turn, TurnState::Running).await;
        let runner = r.attempts[0].runner.clone().expect("a runner holds it");
        let name = runner_name(&c, &runner);
        eventually(
            Duration::from_secs(60),
            "the agent container runs",
            || async {
                c.agents_of(runner.as_str())
                    .await
                    .iter()
                    .any(|a| a.1 == turn.as_str() && a.3)
                    .then_some(())
            },
        )
        .await;

        let cut = Instant::now();
        c.disconnect(&name).await;
        // Poll the engine (not the runner): when does the stale attempt's container stop?
        let stopped = loop {
            let running = c
                .agents_of(runner.as_str())
                .await
                .iter()
                .any(|a| a.1 == turn.as_str() && a.2 == 1 && a.3);
            if !running {
                break cut.elapsed();
            }
            assert!(
                cut.elapsed() < lease * 3,
                "the cut-off runner never stopped its container"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            stopped < lease,
            "the container outlived the lease: stopped {stopped:?} after the cut, lease {lease:?}"
        );
        expects.push(Expect {
            turn: turn.clone(),
            state: TurnState::Done,
            attempts: Some(2),
            replies: 1,
        });
        let ended = wait_all_ended(&c.bus, std::slice::from_ref(&turn), long()).await;
        let before = ended[0].clone().expect("turn");
        assert_eq!(
            before.attempts[0].exit.as_ref().map(|x| x.class),
            Some(ExitClass::RunnerLost)
        );
        assert_ne!(before.attempts[1].runner.as_ref(), Some(&runner));

        // Back on the network, the runner flushes what it held for the stale attempt.
        c.connect(&name).await;
        eventually(Duration::from_secs(60), "the runner back", || async {
            let e = c.bus.runners.entry(runner.as_str()).await.ok()??;
            let p: turnpike_core::wire::RunnerPresence =
                turnpike_jetstream::decode_kv(&e.value).ok()?;
            (p.at.millis() > turnpike_jetstream::now().millis().saturating_sub(2000)).then_some(())
        })
        .await;
        tokio::time::sleep(lease).await;
        let after = record(&c, &turn).await;
        assert_eq!(after.state, before.state, "outcome changed after reconnect");
        assert_eq!(after.attempts.len(), before.attempts.len());
        assert_eq!(
            after.attempts[0].exit.as_ref().map(|x| x.class),
            Some(ExitClass::RunnerLost),
            "the stale exit report was applied"
        );
        victims.push(format!("{stopped:.1?}"));
    }
    let mut tally = judge(&c.bus, "2 runner cut off", &expects, long()).await;
    tally.note = format!(
        "stale container stopped {} after the cut (lease {lease:?})",
        victims.join(", ")
    );
    tally.report();
}

/// Turns with scripted deaths: `die-until:k`, k from 1 to 4, so with a budget of 3 some answer
/// at once, some on a retry, some give up.
async fn scripted_load(c: &Cluster, case: &str, n: usize) -> Vec<Expect> {
    let mut expects = Vec::new();
    for i in 0..n {
        let k = 1 + (i * 7 + 3) % 4;
        let text = format!("die-until:{k}");
        let t = send_acked(
            &c.bus,
            &format!("{case}-{i}"),
            &format!("{case}-m{i}"),
            &text,
            60,
        )
        .await;
        expects.push(expect_script(t, &text, c.opts.max_turn_retry));
    }
    expects
}

/// 3. Kill -9 and restart the coordinators one at a time, over and over, while turns die and are
/// retried: every turn ends exactly as the lifecycle table says.
#[tokio::test]
async fn f3_coordinators_restarted_one_by_one_under_load() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let load = {
        let c = &c;
        async move { scripted_load(c, "f3", 24 * soak()).await }
    };
    let restarts = async {
        let mut n = 0;
        for _round in 0..2 * soak() {
            for k in 1..=c.opts.coordinators {
                let name = format!("coordinator-{k}");
                c.kill(&name).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
                c.start_container(&name).await;
                tokio::time::sleep(Duration::from_secs(4)).await;
                n += 1;
            }
        }
        n
    };
    let (expects, restarted) = tokio::join!(load, restarts);
    let mut tally = judge(&c.bus, "3 coordinators rolling", &expects, long()).await;
    let gave_up = expects
        .iter()
        .filter(|e| e.state == TurnState::GaveUp)
        .count();
    tally.note = format!("{restarted} coordinator kills; {gave_up} turns meant to give up");
    tally.report();
}

/// 4. Stop one NATS node, then another after the first is back, under load: every inbound
/// message JetStream acknowledged becomes a turn that ends right; none is stuck.
#[tokio::test]
async fn f4_nats_nodes_stopped_one_after_another() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let n = 30 * soak();
    let load = async {
        let mut acked = Vec::new();
        let mut unacked = 0;
        for i in 0..n {
            let text = if i % 3 == 0 {
                "die-until:2"
            } else {
                "reply:ok"
            };
            match try_send(&c.bus, &format!("f4-{i}"), &format!("f4-m{i}"), text, 60).await {
                Some(t) => acked.push(expect_script(t, text, c.opts.max_turn_retry)),
                None => unacked += 1,
            }
            tokio::time::sleep(Duration::from_millis(700)).await;
        }
        (acked, unacked)
    };
    let outages = async {
        for node in ["nats-1", "nats-2"] {
            tokio::time::sleep(Duration::from_secs(3)).await;
            c.stop(node, Duration::from_secs(5)).await;
            tokio::time::sleep(Duration::from_secs(8)).await;
            c.start_container(node).await;
            // Let it rejoin and catch up before the next node goes.
            tokio::time::sleep(Duration::from_secs(8)).await;
        }
    };
    let ((expects, unacked), ()) = tokio::join!(load, outages);
    let mut tally = judge(&c.bus, "4 NATS nodes stopped", &expects, long()).await;
    tally.note = format!("{unacked} inbound not acknowledged within 60 s (not counted)");
    tally.report();
}

/// 5. Stop the whole cluster (every NATS node and every role) while retries are pending, then
/// start it again: each turn still gets its next attempt, once, with the right count, never
/// before it was due.
#[tokio::test]
async fn f5_whole_cluster_restarted_with_retries_pending() {
    init_logs();
    // The real default delay: retries come due while the cluster is down or re-forming.
    let opts = ClusterOpts {
        retry_delay: Duration::from_secs(10),
        ..ClusterOpts::default()
    };
    let c = Cluster::start(opts).await;
    let mut expects = Vec::new();
    for i in 0..6 * soak() {
        let t = send_acked(
            &c.bus,
            &format!("f5-{i}"),
            &format!("f5-m{i}"),
            "die-until:2",
            30,
        )
        .await;
        expects.push(expect_script(t, "die-until:2", 3));
    }
    let mut first_due = u64::MAX;
    for e in &expects {
        let r = wait_state(&c.bus, &e.turn, TurnState::PendingRetry).await;
        let due = r
            .next_attempt_due
            .expect("a pending retry has its due time");
        first_due = first_due.min(due.millis());
    }
    let down_at = turnpike_jetstream::now().millis();
    let roles: Vec<String> = (1..=c.opts.coordinators)
        .map(|k| format!("coordinator-{k}"))
        .chain(["dispatcher".to_owned()])
        .chain((1..=c.opts.runners).map(|k| format!("runner-{k}")))
        .collect();
    let nodes = ["nats-1", "nats-2", "nats-3"];
    futures::future::join_all(
        roles
            .iter()
            .map(|r| c.stop(r, Duration::from_secs(5)))
            .chain(nodes.iter().map(|n| c.stop(n, Duration::from_secs(5)))),
    )
    .await;
    // Down long enough that the retries come due while nothing runs.
    tokio::time::sleep(Duration::from_secs(8)).await;
    futures::future::join_all(nodes.iter().map(|n| c.start_container(n))).await;
    futures::future::join_all(roles.iter().map(|r| c.start_container(r))).await;
    let up_at = turnpike_jetstream::now().millis();

    let mut tally = judge(&c.bus, "5 whole cluster restarted", &expects, long()).await;
    for e in &expects {
        let r = record(&c, &e.turn).await;
        if let Some(a) = r.attempts.get(1) {
            let (due, published) = (a.due_at, a.published_at);
            if let (Some(due), Some(published)) = (due, published) {
                if published.millis() < due.millis() {
                    tally.wrong += 1;
                    tally.problems.push(format!(
                        "{}: attempt 2 published {} ms before it was due",
                        e.turn,
                        due.millis() - published.millis()
                    ));
                }
            }
        }
    }
    let secs = |a: u64, b: u64| (a as f64 - b as f64) / 1000.0;
    tally.note = format!(
        "retry delay 10 s; stopping began {:.1} s before the first retry was due; \
         restarted {:.1} s after it was due",
        secs(first_due, down_at),
        secs(up_at, first_due)
    );
    tally.report();
}

/// 6. Scale runners 1 → 3 under a steady load of `sleep:2` turns: every turn ends right; the
/// throughput of each phase is measured (BENCHMARKS.md), not asserted.
#[tokio::test]
async fn f6_runners_scaled_from_one_to_three_under_load() {
    init_logs();
    let c = Cluster::start(ClusterOpts {
        runners: 1,
        ..ClusterOpts::default()
    })
    .await;
    let phase = Duration::from_secs(20 * soak() as u64);
    let interval = Duration::from_millis(333);
    let t0 = turnpike_jetstream::now().millis();
    let load = async {
        let mut expects = Vec::new();
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < phase * 2 {
            let t = send_acked(
                &c.bus,
                &format!("f6-{i}"),
                &format!("f6-m{i}"),
                "sleep:2",
                30,
            )
            .await;
            expects.push(expect_script(t, "sleep:2", 3));
            i += 1;
            tokio::time::sleep(interval).await;
        }
        expects
    };
    let scale = async {
        tokio::time::sleep(phase).await;
        let at = turnpike_jetstream::now().millis();
        c.add_runner().await;
        c.add_runner().await;
        at
    };
    let (expects, scaled_at) = tokio::join!(load, scale);
    let load_end = turnpike_jetstream::now().millis();
    let mut tally = judge(&c.bus, "6 runners 1 -> 3", &expects, long()).await;
    // Turns ended per second within each phase (past a short settling time after each start).
    let mut ends = Vec::new();
    for e in &expects {
        let r = record(&c, &e.turn).await;
        ends.push(r.updated_at.millis());
    }
    let rate = |from: u64, to: u64| {
        let n = ends.iter().filter(|&&t| t >= from && t < to).count();
        n as f64 / ((to - from) as f64 / 1000.0)
    };
    let one = rate(t0 + 5_000, scaled_at);
    let three = rate(scaled_at + 8_000, load_end);
    let line = format!(
        "runners 1 -> 3 (2 slots each, sleep:2 turns in containers, offered 3/s): \
         {one:.2} turns/s with 1 runner, {three:.2} turns/s with 3 ({:.2}x)",
        three / one.max(f64::EPSILON)
    );
    eprintln!("{line}");
    tally.note = line;
    tally.report();
}

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
    let runner = connect_as("runner", urls).await;
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
            runner: RunnerId::sanitized("forger"),
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
                .publish(subjects::events(&ghost), payload.into())
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
        "turnpike.events.t-000000000000000000000000",
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
            let mut claims = c
                .bus
                .claims
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
        let r = record(&c, &turn).await;
        let runner = r.attempts[0].runner.clone().expect("a runner holds it");
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

/// 10. A heavy chat: one chat whose turns each reply 60 KiB. Its history is bounded in bytes, so
/// the chat record and every work item stay inside NATS's 1 MiB payload: every turn is answered,
/// in order, none wedges.
#[tokio::test]
async fn f10_heavy_chat() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let n = 24 * soak();
    let mut expects = Vec::new();
    for i in 0..n {
        let text = "big-reply:61440";
        let t = send_acked(&c.bus, "f10", &format!("f10-m{i}"), text, 30).await;
        expects.push(expect_script(t, text, 3));
    }
    let mut tally = judge(&c.bus, "10 heavy chat", &expects, long()).await;
    let last = record(&c, &expects[n - 1].turn).await;
    let bytes: usize = last.history.iter().map(|h| h.text.len()).sum();
    let budget = 256 * 1024;
    if bytes > budget {
        tally.wrong += 1;
        tally
            .problems
            .push(format!("history of {bytes} B over {budget} B"));
    }
    tally.note = format!(
        "{n} turns of 60 KiB replies in one chat ({} KiB in all); the last turn's history: {} entries, {} KiB",
        n * 60,
        last.history.len(),
        bytes / 1024
    );
    tally.report();
}

/// 11. An attachment bomb: one object listed many times, objects past the byte limits, another
/// chat's object, while ordinary turns run. What fits the limits (16 × 4 MiB = 64 MiB) is
/// streamed through a runner to its container; the rest is refused with a notice; no node
/// restarts, and the ordinary turns end as the table says.
#[tokio::test]
async fn f11_attachment_bomb() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let put = |object: &'static str, len: usize| {
        let bus = &c.bus;
        async move {
            let mut reader: &[u8] = &vec![0x5a; len];
            bus.attachments
                .put(object, &mut reader)
                .await
                .expect("upload");
        }
    };
    put("f11/m/blob.bin", 4 << 20).await;
    put("f11/m/big.bin", 10 << 20).await;
    let listed = |object: &str, n: usize| {
        (0..n)
            .map(|i| Attachment {
                name: format!("copy{i}.bin"),
                object: object.to_owned(),
            })
            .collect::<Vec<_>>()
    };
    let fits = send_message(
        &c.bus,
        "f11",
        "f11-fits",
        "attachments",
        listed("f11/m/blob.bin", 16),
    )
    .await;
    let refused = [
        (
            send_message(
                &c.bus,
                "f11",
                "f11-count",
                "attachments",
                listed("f11/m/blob.bin", 17),
            )
            .await,
            "f11",
            "lists 17 attachments",
        ),
        (
            send_message(
                &c.bus,
                "f11",
                "f11-bytes",
                "attachments",
                listed("f11/m/big.bin", 7),
            )
            .await,
            "f11",
            "add up to",
        ),
        (
            send_message(
                &c.bus,
                "f11x",
                "f11-foreign",
                "attachments",
                listed("f11/m/blob.bin", 1),
            )
            .await,
            "f11x",
            "is not under this chat's name",
        ),
    ];
    let mut expects = vec![expect_script(fits.clone(), "attachments", 3)];
    for i in 0..6 * soak() {
        let t = send_acked(
            &c.bus,
            &format!("f11-ok-{i}"),
            &format!("f11-ok-m{i}"),
            "reply:ok",
            30,
        )
        .await;
        expects.push(expect_script(t, "reply:ok", 3));
    }
    let mut tally = judge(&c.bus, "11 attachment bomb", &expects, long()).await;
    // The 64 MiB reached the agent whole: 16 files of 4 MiB.
    let outbound = outbound_by_turn(&c.bus).await;
    let summary = outbound
        .get(fits.as_str())
        .and_then(|items| items.iter().find(|i| i.kind == OutboundKind::Message))
        .map(|m| m.text.clone())
        .unwrap_or_default();
    let whole = summary.matches(&format!(" {} ", 4 << 20)).count();
    if whole != 16 {
        tally.wrong += 1;
        tally.problems.push(format!(
            "the agent saw {whole} whole attachments: {summary:.300}"
        ));
    }
    for (turn, chat, says) in &refused {
        let notice = eventually(Duration::from_secs(60), "a refusal notice", || async {
            visible_items(&c.bus, chat)
                .await
                .into_iter()
                .find(|i| &i.turn == turn && i.kind == OutboundKind::Notice)
        })
        .await;
        let made = turns::load(&c.bus, turn).await.expect("read turn");
        if !notice.text.contains(says) || made.is_some() {
            tally.wrong += 1;
            tally.problems.push(format!(
                "{turn}: notice {:?}, turn made: {}",
                notice.text,
                made.is_some()
            ));
        }
    }
    no_restarts(&c, &mut tally).await;
    tally.note = format!(
        "64 MiB (one 4 MiB object listed 16 times) reached the agent whole; {} bombs refused with a notice; no restarts",
        refused.len()
    );
    tally.report();
}
