//! Machines lost and restarted: a runner killed or cut off, coordinators and NATS nodes
//! restarted one by one, the whole cluster stopped with retries pending.

use super::*;

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
    // Killed once a record says it runs an attempt (its Started applied), not when its container
    // is seen running: a runner killed in between leaves a lost attempt no record ties to it (the
    // turn is still retried; only this test's count of moved turns could not see it).
    eventually(
        Duration::from_secs(90),
        "runner-1 running attempts",
        || async {
            for e in &expects {
                // Not created yet is not running yet.
                let Ok(Some(v)) = turns::load(&c.bus, &e.turn).await else {
                    continue;
                };
                let r = v.record;
                let runner = r.attempts.last().and_then(|a| a.runner.as_ref());
                if r.state == TurnState::Running && runner.map(|x| x.as_str()) == Some(&victim) {
                    return Some(());
                }
            }
            None
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
            let e = turnpike_tests::bucket(&c.bus, turnpike_core::subjects::BUCKET_RUNNERS)
                .await
                .entry(runner.as_str())
                .await
                .ok()??;
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
