//! The runner's Docker backend against the real Docker Engine and a real nats-server 2.15.1: each
//! test runs one turn through the whole pipeline and asserts the exit report and what landed.
//! Needs the test agent image: `bash deploy/build-images.sh` (tests/run.sh does it).
//! Every container is labelled with the test's own runner id; each test checks none is left.

use bollard::Docker;
use std::time::{Duration, Instant};
use turnpike_config::{ByteSize, Config};
use turnpike_core::record::TurnState;
use turnpike_core::texts;
use turnpike_core::wire::{ExitClass, OutboundKind};
use turnpike_store::Bus;
use turnpike_testkit::{eventually, NatsServer};
use turnpike_tests::*;

const T: Duration = Duration::from_secs(60);

/// Dispatcher, coordinator and (with `runner`) an in-process Docker runner on a fresh server.
async fn docker_stack(runner_id: &str, runner: bool) -> (NatsServer, Config, Vec<Role>, Bus) {
    let server = NatsServer::start();
    let config = docker_config(&server, runner_id);
    let mut roles = vec![
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
    ];
    if runner {
        roles.push(start_runner(&config).await);
    }
    let bus = Bus::connect(&config, "test").await.expect("bus");
    (server, config, roles, bus)
}

async fn docker() -> Docker {
    Docker::connect_with_local_defaults()
        .expect("docker client")
        .negotiate_version()
        .await
        .expect("the Docker Engine answers (these tests need it)")
}

/// Containers carrying this runner's label (all states).
async fn containers_of(runner_id: &str) -> Vec<String> {
    runner_containers(&docker().await, runner_id)
        .await
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

/// Run one message through dispatcher, coordinator and a Docker runner; return the ended record,
/// the chat's outbound items, and check that no container is left behind.
async fn run_one(
    runner_id: &str,
    text: &str,
    tweak: impl FnOnce(&mut Config),
) -> (
    turnpike_core::TurnRecord,
    Vec<turnpike_core::wire::OutboundItem>,
) {
    let server = NatsServer::start();
    let mut config = docker_config(&server, runner_id);
    tweak(&mut config);
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
        start_runner(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = send(&bus, runner_id, "m-1", text).await;
    let record = wait_ended(&bus, &turn, T).await;
    let items = visible_items(&bus, runner_id).await;
    for r in roles {
        r.stop().await;
    }
    assert_eq!(
        containers_of(runner_id).await,
        Vec::<String>::new(),
        "containers left behind"
    );
    (record, items)
}

fn class(record: &turnpike_core::TurnRecord, attempt: usize) -> ExitClass {
    record.attempts[attempt]
        .exit
        .as_ref()
        .map(|e| e.class)
        .expect("attempt has an exit report")
}

#[tokio::test]
async fn a_reply_lands_from_a_fresh_container() {
    let (record, items) = run_one("dt-reply", "reply:from a container", |_| {}).await;
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(class(&record, 0), ExitClass::Clean);
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].text, "from a container");
}

#[tokio::test]
async fn a_real_oom_kill_under_64mib_is_classified_oom() {
    let enforced = docker()
        .await
        .info()
        .await
        .expect("docker info")
        .memory_limit
        .unwrap_or(false);
    assert!(
        enforced,
        "this Docker Engine does not enforce memory limits (docker info: MemoryLimit=false); \
         the OOM test cannot run here"
    );
    let (record, items) = run_one("dt-oom", "oom", |c| c.memory_limit = ByteSize(64 << 20)).await;
    assert_eq!(class(&record, 0), ExitClass::OomKilled);
    assert_eq!(record.state, TurnState::GaveUp);
    assert_eq!(items.len(), 1, "{items:?}");
    assert_eq!(items[0].kind, OutboundKind::Notice);
    assert_eq!(items[0].text, texts::give_up_notice(1));
}

#[tokio::test]
async fn the_run_time_limit_stops_a_hanging_agent() {
    let (record, _) = run_one("dt-timeout", "hang", |c| {
        c.run_timeout = Duration::from_secs(2);
        c.stop_grace = Duration::from_secs(1);
    })
    .await;
    assert_eq!(class(&record, 0), ExitClass::TimedOut);
    assert_eq!(record.state, TurnState::GaveUp);
}

#[tokio::test]
async fn a_partial_reply_then_crash_lands_and_is_not_retried() {
    let (record, items) =
        run_one("dt-partial", "crash-after-reply", |c| c.max_turn_retry = 3).await;
    assert_eq!(class(&record, 0), ExitClass::Crashed);
    assert_eq!(record.attempts.len(), 1, "never retried after a reply");
    assert_eq!(record.attempts[0].messages_landed, 1);
    assert_eq!(record.state, TurnState::Failed);
    let kinds: Vec<_> = items.iter().map(|i| i.kind).collect();
    assert_eq!(kinds, vec![OutboundKind::Message, OutboundKind::Notice]);
    assert_eq!(items[1].text, texts::PLAIN_FAILURE_NOTICE);
}

#[tokio::test]
async fn a_clean_agent_failure_is_failed_and_not_retried() {
    let (record, items) = run_one("dt-fail", "fail", |c| c.max_turn_retry = 3).await;
    assert_eq!(class(&record, 0), ExitClass::AgentFailed);
    assert_eq!(record.attempts.len(), 1);
    assert_eq!(record.state, TurnState::Failed);
    assert_eq!(
        items.last().map(|i| i.text.as_str()),
        Some(texts::PLAIN_FAILURE_NOTICE)
    );
}

#[tokio::test]
async fn a_silent_clean_run_gets_the_silent_notice() {
    let (record, items) = run_one("dt-silent", "silent", |c| c.max_turn_retry = 3).await;
    assert_eq!(class(&record, 0), ExitClass::Clean);
    assert_eq!(record.attempts.len(), 1);
    assert_eq!(record.state, TurnState::Done);
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].text, texts::SILENT_TURN_NOTICE);
}

#[tokio::test]
async fn a_missing_image_could_not_start_and_flags_the_chat() {
    let (record, items) = run_one("dt-noimage", "reply:never", |c| {
        c.agent_image = "turnpike-no-such-image:absent".into();
        c.max_turn_retry = 3;
    })
    .await;
    assert_eq!(class(&record, 0), ExitClass::CouldNotStart);
    let error = record.attempts[0]
        .exit
        .as_ref()
        .and_then(|e| e.error.clone())
        .unwrap_or_default();
    assert!(error.contains("turnpike-no-such-image"), "{error}");
    assert_eq!(
        record.attempts.len(),
        1,
        "a retry cannot fix a missing image"
    );
    assert_eq!(record.state, TurnState::Failed);
    assert!(record.chat_flagged);
    assert_eq!(items.len(), 1);
}

#[tokio::test]
async fn garbage_output_is_survived() {
    let (record, items) = run_one("dt-garbage", "garbage", |_| {}).await;
    assert_eq!(class(&record, 0), ExitClass::Clean);
    assert_eq!(record.state, TurnState::Done);
    // The 2 MiB message lands cut (its head salvaged); the broken and unknown lines do not.
    assert_eq!(items.len(), 2, "{items:?}");
    assert!(
        items[0].text.starts_with("xxxx"),
        "{}",
        &items[0].text[..40]
    );
    assert!(
        items[0]
            .text
            .ends_with(&format!("[cut: the line was {} bytes]", (2 << 20) + 28)),
        "{}",
        &items[0].text[items[0].text.len() - 60..]
    );
    assert!(items[0].text.len() <= 64 * 1024);
    assert_eq!(items[1].text, "survived the garbage");
}

#[tokio::test]
async fn an_operator_kill_stops_the_container_and_is_recorded_killed() {
    let runner_id = "dt-kill";
    let (_server, _config, roles, bus) = docker_stack(runner_id, true).await;
    let turn = send(&bus, runner_id, "m-1", "hang").await;
    wait_state(&bus, &turn, TurnState::Running).await;
    // What the coordinator's ForwardKill effect sends.
    let kill = turnpike_core::wire::KillRequest {
        v: turnpike_core::FORMAT_VERSION,
        turn: turn.clone(),
        attempt: 1,
        by: "tester".into(),
    };
    bus.client
        .publish(
            turnpike_core::subjects::kill(&turn),
            bytes::Bytes::from(kill.to_json()),
        )
        .await
        .expect("kill sent");
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(class(&record, 0), ExitClass::OperatorKilled);
    assert_eq!(record.state, TurnState::Killed);
    assert!(record.notice.is_none());
    assert!(
        visible_items(&bus, runner_id).await.is_empty(),
        "no notice for a kill"
    );
    for r in roles {
        r.stop().await;
    }
    assert!(containers_of(runner_id).await.is_empty());
}

#[tokio::test]
async fn a_killed_runner_is_declared_lost_in_bounded_time_and_its_restart_reaps_the_orphan() {
    let runner_id = "dt-lost";
    let (_server, config, roles, bus) = docker_stack(runner_id, false).await;
    let mut runner = RoleProcess::start(env!("CARGO_BIN_EXE_test-role"), "runner", &config);
    let turn = send(&bus, runner_id, "m-1", "hang").await;
    wait_state(&bus, &turn, TurnState::Running).await;
    eventually(T, "its container", || async {
        (!containers_of(runner_id).await.is_empty()).then_some(())
    })
    .await;
    runner.kill9();
    let killed_at = Instant::now();
    let record = wait_ended(&bus, &turn, T).await;
    let took = killed_at.elapsed();
    assert_eq!(class(&record, 0), ExitClass::RunnerLost);
    assert_eq!(record.state, TurnState::GaveUp, "N=1: no retry");
    // The bound: lease (4 s here) + one sweep interval (1 s), with room for a busy machine.
    assert!(
        took < Duration::from_secs(30),
        "declared lost after {took:?}"
    );
    // The dead runner's container is still there (nobody removed it) …
    assert!(
        !containers_of(runner_id).await.is_empty(),
        "orphan expected"
    );
    // … until the runner starts again under the same id.
    let mut restarted = RoleProcess::start(env!("CARGO_BIN_EXE_test-role"), "runner", &config);
    eventually(T, "the orphan reaped", || async {
        containers_of(runner_id).await.is_empty().then_some(())
    })
    .await;
    // Its report of the orphan changes nothing: the turn had already ended.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = wait_ended(&bus, &turn, T).await;
    assert_eq!(again.state, TurnState::GaveUp);
    assert_eq!(again.attempts.len(), 1);
    restarted.kill9();
    for r in roles {
        r.stop().await;
    }
}

#[tokio::test]
async fn a_docker_kill_by_someone_else_is_a_signal_death_not_ours() {
    let runner_id = "dt-sigkill";
    let (_server, _config, roles, bus) = docker_stack(runner_id, true).await;
    let turn = send(&bus, runner_id, "m-1", "hang").await;
    let id = eventually(T, "its container", || async {
        containers_of(runner_id).await.into_iter().next()
    })
    .await;
    wait_state(&bus, &turn, TurnState::Running).await;
    // Someone else's `docker kill` (SIGKILL, exit 137): nobody in Turnpike asked for it.
    docker()
        .await
        .kill_container(&id, None::<bollard::query_parameters::KillContainerOptions>)
        .await
        .expect("docker kill");
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(class(&record, 0), ExitClass::Signaled);
    assert_eq!(
        record.attempts[0].exit.as_ref().and_then(|e| e.exit_code),
        Some(137)
    );
    assert_eq!(record.state, TurnState::GaveUp, "a death; N=1 so no retry");
    for r in roles {
        r.stop().await;
    }
    assert!(containers_of(runner_id).await.is_empty());
}

#[tokio::test]
async fn attachments_are_copied_into_the_container() {
    let runner_id = "dt-attach";
    let (_server, _config, roles, bus) = docker_stack(runner_id, true).await;
    let content: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let mut reader: &[u8] = &content;
    turnpike_store::attachments::put(&bus, "dt-attach/m-1/data.bin", &mut reader)
        .await
        .expect("upload");
    let turn = send_with_attachment(
        &bus,
        runner_id,
        "m-1",
        "attachments",
        "../../data.bin",
        "dt-attach/m-1/data.bin",
    )
    .await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done);
    let items = visible_items(&bus, runner_id).await;
    assert_eq!(items.len(), 1);
    assert_eq!(
        items[0].text,
        format!(
            "/turnpike/attachments/data.bin {} {}",
            content.len(),
            fnv1a(&content)
        )
    );
    for r in roles {
        r.stop().await;
    }
    assert!(containers_of(runner_id).await.is_empty());
}

/// Issue 16, item 5: a runner killed right after its agent's reply landed, before it could report
/// that, restarts and reaps the leftover container. Its report of the orphan used to say "nothing
/// landed", and the turn was retried after a reply (the user got two). It now fences the attempt
/// out and counts what landed first.
#[tokio::test]
async fn a_restarted_runner_counts_what_its_orphan_landed_before_reporting_it() {
    use futures::StreamExt;
    let runner_id = "dt-orphan-reply";
    let server = NatsServer::start();
    let proxy = turnpike_testkit::CutProxy::start(server.port()).await;
    // A lease far longer than the restart takes: the restarted runner's report of its orphan,
    // not the sweep, settles the attempt.
    let config = Config {
        max_turn_retry: 3,
        lease: Duration::from_secs(40),
        heartbeat: Duration::from_secs(5),
        ..docker_config(&server, runner_id)
    };
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let chat = turnpike_core::ChatId::new(runner_id).expect("chat");
    let mut out = bus
        .client
        .subscribe(turnpike_core::subjects::chat_out(&chat))
        .await
        .expect("subscribe");
    // The runner's round trips are slow: its reply's ack, and so its report of the reply, is
    // still on the way when the reply is stored.
    proxy.set_delay(Duration::from_millis(300));
    let mut runner = RoleProcess::start(
        env!("CARGO_BIN_EXE_test-role"),
        "runner",
        &Config {
            nats_url: proxy.url(),
            ..config.clone()
        },
    );
    let turn = send(&bus, runner_id, "m-1", "reply-then-hang").await;
    tokio::time::timeout(T, async {
        loop {
            let m = out.next().await.expect("outbound");
            let item: turnpike_core::wire::OutboundItem =
                turnpike_jetstream::decode(m.headers.as_ref(), &m.payload).expect("item");
            if item.kind == OutboundKind::Message {
                break;
            }
        }
    })
    .await
    .expect("the agent's reply landed (is the agent image built?)");
    runner.kill9();
    assert!(
        !containers_of(runner_id).await.is_empty(),
        "its container outlives it"
    );
    // Restarted at once under the same id (and without the delay), before its lease lapses.
    let mut restarted = RoleProcess::start(env!("CARGO_BIN_EXE_test-role"), "runner", &config);
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Failed, "{record:#?}");
    assert_eq!(
        record.attempts.len(),
        1,
        "no retry after a reply: {record:#?}"
    );
    assert_eq!(record.attempts[0].messages_landed, 1);
    let exit = record.attempts[0].exit.as_ref().expect("exit");
    assert_eq!(exit.class, ExitClass::RunnerLost);
    assert_eq!(
        exit.error.as_deref(),
        Some("the runner restarted while the attempt ran"),
        "settled by the restarted runner, not by the lease sweep"
    );
    eventually(T, "the orphan reaped", || async {
        containers_of(runner_id).await.is_empty().then_some(())
    })
    .await;
    let replies = visible_items(&bus, runner_id)
        .await
        .into_iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .count();
    assert_eq!(replies, 1);
    restarted.kill9();
    for r in roles {
        r.stop().await;
    }
}

/// Issue 16, security: an agent can change nothing of its image; it writes to its small /tmp.
#[tokio::test]
async fn the_agent_writes_only_to_its_tmp() {
    let runner_id = "dt-readonly";
    let (_server, _config, roles, bus) = docker_stack(runner_id, true).await;
    let root = send(&bus, runner_id, "m-1", "write-file:/agent-was-here").await;
    let tmp = send(&bus, runner_id, "m-2", "write-file:/tmp/scratch").await;
    for t in [&root, &tmp] {
        assert_eq!(wait_ended(&bus, t, T).await.state, TurnState::Done);
    }
    let texts: Vec<_> = visible_items(&bus, runner_id)
        .await
        .into_iter()
        .map(|i| i.text)
        .collect();
    assert!(
        texts[0].starts_with("refused /agent-was-here: ") && texts[0].contains("Read-only"),
        "{texts:?}"
    );
    assert_eq!(texts[1], "wrote /tmp/scratch");
    assert!(containers_of(runner_id).await.is_empty());
    for r in roles {
        r.stop().await;
    }
}

/// A Docker backend of its own (runner `runner_id`, against a NATS server of its own, which the
/// caller keeps) and one attempt of `text` in chat `chat` for it, with the watchdog's deadline
/// `watchdog`.
async fn backend_and_spec(
    server: &NatsServer,
    runner_id: &str,
    chat: &str,
    text: &str,
    watchdog: tokio::sync::watch::Receiver<Instant>,
) -> (
    turnpike_runner::backend::DockerBackend,
    turnpike_runner::backend::RunSpec,
) {
    let config = docker_config(server, runner_id);
    let backend = turnpike_runner::backend::DockerBackend::connect(
        &config,
        turnpike_core::RunnerId::new(runner_id).expect("runner id"),
    )
    .await
    .expect("the Docker Engine answers");
    let chat = turnpike_core::ChatId::new(chat).expect("chat id");
    let message = turnpike_core::wire::InboundMessage::new(chat.clone(), "m", text, None);
    let spec = turnpike_runner::backend::RunSpec {
        workspace: None,
        work: turnpike_core::wire::WorkItem {
            workspace: None,
            v: turnpike_core::FORMAT_VERSION,
            turn: message.turn(),
            chat,
            attempt: 1,
            max_attempts: 1,
            message,
            history: Vec::new(),
            profile: None,
        },
        attachments: Vec::new(),
        profile: config.profile(None).expect("the default profile"),
        deadline: turnpike_jetstream::now().saturating_add(config.run_timeout),
        secrets: Default::default(),
        stop_grace: config.stop_grace,
        watchdog,
    };
    (backend, spec)
}

/// A run stopped before its container starts (its lease deadline passed during a slow create, a
/// kill) reports the stop and never starts the container; the created one is removed.
#[tokio::test]
async fn a_run_stopped_before_its_container_starts_never_starts_it() {
    use tokio::sync::{mpsc, watch};
    use turnpike_core::exit::StopReason;
    use turnpike_runner::backend::Output;

    let server = NatsServer::start();
    let runner_id = "docker-stopped-before-start";
    let deadline = watch::channel(Instant::now() + Duration::from_secs(60)).1;
    let (backend, spec) = backend_and_spec(
        &server,
        runner_id,
        "stopped-before-start",
        "reply:ok",
        deadline,
    )
    .await;
    let (out_tx, mut out_rx) = mpsc::channel(8);
    let (stop_tx, stop_rx) = watch::channel(None);
    stop_tx.send_replace(Some(StopReason::LeaseLost));

    let raw = backend.run(&spec, out_tx, stop_rx).await;

    assert_eq!(raw.stopped_by, Some(StopReason::LeaseLost), "{raw:?}");
    assert_eq!(raw.exit_code, None, "the container ran: {raw:?}");
    let mut outputs: Vec<Output> = Vec::new();
    while let Some(o) = out_rx.recv().await {
        outputs.push(o);
    }
    assert!(outputs.is_empty(), "the container started: {outputs:?}");
    assert!(
        containers_of(runner_id).await.is_empty(),
        "the created container was left behind"
    );
}

/// Issue 34 (the nemesis, seed 34): a container does not freeze with its runner. A runner paused
/// past its lease (a VM stall, `SIGSTOP`, `docker pause`) could not stop its agent, which ran on
/// beside the attempt's retry. The watchdog, PID 1 of every agent container, stops the agent by
/// itself once the runner's heartbeats stop: here the deadline is never moved on and the runner
/// never asks for a stop, as a frozen runner would not.
#[tokio::test]
async fn an_agent_whose_runner_stops_renewing_is_stopped_by_its_watchdog() {
    use tokio::sync::{mpsc, watch};
    use turnpike_core::exit::{classify, StopReason};
    use turnpike_runner::backend::Output;

    let server = NatsServer::start();
    let runner_id = "docker-watchdog";
    // The last heartbeat the frozen runner sent: the agent may live two more seconds.
    let (_frozen, deadline) = watch::channel(Instant::now() + Duration::from_secs(2));
    let (backend, spec) = backend_and_spec(&server, runner_id, "watchdog", "hang", deadline).await;
    let (out_tx, mut out_rx) = mpsc::channel(64);
    let (_no_stop, stop_rx) = watch::channel(None);

    let raw = tokio::time::timeout(
        Duration::from_secs(120),
        backend.run(&spec, out_tx, stop_rx),
    )
    .await
    .expect("the hanging agent was never stopped");

    assert_eq!(raw.exit_code, Some(251), "{raw:?}");
    assert_eq!(raw.stopped_by, Some(StopReason::LeaseLost), "{raw:?}");
    assert_eq!(classify(&raw, None, false), ExitClass::RunnerLost);
    let mut stderr = Vec::new();
    while let Some(o) = out_rx.recv().await {
        if let Output::Stderr(b) = o {
            stderr.extend_from_slice(&b);
        }
    }
    let stderr = String::from_utf8_lossy(&stderr);
    assert!(
        stderr.contains("turnpike-agent-init: no heartbeat from the runner in time"),
        "{stderr}"
    );
    assert!(containers_of(runner_id).await.is_empty());
}

/// The runner reads the watchdog out of its image without making a container of it: a runner
/// killed during its start, or an engine refusing removals (as here), used to leave one behind.
#[tokio::test]
async fn the_watchdog_is_read_without_a_container() {
    let proxy = turnpike_testkit::DockerProxy::start().await;
    proxy.refuse_all("DELETE /");
    let server = NatsServer::start();
    let runner_id = "docker-init-read";
    let config = Config {
        docker_host: Some(proxy.host()),
        ..docker_config(&server, runner_id)
    };
    turnpike_runner::backend::DockerBackend::connect(
        &config,
        turnpike_core::RunnerId::new(runner_id).expect("runner id"),
    )
    .await
    .expect("the runner reads the watchdog");
    let made = containers_where(&docker().await, "ancestor", "turnpike-agent-init:latest").await;
    assert!(
        made.is_empty(),
        "containers of the watchdog's image: {made:?}"
    );
}

/// Issue 32: a wait for the container that ends without an exit (the engine restarted, the
/// socket dropped, a time-out) was taken for one: the engine reports exit code 0 for a
/// container still running, and the live run was reported clean (a silent turn, its reply
/// lost). The engine is asked whether the container still runs, and it is waited for again.
#[tokio::test]
async fn a_wait_that_ends_without_an_exit_is_waited_again() {
    init_logs();
    let proxy = turnpike_testkit::DockerProxy::start().await;
    proxy.drop_answers("/wait", 1);
    let host = proxy.host();
    let (record, items) = run_one("dt-wait", "sleep:3", |c| c.docker_host = Some(host)).await;
    assert_eq!(record.state, TurnState::Done, "{record:#?}");
    assert_eq!(class(&record, 0), ExitClass::Clean);
    assert_eq!(record.attempts.len(), 1);
    assert_eq!(
        items.iter().map(|i| i.text.as_str()).collect::<Vec<_>>(),
        ["slept 3s"]
    );
}

/// Issue 32: a start whose answer the engine never gave (cut off by a time-out) may still
/// start the container; if it cannot be removed then, it runs on beside the retry with nobody
/// reading it. After any engine failure the attempt's containers are looked for by their labels
/// and removed, and what is left the runner's reaper removes once the engine answers again.
#[tokio::test]
async fn a_container_whose_start_lost_its_answer_is_removed_not_left_running() {
    let runner_id = "dt-start";
    let proxy = turnpike_testkit::DockerProxy::start().await;
    proxy.drop_answers("/start", 1);
    // Removals fail while the engine misbehaves.
    proxy.refuse_all("DELETE /");
    let server = NatsServer::start();
    let config = Config {
        docker_host: Some(proxy.host()),
        max_turn_retry: 2,
        ..docker_config(&server, runner_id)
    };
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
        start_runner(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    // Attempt 1 hangs if it ever runs; attempt 2 replies.
    let turn = send(&bus, runner_id, "m-1", "hang-until:2").await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:#?}");
    assert_eq!(class(&record, 0), ExitClass::EngineError);
    let first = |c: &bollard::models::ContainerSummary| {
        c.labels
            .as_ref()
            .and_then(|l| l.get("turnpike.attempt"))
            .map(String::as_str)
            == Some("1")
    };
    let left: Vec<_> = runner_containers(&docker().await, runner_id).await;
    assert!(
        left.iter().any(first),
        "attempt 1's container is left (the engine would not remove it)"
    );
    proxy.heal();
    eventually(T, "the runner to remove what it left", || async {
        containers_of(runner_id).await.is_empty().then_some(())
    })
    .await;
    for r in roles {
        r.stop().await;
    }
}

/// Issue 32: the containers of a runner that never comes back (removed for good) are removed
/// on their host by another runner of the deployment, once that runner's presence has lapsed
/// and their attempt holds no live lease.
#[tokio::test]
async fn a_gone_runners_containers_are_reaped_by_another_runner_on_the_host() {
    let (_server, config, roles, bus) = docker_stack("dt-reaper", false).await;
    let gone = Config {
        runner_id: Some("dt-gone".into()),
        ..config.clone()
    };
    let mut runner = RoleProcess::start(env!("CARGO_BIN_EXE_test-role"), "runner", &gone);
    let turn = send(&bus, "dt-gone", "m-1", "hang").await;
    wait_state(&bus, &turn, TurnState::Running).await;
    eventually(T, "its container", || async {
        (!containers_of("dt-gone").await.is_empty()).then_some(())
    })
    .await;
    // It dies, and never comes back; its attempt is declared lost (max_turn_retry 1: it ends).
    runner.kill9();
    wait_ended(&bus, &turn, T).await;
    let survivor = start_runner(&Config {
        runner_id: Some("dt-reaper".into()),
        ..config.clone()
    })
    .await;
    eventually(T, "the gone runner's container reaped", || async {
        containers_of("dt-gone").await.is_empty().then_some(())
    })
    .await;
    survivor.stop().await;
    for r in roles {
        r.stop().await;
    }
}

/// Issue 37: in a container, a secret is the file `/run/secrets/<name>`, readable by the agent's
/// user only, and (where asked) a variable the watchdog sets from it: the value is never in the
/// container's configuration. The deadline is in the agent's environment too.
#[tokio::test]
async fn secrets_are_files_in_run_secrets_and_variables_from_them() {
    let secrets = tempfile::tempdir().expect("dir");
    let value = "tp-docker-secret-0123456789";
    std::fs::write(secrets.path().join("api_key"), format!("{value}\n")).expect("write");
    let dir = secrets.path().to_path_buf();
    let (record, items) = run_one("dt-secrets", "secret:api_key:AGENT_API_KEY", move |c| {
        c.secrets_dir = Some(dir);
        c.agent_secrets = "api_key:AGENT_API_KEY".into();
    })
    .await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    assert_eq!(
        items[0].text,
        format!(
            "secret api_key file {} env {}",
            turnpike_test_agent::fnv1a(format!("{value}\n").as_bytes()),
            turnpike_test_agent::fnv1a(value.as_bytes())
        )
    );
    // A secret that is gone when an attempt starts: the agent could not start, and the error
    // names the secret.
    let server = NatsServer::start();
    let mut config = docker_config(&server, "dt-secrets-gone");
    config.secrets_dir = Some(secrets.path().to_path_buf());
    config.agent_secrets = "api_key".into();
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
        start_runner(&config).await,
    ];
    std::fs::remove_file(secrets.path().join("api_key")).expect("remove");
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = send(&bus, "dt-secrets-gone", "m-1", "reply:hi").await;
    let record = wait_ended(&bus, &turn, T).await;
    for r in roles {
        r.stop().await;
    }
    assert_eq!(class(&record, 0), ExitClass::CouldNotStart);
    let error = record.attempts[0]
        .exit
        .as_ref()
        .and_then(|e| e.error.clone());
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("secret api_key cannot be read")),
        "{error:?}"
    );
    assert_eq!(containers_of("dt-secrets-gone").await, Vec::<String>::new());
}

/// Issue 37, the concept's remedy for a folder that runs out of memory: not more retries, a
/// larger limit. A chat whose profile gives 64 MiB gives up on an agent that needs ~100 MiB
/// (out of memory, at 64 MiB by its record); moved to a 256 MiB profile and re-run, it answers,
/// and its record says with which profile.
#[tokio::test]
async fn out_of_memory_at_a_small_profile_answers_after_a_move_to_a_larger_one() {
    use turnpike_core::subjects::{OPS_PROFILE, OPS_RERUN};
    use turnpike_core::wire::OpsRequest;
    let server = NatsServer::start();
    let mut config = docker_config(&server, "dt-profiles");
    let profile = |mib: u64| turnpike_config::ProfileSettings {
        memory_limit: Some(ByteSize(mib << 20)),
        ..Default::default()
    };
    config.profiles.insert("small".into(), profile(64));
    config.profiles.insert("large".into(), profile(256));
    config.default_profile = "small".into();
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
        start_runner(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = send(&bus, "dt-profiles", "m-1", "alloc:100").await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::GaveUp, "{record:?}");
    let exit = record.attempts[0].exit.clone().expect("exit");
    assert_eq!(exit.class, ExitClass::OomKilled, "{exit:?}");
    assert_eq!(profile_used(&record, 0), Some(("small".into(), 64 << 20)));

    let chat = turnpike_core::ChatId::new("dt-profiles").expect("chat");
    let moved = ops(
        &bus,
        OPS_PROFILE,
        OpsRequest::profile("tester", chat, Some("large".into())),
    )
    .await;
    assert!(moved.ok, "{moved:?}");
    let rerun = ops(&bus, OPS_RERUN, OpsRequest::turn("tester", turn)).await;
    assert!(rerun.ok, "{rerun:?}");
    let again = rerun.turn.expect("the new turn");
    let record = wait_ended(&bus, &again, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    assert_eq!(profile_used(&record, 0), Some(("large".into(), 256 << 20)));
    let items = visible_items(&bus, "dt-profiles").await;
    assert!(
        items.iter().any(|i| i.text == "allocated 100 MiB"),
        "{items:?}"
    );
    for r in roles {
        r.stop().await;
    }
    assert_eq!(containers_of("dt-profiles").await, Vec::<String>::new());
}
