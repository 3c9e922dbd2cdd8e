//! The runner with the process backend: truthful classification without a cgroup, and draining
//! on shutdown.

use std::time::Duration;
use turnpike_config::ByteSize;
use turnpike_core::lifecycle::TurnState;
use turnpike_core::wire::ExitClass;
use turnpike_jetstream::Bus;
use turnpike_testkit::NatsServer;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const T: Duration = Duration::from_secs(30);

#[tokio::test]
async fn an_allocation_failure_under_rlimit_is_named_out_of_memory() {
    let p = Pipeline::start(AGENT, |c| {
        c.memory_limit = ByteSize(64 << 20);
        c.max_turn_retry = 1;
    })
    .await;
    let turn = send(&p.bus, "chat-p", "m-1", "oom").await;
    let record = wait_ended(&p.bus, &turn, T).await;
    let exit = record.attempts[0].exit.clone().expect("exit report");
    // Rust aborts on a failed allocation (SIGABRT) after saying why on stderr: out of memory.
    assert_eq!(exit.class, ExitClass::OomKilled, "{exit:?}");
    assert_eq!(exit.signal, Some(6), "{exit:?}");
    assert_eq!(record.state, TurnState::GaveUp);
    p.stop().await;
}

#[tokio::test]
async fn a_draining_runner_lets_running_attempts_finish() {
    let server = NatsServer::start();
    let config = turnpike_config::Config {
        stop_grace: Duration::from_secs(10),
        ..test_config(&server, AGENT)
    };
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
    ];
    let runner = start_runner(&config).await;
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = send(&bus, "chat-q", "m-1", "sleep:1").await;
    wait_state(&bus, &turn, TurnState::Running).await;
    runner.stop().await; // SIGTERM-equivalent: returns once the attempt reported
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(record.attempts.len(), 1);
    for r in roles {
        r.stop().await;
    }
}

#[tokio::test]
async fn past_the_drain_grace_attempts_are_killed_reported_and_retried_elsewhere() {
    let server = NatsServer::start();
    let config = turnpike_config::Config {
        stop_grace: Duration::from_secs(1),
        ..test_config(&server, AGENT)
    };
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
    ];
    let first = start_runner(&config).await;
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = send(&bus, "chat-r", "m-1", "hang-until:2").await;
    wait_state(&bus, &turn, TurnState::Running).await;
    first.stop().await;
    let second = start_runner(&config).await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(record.attempts.len(), 2);
    let exit = record.attempts[0].exit.clone().expect("exit report");
    assert_eq!(exit.class, ExitClass::RunnerLost, "{exit:?}");
    assert!(exit.error.unwrap_or_default().contains("Drain"));
    second.stop().await;
    for r in roles {
        r.stop().await;
    }
}

/// Presence counts running attempts, not the permit the pull loop holds while it waits.
#[tokio::test]
async fn presence_reports_slots_in_use_as_running_attempts() {
    let p = Pipeline::start(AGENT, |c| c.runner_id = Some("slots-r".into())).await;
    let in_use = |want: u32| {
        let bus = p.bus.clone();
        async move {
            turnpike_testkit::eventually(T, &format!("{want} slot(s) in use"), || async {
                let entry = bus.runners.entry("slots-r").await.ok()??;
                let presence: turnpike_core::wire::RunnerPresence =
                    turnpike_jetstream::decode_kv(&entry.value).ok()?;
                (presence.slots_in_use == want).then_some(())
            })
            .await
        }
    };
    in_use(0).await;
    let turn = send(&p.bus, "slots", "m-1", "hang").await;
    wait_state(&p.bus, &turn, TurnState::Running).await;
    in_use(1).await;
    let answer = ops(
        &p.bus,
        turnpike_core::subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("t", turn.clone()),
    )
    .await;
    assert!(answer.ok, "{}", answer.message);
    wait_ended(&p.bus, &turn, T).await;
    in_use(0).await;
    p.stop().await;
}

#[tokio::test]
async fn each_attempt_works_in_a_fresh_directory_under_scratch_dir_removed_after() {
    let scratch = tempfile::tempdir().expect("scratch dir");
    let p = Pipeline::start(AGENT, |c| {
        c.scratch_dir = Some(scratch.path().to_path_buf())
    })
    .await;
    let turn = send(&p.bus, "chat-s", "m-1", "sleep:1").await;
    // The directory is made just before the agent starts, which can be after Running is recorded.
    let entries = turnpike_testkit::eventually(T, "the attempt's directory", || async {
        let entries: Vec<String> = std::fs::read_dir(scratch.path())
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        (!entries.is_empty()).then_some(entries)
    })
    .await;
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert!(
        entries[0].starts_with(&format!("turnpike-{turn}-1-")),
        "{entries:?}"
    );
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    let left = std::fs::read_dir(scratch.path())
        .expect("read scratch")
        .count();
    assert_eq!(left, 0, "the attempt's directory outlived it");
    p.stop().await;
}

/// Issue 16, item 3: an agent-reported failure whose error line is over 1 MiB used to be skipped,
/// and the turn ended as a silent success. Its head is salvaged: the turn fails, with the error cut.
#[tokio::test]
async fn an_agent_failure_with_a_huge_error_line_still_fails_the_turn() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "huge-error", "m-1", "fail-huge").await;
    let r = wait_ended(&p.bus, &turn, Duration::from_secs(60)).await;
    assert_eq!(r.state, TurnState::Failed, "{r:#?}");
    let exit = r.attempts[0].exit.as_ref().expect("exit");
    assert_eq!(exit.class, ExitClass::AgentFailed);
    let error = exit.error.as_deref().expect("the agent's error");
    assert!(
        error.starts_with("eeee") && error.len() <= 4096,
        "{}",
        error.len()
    );
    p.stop().await;
}
