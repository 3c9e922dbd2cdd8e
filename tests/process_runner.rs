//! The runner with the process backend: truthful classification without a cgroup, and draining
//! on shutdown.

use std::time::Duration;
use turnpike_config::ByteSize;
use turnpike_core::record::TurnState;
use turnpike_core::wire::ExitClass;
use turnpike_store::Bus;
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
                let entry = turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_RUNNERS)
                    .await
                    .entry("slots-r")
                    .await
                    .ok()??;
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

/// A shell-script agent in a fresh directory: `body` runs after the input is read; `$PIDS` is a
/// file it may write process ids to.
fn script_agent(body: &str) -> (tempfile::TempDir, String, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("temp dir");
    let pids = dir.path().join("pids");
    let script = dir.path().join("agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nexport PIDS={}\ncat > /dev/null\n{body}\n",
            pids.display()
        ),
    )
    .expect("write agent");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let command = script.display().to_string();
    (dir, command, pids)
}

/// The process ids the agent wrote, once it has.
async fn pids_written(file: &std::path::Path) -> Vec<u32> {
    turnpike_testkit::eventually(T, "the agent's process ids", || async {
        let text = std::fs::read_to_string(file).ok()?;
        let pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        (!pids.is_empty()).then_some(pids)
    })
    .await
}

fn alive(pid: u32) -> bool {
    // A zombie (its parent has not reaped it yet) is dead too.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let state = s.get(s.rfind(')')? + 2..)?.chars().next()?;
            Some(state != 'Z')
        })
        .unwrap_or(false)
}

/// Issue 32: a grandchild of the agent that leaves its process group (`setsid`) escaped the
/// group kill and kept the agent's stdout open: the run never ended (and a kill or the time
/// limit did nothing). The run's processes carry a tag, every one is killed once the agent has
/// exited, and the run never waits on its output after that.
#[tokio::test]
async fn a_grandchild_that_leaves_the_process_group_dies_with_its_run() {
    init_logs();
    let (_dir, agent, pids) = script_agent(
        // The agent exits only once its grandchild has left the group (it writes its pid after
        // `setsid`): a group kill before that would take it, and prove nothing.
        "setsid -f sh -c 'echo $$ >> \"$PIDS\"; exec sleep 1000'\nwhile [ ! -s \"$PIDS\" ]; do sleep 0.01; done\necho '{\"type\":\"message\",\"text\":\"answer\"}'\nexit 0",
    );
    let p = Pipeline::start(&agent, |_| {}).await;
    let turn = send(&p.bus, "chat-s", "m-1", "anything").await;
    let escaped = pids_written(&pids).await;
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:#?}");
    assert_eq!(record.attempts[0].messages_landed, 1);
    turnpike_testkit::eventually(T, "the escaped grandchild dead", || async {
        escaped.iter().all(|pid| !alive(*pid)).then_some(())
    })
    .await;
    p.stop().await;
}

/// Issue 32: an agent must not outlive its runner. A runner killed -9 left its agents running
/// (a hanging one for ever); any runner on the host now finds them by their tag, sees the runner
/// that started them is gone, and kills them.
#[tokio::test]
async fn the_agents_of_a_crashed_runner_are_killed_by_another_runner_on_the_host() {
    init_logs();
    let (_dir, agent, pids) = script_agent("echo $$ >> \"$PIDS\"\nexec sleep 1000");
    let server = NatsServer::start();
    let config = test_config(&server, &agent);
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let mut doomed = RoleProcess::start(
        env!("CARGO_BIN_EXE_test-role"),
        "runner",
        &turnpike_config::Config {
            runner_id: Some("doomed".into()),
            ..config.clone()
        },
    );
    let turn = send(&bus, "chat-o", "m-1", "anything").await;
    let agents = pids_written(&pids).await;
    // Orphaned now (nothing else would end it: it sleeps, and writes nothing).
    doomed.kill9();
    let survivor = start_runner(&turnpike_config::Config {
        runner_id: Some("survivor".into()),
        ..config.clone()
    })
    .await;
    turnpike_testkit::eventually(T, "the orphaned agent killed", || async {
        agents.iter().all(|pid| !alive(*pid)).then_some(())
    })
    .await;
    let _ = turn;
    survivor.stop().await;
    for r in roles {
        r.stop().await;
    }
}

/// Issue 37: the agent is told when its run will be stopped (`deadline` in its input and
/// `TURNPIKE_DEADLINE`), no later than the time limit stops it; one that posts a summary just
/// before then and ends has replied: done on its first attempt.
#[tokio::test]
async fn an_agent_that_answers_before_its_deadline_has_replied() {
    let limit = Duration::from_secs(3);
    let p = Pipeline::start(AGENT, |c| c.run_timeout = limit).await;
    let sent = turnpike_jetstream::now();
    let turn = send(&p.bus, "chat-d", "m-1", "summary-before-deadline:1").await;
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    assert_eq!(record.attempts.len(), 1, "{record:?}");
    let exit = record.attempts[0].exit.clone().expect("exit report");
    assert_eq!(exit.class, ExitClass::Clean, "{exit:?}");
    let started = exit
        .started
        .as_ref()
        .and_then(|s| s.started_at)
        .expect("started");
    let replies = visible_items(&p.bus, "chat-d").await;
    let summary = &replies.first().expect("the summary").text;
    let deadline = summary
        .strip_prefix("summary before the deadline ")
        .and_then(|rest| rest.split_once(' '))
        .map(|(at, _)| turnpike_core::Timestamp::parse_rfc3339(at).expect("RFC 3339"))
        .unwrap_or_else(|| panic!("{summary}"));
    assert!(summary.ends_with("(TURNPIKE_DEADLINE agrees)"), "{summary}");
    // Set as the run's time limit started: after the message was sent, before the agent started.
    assert!(
        deadline >= sent.saturating_add(limit),
        "{deadline} vs sent {sent}"
    );
    assert!(
        deadline <= started.saturating_add(limit),
        "{deadline} vs started {started}"
    );
    // The agent answered no earlier than a second before it (its own sleep).
    assert!(
        exit.ended_at.saturating_add(Duration::from_secs(1)) >= deadline,
        "{deadline} vs ended {}",
        exit.ended_at
    );
    p.stop().await;
}

/// The profile named `name` on the config: a run time limit of `secs`.
fn with_profile(c: &mut turnpike_config::Config, name: &str, secs: u64) {
    c.profiles.insert(
        name.into(),
        turnpike_config::ProfileSettings {
            run_timeout: Some(Duration::from_secs(secs)),
            memory_limit: Some(ByteSize(256 << 20)),
            ..Default::default()
        },
    );
}

/// What `run-info` replied: the profile the agent was given, and its deadline.
fn run_info(text: &str) -> (String, turnpike_core::Timestamp) {
    let rest = text
        .strip_prefix("profile ")
        .unwrap_or_else(|| panic!("{text}"));
    let (profile, deadline) = rest
        .split_once(" deadline ")
        .unwrap_or_else(|| panic!("{text}"));
    let deadline = turnpike_core::Timestamp::parse_rfc3339(deadline).expect("RFC 3339");
    (profile.to_owned(), deadline)
}

/// Issue 37: an operator moves a chat to another profile at run time. Its next attempt runs
/// with it (its deadline is the profile's time limit away); a retry runs with the chat's
/// profile at its own dispatch, though its first attempt ran with the old one; the exit report
/// says which profile and memory each attempt had. An unknown profile is refused.
#[tokio::test]
async fn a_chat_moved_to_a_profile_runs_its_next_attempts_with_it() {
    use turnpike_core::subjects::OPS_PROFILE;
    use turnpike_core::wire::OpsRequest;
    let p = Pipeline::start(AGENT, |c| {
        c.run_timeout = Duration::from_secs(30);
        c.max_turn_retry = 2;
        with_profile(c, "short", 3);
    })
    .await;
    let chat = turnpike_core::ChatId::new("pf-1").expect("chat");
    let t1 = send(&p.bus, "pf-1", "pf-m1", "run-info").await;
    let r1 = wait_ended(&p.bus, &t1, T).await;
    let (name, _) = run_info(&visible_items(&p.bus, "pf-1").await[0].text);
    assert_eq!(name, "-", "not moved: the default, named by no one");
    assert_eq!(
        profile_used(&r1, 0),
        Some(("default".into(), p.config.memory_limit.0))
    );

    let refused = ops(
        &p.bus,
        OPS_PROFILE,
        OpsRequest::profile("tester", chat.clone(), Some("huge".into())),
    )
    .await;
    assert!(
        !refused.ok && refused.message.contains("no profile \"huge\""),
        "{refused:?}"
    );
    let moved = ops(
        &p.bus,
        OPS_PROFILE,
        OpsRequest::profile("tester", chat.clone(), Some("short".into())),
    )
    .await;
    assert!(moved.ok, "{moved:?}");
    let sent = turnpike_jetstream::now();
    let t2 = send(&p.bus, "pf-1", "pf-m2", "run-info").await;
    let r2 = wait_ended(&p.bus, &t2, T).await;
    let (name, deadline) = run_info(&visible_items(&p.bus, "pf-1").await[1].text);
    assert_eq!(name, "short");
    let started = r2.attempts[0]
        .exit
        .as_ref()
        .and_then(|e| e.started.as_ref())
        .and_then(|s| s.started_at)
        .expect("started");
    assert!(deadline >= sent.saturating_add(Duration::from_secs(3)));
    assert!(deadline <= started.saturating_add(Duration::from_secs(3)));
    assert_eq!(profile_used(&r2, 0), Some(("short".into(), 256 << 20)));

    // Back to the default while a turn's first attempt runs: its retry runs with the default.
    let go = std::env::temp_dir().join(format!("turnpike-pf-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let t3 = send(
        &p.bus,
        "pf-1",
        "pf-m3",
        &format!("die-once-when-file:{}", go.display()),
    )
    .await;
    wait_state(&p.bus, &t3, TurnState::Running).await;
    let back = ops(
        &p.bus,
        OPS_PROFILE,
        OpsRequest::profile("tester", chat, None),
    )
    .await;
    assert!(back.ok, "{back:?}");
    std::fs::write(&go, b"").expect("let attempt 1 die");
    let r3 = wait_ended(&p.bus, &t3, T).await;
    let _ = std::fs::remove_file(&go);
    assert_eq!(r3.state, TurnState::Done, "{r3:?}");
    assert_eq!(profile_used(&r3, 0).map(|p| p.0), Some("short".into()));
    assert_eq!(profile_used(&r3, 1).map(|p| p.0), Some("default".into()));
    let (name, _) = run_info(
        &visible_items(&p.bus, "pf-1")
            .await
            .last()
            .expect("a reply")
            .text,
    );
    assert_eq!(name, "-");
    p.stop().await;
}

/// A chat moved to a profile this runner does not define (its configuration is behind the
/// coordinators'): the agent could not start, and the error says why and what is defined.
#[tokio::test]
async fn a_profile_the_runner_does_not_define_could_not_start() {
    use turnpike_core::wire::OpsRequest;
    let server = NatsServer::start();
    let mut config = test_config(&server, AGENT);
    config.max_turn_retry = 2;
    let runner_config = config.clone();
    with_profile(&mut config, "new", 5);
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
        start_runner(&runner_config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let chat = turnpike_core::ChatId::new("pf-2").expect("chat");
    let moved = ops(
        &bus,
        turnpike_core::subjects::OPS_PROFILE,
        OpsRequest::profile("tester", chat, Some("new".into())),
    )
    .await;
    assert!(moved.ok, "{moved:?}");
    let turn = send(&bus, "pf-2", "pf-m1", "reply:hi").await;
    let record = wait_ended(&bus, &turn, T).await;
    for r in roles {
        r.stop().await;
    }
    assert_eq!(record.attempts.len(), 1, "never retried: {record:?}");
    let exit = record.attempts[0].exit.clone().expect("exit");
    assert_eq!(exit.class, ExitClass::CouldNotStart, "{exit:?}");
    let error = exit.error.unwrap_or_default();
    assert!(
        error.contains("profile new is not defined on runner") && error.contains("default"),
        "{error}"
    );
}

/// Issue 37, the egress list with the process backend: the agent gets a proxy on loopback that
/// opens what the list names and refuses the rest (enforcement against direct connections is
/// Docker's: tests/egress.rs).
#[tokio::test]
async fn the_process_backend_proxies_an_egress_list() {
    let listed = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listed.local_addr().expect("addr").port();
    let other = turnpike_testkit::free_port();
    let _serve = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = listed.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nConnection: close\r\n\r\nhello\n",
                )
                .await;
        }
    }));
    let p = Pipeline::start(AGENT, |c| {
        c.egress_allow = format!("127.0.0.1:{port}");
    })
    .await;
    let turn = send(
        &p.bus,
        "chat-egress",
        "m-1",
        &format!("fetch:http://127.0.0.1:{port}/,http://127.0.0.1:{other}/,plain=http://localhost:{port}/"),
    )
    .await;
    let record = wait_ended(&p.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    let replies = visible_items(&p.bus, "chat-egress").await;
    let refused =
        |d: &str| format!("turnpike egress proxy: {d} is not on this agent's egress allowlist");
    assert_eq!(
        replies[0].text,
        format!(
            "http://127.0.0.1:{port}/ -> 200 hello\nhttp://127.0.0.1:{other}/ -> proxy 403 {}\nplain=http://localhost:{port}/ -> 403 {}",
            refused(&format!("127.0.0.1:{other}")),
            refused(&format!("localhost:{port}")),
        )
    );
    p.stop().await;
}
