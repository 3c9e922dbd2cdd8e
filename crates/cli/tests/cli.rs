//! The `turnpike` CLI end to end on a running pipeline (real nats-server): output and exit codes.

use std::process::Output;
use std::time::Duration;
use tokio::io::AsyncBufReadExt;
use turnpike_tests::*;

const TURNPIKE: &str = env!("CARGO_BIN_EXE_turnpike");
const AGENT: &str = env!("CARGO_BIN_EXE_turnpike");

async fn turnpike(url: &str, args: &[&str]) -> Output {
    tokio::process::Command::new(TURNPIKE)
        .args(args)
        .env("TURNPIKE_NATS_URL", url)
        .env("TURNPIKE_LOG", "error")
        .env_remove("MAX_TURN_RETRY")
        .output()
        .await
        .expect("run turnpike")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[tokio::test]
async fn operator_commands_on_a_running_pipeline() {
    // The CLI binary doubles as the test agent (`turnpike test-agent`).
    let agent = format!("{AGENT} test-agent");
    let p = Pipeline::start(&agent, |c| c.max_turn_retry = 2).await;
    let url = p.config.nats_url.clone();

    // send: answered → exit 0, the reply printed.
    let o = turnpike(
        &url,
        &["send", "--chat", "cli-1", "reply:hello from the CLI"],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("bot: hello from the CLI"),
        "{}",
        stdout(&o)
    );
    assert!(stdout(&o).contains("attempt 1 of 2"), "{}", stdout(&o));
    // A new chat's first turn waits for nothing, and does not say it does.
    assert!(!stdout(&o).contains("waiting for"), "{}", stdout(&o));

    // send: every attempt dies → the give-up notice, exit 4.
    let o = turnpike(&url, &["send", "--chat", "cli-2", "die-until:99"]).await;
    assert_eq!(o.status.code(), Some(4), "{}{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("retrying in"), "{out}");
    assert!(
        out.contains("⚠ Agent couldn't complete this request after 2 attempts."),
        "{out}"
    );
    assert!(out.contains("turn gave_up after 2 attempts"), "{out}");

    // send --attach: the file reaches the agent.
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, b"attached bytes\n").expect("write");
    let o = turnpike(
        &url,
        &[
            "send",
            "--chat",
            "cli-3",
            "--attach",
            file.to_str().expect("utf-8"),
            "attachments",
        ],
    )
    .await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains(&format!("notes.txt 15 {}", fnv1a(b"attached bytes\n"))),
        "{}",
        stdout(&o)
    );

    // turns ls / show.
    let o = turnpike(&url, &["turns", "ls", "--all", "--json"]).await;
    assert_eq!(o.status.code(), Some(0));
    let page: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON page");
    assert_eq!(page["total"], 3, "{page}");
    let all = page["turns"].as_array().expect("the turns");
    assert_eq!(all.len(), 3);
    let gave_up = all
        .iter()
        .find(|t| t["state"] == "gave_up")
        .expect("the give-up turn");
    let gave_up_id = gave_up["turn"].as_str().expect("turn id").to_owned();
    // Paged: newest first, a line on stderr says which part of how many.
    let o = turnpike(&url, &["turns", "ls", "--all", "--limit", "2"]).await;
    assert_eq!(stdout(&o).lines().count(), 3, "{}", stdout(&o));
    assert!(stderr(&o).contains("1–2 of 3 turns"), "{}", stderr(&o));
    let o = turnpike(&url, &["turns", "ls", "--all", "--offset", "2", "--json"]).await;
    let rest: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON page");
    assert_eq!(rest["total"], 3, "{rest}");
    assert_eq!(rest["turns"], serde_json::json!([all[2]]), "{rest}");
    let o = turnpike(&url, &["turns", "ls", "--all", "--state", "gave_up"]).await;
    let table = stdout(&o);
    assert!(table.starts_with("TURN"), "{table}");
    assert!(
        table.contains(&gave_up_id) && table.contains("2/2"),
        "{table}"
    );
    assert_eq!(table.lines().count(), 2, "{table}");
    let o = turnpike(&url, &["turns", "show", &gave_up_id]).await;
    let shown = stdout(&o);
    assert!(shown.contains("state     gave_up"), "{shown}");
    assert!(shown.contains("crashed"), "{shown}");
    assert!(shown.contains("PREAMBLE"), "{shown}");
    let o = turnpike(&url, &["turns", "show", "t-nope"]).await;
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("no turn t-nope"), "{}", stderr(&o));

    // kill after the end: refused, exit 1.
    let o = turnpike(&url, &["turns", "kill", &gave_up_id]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stdout(&o).contains("already ended (gave_up)"),
        "{}",
        stdout(&o)
    );

    // chats errored / clear.
    let o = turnpike(&url, &["chats", "errored"]).await;
    assert!(
        stdout(&o).contains("cli-2") && stdout(&o).contains("gave up"),
        "{}",
        stdout(&o)
    );
    let o = turnpike(&url, &["chats", "errored", "--json"]).await;
    let flagged: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON page");
    assert_eq!(flagged["total"], 1, "{flagged}");
    assert_eq!(flagged["chats"][0]["chat"], "cli-2", "{flagged}");
    let o = turnpike(&url, &["chats", "clear", "cli-2", "--by", "tester"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let o = turnpike(&url, &["chats", "clear", "cli-2"]).await;
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("not flagged"));

    // rerun: a new turn.
    let o = turnpike(&url, &["turns", "rerun", &gave_up_id, "--json"]).await;
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    let reply: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_ne!(reply["turn"], gave_up_id);

    // runners and status.
    let o = turnpike(&url, &["runners", "--json"]).await;
    let runners: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(runners.len(), 1);
    assert_eq!(runners[0]["slots"], 2);
    let o = turnpike(&url, &["status", "--json"]).await;
    assert_eq!(o.status.code(), Some(0));
    let status: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON");
    assert_eq!(status["runners"], 1);
    assert_eq!(status["slots"], 2);
    let o = turnpike(&url, &["status"]).await;
    assert!(
        stdout(&o).contains("capacity        1 runner, "),
        "{}",
        stdout(&o)
    );

    // A turn behind a running one in its chat says whose end it waits for, then runs once the
    // earlier one ends (killed here).
    let o = turnpike(
        &url,
        &["send", "--chat", "cli-5", "--timeout", "1s", "hang"],
    )
    .await;
    assert_eq!(o.status.code(), Some(6), "{}{}", stdout(&o), stderr(&o));
    let first = stdout(&o)
        .split_whitespace()
        .skip_while(|w| *w != "turn")
        .nth(1)
        .map(str::to_owned)
        .expect("the first turn's id");
    let mut second = tokio::process::Command::new(TURNPIKE)
        .args([
            "send",
            "--chat",
            "cli-5",
            "--timeout",
            "60s",
            "reply:second",
        ])
        .env("TURNPIKE_NATS_URL", &url)
        .env("TURNPIKE_LOG", "error")
        .env_remove("MAX_TURN_RETRY")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run turnpike send");
    let mut lines = tokio::io::BufReader::new(second.stdout.take().expect("stdout")).lines();
    let mut seen = Vec::new();
    let wanted = format!("waiting for the chat's earlier turn {first}");
    while !seen.iter().any(|l: &String| l.contains(&wanted)) {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("send printed within 60 s")
            .expect("read stdout")
            .unwrap_or_else(|| panic!("send ended without {wanted:?}: {seen:?}"));
        seen.push(line);
    }
    let o = turnpike(&url, &["turns", "kill", &first]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    while let Some(line) = lines.next_line().await.expect("read stdout") {
        seen.push(line);
    }
    let status = second.wait().await.expect("send exits");
    assert_eq!(status.code(), Some(0), "{seen:?}");
    assert!(seen.iter().any(|l| l == "bot: second"), "{seen:?}");

    // watch: sees a change live.
    let watcher = tokio::spawn({
        let url = url.clone();
        async move {
            turnpike(
                &url,
                &["watch", "--chat", "cli-4", "--limit", "1", "--json"],
            )
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let o = turnpike(&url, &["send", "--chat", "cli-4", "reply:watched"]).await;
    assert_eq!(o.status.code(), Some(0));
    let w = tokio::time::timeout(Duration::from_secs(20), watcher)
        .await
        .expect("watch saw a change")
        .expect("watch ran");
    let line: serde_json::Value = serde_json::from_slice(&w.stdout).expect("a JSON line");
    assert_eq!(line["chat"], "cli-4");
    p.stop().await;
}

#[tokio::test]
async fn errors_say_what_failed_and_what_to_do() {
    let o = turnpike("nats://127.0.0.1:1", &["status"]).await;
    assert_ne!(o.status.code(), Some(0));
    let err = stderr(&o);
    assert!(
        err.contains("cannot reach NATS at nats://127.0.0.1:1"),
        "{err}"
    );
    assert!(err.contains("is `turnpike up`"), "{err}");
    // The cause is said once, not once per layer that wraps it.
    assert_eq!(err.matches("refused").count(), 1, "{err}");

    let o = tokio::process::Command::new(TURNPIKE)
        .args(["status"])
        .env("MAX_TURN_RETRY", "lots")
        .output()
        .await
        .expect("run turnpike");
    assert_eq!(o.status.code(), Some(2));
    let err = stderr(&o);
    assert!(
        err.contains("MAX_TURN_RETRY") && err.contains("lots"),
        "{err}"
    );

    let o = turnpike("nats://127.0.0.1:1", &["send", "--chat", "bad.chat", "x"]).await;
    assert_ne!(o.status.code(), Some(0));
    assert!(stderr(&o).contains("only A-Z"), "{}", stderr(&o));
}

#[tokio::test]
async fn turnpike_up_runs_the_pipeline_and_stops_cleanly_on_ctrl_c() {
    let state = tempfile::tempdir().expect("state dir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let url = format!("nats://127.0.0.1:{port}");
    let dashboard = format!("127.0.0.1:{}", turnpike_testkit::free_port());
    let metrics = format!("127.0.0.1:{}", turnpike_testkit::free_port());
    let mut up = tokio::process::Command::new(TURNPIKE)
        .arg("up")
        .env("TURNPIKE_NATS_URL", &url)
        .env("TURNPIKE_DASHBOARD_LISTEN", &dashboard)
        .env("TURNPIKE_METRICS_LISTEN", &metrics)
        .env("TURNPIKE_STATE_DIR", state.path())
        .env("TURNPIKE_LOG", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start turnpike up");
    // Its logs, read as they come (a full pipe would stall it).
    let logs = {
        let mut stderr = up.stderr.take().expect("stderr");
        tokio::spawn(async move {
            let mut text = String::new();
            let _ = tokio::io::AsyncReadExt::read_to_string(&mut stderr, &mut text).await;
            text
        })
    };
    // Ready once `send` gets an answer through it.
    let o = turnpike_testkit::eventually(Duration::from_secs(60), "turnpike up answering", || {
        let url = url.clone();
        async move {
            let o = turnpike(
                &url,
                &[
                    "send",
                    "--chat",
                    "up",
                    "--timeout",
                    "20s",
                    "reply:up and running",
                ],
            )
            .await;
            o.status.success().then_some(o)
        }
    })
    .await;
    assert!(stdout(&o).contains("bot: up and running"));
    // The dashboard is up beside it, and every role's counters are on one /metrics.
    let (status, _, _) =
        turnpike_testkit::http(&format!("http://{dashboard}"), "GET", "/healthz", &[], "").await;
    assert_eq!(status, 200);
    // The coordinator counts a turn's end just after the record `send` saw was written: wait
    // for the count rather than race it.
    let text = turnpike_testkit::eventually(Duration::from_secs(30), "the turn counted", || {
        let metrics = metrics.clone();
        async move {
            let (status, _, text) =
                turnpike_testkit::http(&format!("http://{metrics}"), "GET", "/metrics", &[], "")
                    .await;
            (status == 200 && text.contains("turnpike_turns_ended_total{state=\"done\"}"))
                .then_some(text)
        }
    })
    .await;
    // (`send` may have been tried more than once while `up` was starting: at least one each.)
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
            .unwrap_or_else(|| panic!("{series} missing in:\n{text}"))
    };
    assert!(value("turnpike_turns_created_total ") >= 1.0);
    assert!(value("turnpike_turns_ended_total{state=\"done\"} ") >= 1.0);
    assert_eq!(value("turnpike_runner_slots "), 2.0);
    assert!(value("turnpike_attempt_duration_seconds_count{exit_class=\"clean\"} ") >= 1.0);
    assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    // Ctrl-C (SIGINT) stops every role and nats-server, and exits 0.
    let pid = up.id().expect("pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("kill -INT");
    assert!(killed.success());
    let status = tokio::time::timeout(Duration::from_secs(30), up.wait())
        .await
        .expect("turnpike up stopped within 30 s")
        .expect("wait");
    assert!(status.success(), "{status:?}");
    // Logs to a pipe are plain text: no colour escape codes.
    let logs = logs.await.expect("log reader");
    assert!(logs.contains("INFO"), "{logs}");
    assert!(!logs.contains('\u{1b}'), "{logs}");
    // Its nats-server is gone too.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// `turnpike healthcheck`: exit 0 for this host's live roles, 1 (saying why) otherwise.
#[tokio::test]
async fn healthcheck_tells_a_live_role_from_a_missing_one() {
    let agent = format!("{AGENT} test-agent");
    let p = Pipeline::start(&agent, |c| c.runner_id = Some("hc-runner".into())).await;
    let url = p.config.nats_url.clone();
    let check = |args: Vec<&'static str>, runner: &'static str| {
        let url = url.clone();
        async move {
            tokio::process::Command::new(TURNPIKE)
                .args(args)
                .env("TURNPIKE_NATS_URL", &url)
                .env("TURNPIKE_RUNNER_ID", runner)
                .env("TURNPIKE_LOG", "error")
                .output()
                .await
                .expect("run turnpike")
        }
    };
    for role in ["runner", "coordinator", "dispatcher"] {
        let o = turnpike_testkit::eventually(
            Duration::from_secs(20),
            &format!("{role} healthy"),
            || async {
                let o = check(vec!["healthcheck", role], "hc-runner").await;
                (o.status.code() == Some(0)).then_some(o)
            },
        )
        .await;
        assert!(stdout(&o).starts_with("healthy: "), "{}", stdout(&o));
    }
    let o = check(vec!["healthcheck", "runner"], "no-such-runner").await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).contains("no presence record"), "{}", stdout(&o));
    let o = check(
        vec!["healthcheck", "nats", "--url", "http://127.0.0.1:1/healthz"],
        "hc-runner",
    )
    .await;
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(stdout(&o).starts_with("unhealthy: "), "{}", stdout(&o));
    p.stop().await;
}

/// What `turnpike runner container-spec` prints with `env` set (it must succeed).
async fn container_spec(env: &[(&str, &str)]) -> serde_json::Value {
    let o = tokio::process::Command::new(TURNPIKE)
        .args(["runner", "container-spec"])
        .envs(env.iter().copied())
        .env("TURNPIKE_LOG", "error")
        .output()
        .await
        .expect("run turnpike");
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_slice(&o.stdout).expect("JSON")
}

/// `turnpike runner container-spec` prints the container every attempt gets under this config,
/// as the Engine API takes it, so an operator can review the sandbox before running anything.
#[tokio::test]
async fn container_spec_shows_the_sandbox_an_attempt_gets() {
    let spec = container_spec(&[
        ("TURNPIKE_AGENT_IMAGE", "my-agent:1.2"),
        ("TURNPIKE_MEMORY_LIMIT", "256MiB"),
    ])
    .await;
    assert_eq!(spec["Image"], "my-agent:1.2");
    assert_eq!(spec["User"], "65534:65534");
    let host = &spec["HostConfig"];
    assert_eq!(host["Memory"], 256 << 20);
    assert_eq!(host["MemorySwap"], host["Memory"], "no swap");
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["CapDrop"], serde_json::json!(["ALL"]));
    assert_eq!(host["NetworkMode"], "none");
    assert!(host["PidsLimit"].as_i64().is_some_and(|n| n > 0));
}

/// Issue 37: an operator reads, downloads and resets a chat's workspace.
#[tokio::test]
async fn a_chats_workspace_is_shown_downloaded_and_reset() {
    let agent = format!("{AGENT} test-agent");
    let p = Pipeline::start(&agent, |c| {
        c.workspace_max_bytes = turnpike_config::ByteSize(1 << 20)
    })
    .await;
    let url = p.config.nats_url.clone();
    let o = turnpike(&url, &["send", "--chat", "ws-cli", "workspace-note:kept"]).await;
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));

    let o = turnpike(&url, &["chats", "workspace", "ws-cli"]).await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).starts_with("ws-cli: workspace ws-cli/"),
        "{}",
        stdout(&o)
    );

    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("ws.tar");
    let o = turnpike(
        &url,
        &[
            "chats",
            "workspace",
            "ws-cli",
            "--download",
            &file.display().to_string(),
        ],
    )
    .await;
    assert!(o.status.success(), "{}", stderr(&o));
    let mut archive = tar::Archive::new(std::fs::File::open(&file).expect("tar"));
    let mut notes = String::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        if entry.path().expect("path").ends_with("notes.md") {
            std::io::Read::read_to_string(&mut entry, &mut notes).expect("read");
        }
    }
    assert_eq!(notes, "kept\n");

    let o = turnpike(&url, &["chats", "workspace", "ws-cli", "--reset"]).await;
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    let o = turnpike(&url, &["chats", "workspace", "ws-cli"]).await;
    assert_eq!(stdout(&o), "ws-cli: no workspace saved\n");
    p.stop().await;
}

#[tokio::test]
async fn container_spec_shows_an_egress_lists_network_and_proxy() {
    let spec = container_spec(&[("TURNPIKE_EGRESS_ALLOW", "api.example.com:443")]).await;
    let network = spec["HostConfig"]["NetworkMode"]
        .as_str()
        .unwrap_or_default();
    assert!(network.ends_with("-net"), "{network}");
    let env: Vec<&str> = spec["Env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        env.contains(&"HTTPS_PROXY=http://egress-proxy:3128"),
        "{env:?}"
    );
}
