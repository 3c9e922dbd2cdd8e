//! The deployment's per-role NATS users (`deploy/nats/accounts.conf`) on a real nats-server:
//! every role does its whole job holding only its own rights, and a user without a right is
//! refused by the server.

use async_nats::jetstream;
use std::time::Duration;
use turnpike_config::Config;
use turnpike_core::record::TurnState;
use turnpike_core::wire::{Attachment, InboundMessage, OutboundItem, OutboundKind};
use turnpike_core::{subjects, ChatId, TurnId, FORMAT_VERSION};
use turnpike_store::Bus;
use turnpike_testkit::{eventually, test_password, NatsServer};
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const T: Duration = Duration::from_secs(60);

/// Nothing was refused: the server logs every permission violation.
fn assert_no_violations(server: &NatsServer, what: &str) {
    let log = server.log();
    let refused: Vec<_> = log.lines().filter(|l| l.contains("Violation")).collect();
    assert!(refused.is_empty(), "{what}:\n{}", refused.join("\n"));
}

/// The chat client: publishes inbound, uploads attachments, reads outbound. It has no `Bus`
/// (which opens every bucket): a chat adapter has no business with the others.
struct ChatClient {
    watched: Watched,
    js: jetstream::Context,
}

async fn chat_client(server: &NatsServer) -> ChatClient {
    let watched = connect_as("chat", vec![server.url()]).await;
    let js = jetstream::new(watched.client.clone());
    ChatClient { watched, js }
}

impl ChatClient {
    async fn send(&self, chat: &str, id: &str, text: &str, attachments: Vec<Attachment>) -> TurnId {
        let chat = ChatId::new(chat).expect("chat id");
        let msg = InboundMessage {
            v: FORMAT_VERSION,
            id: id.into(),
            chat: chat.clone(),
            text: text.into(),
            sender: Some("chat-user".into()),
            attachments,
        };
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", id);
        self.js
            .publish_with_headers(
                subjects::chat_in(&chat),
                headers,
                serde_json::to_vec(&msg).expect("json").into(),
            )
            .await
            .expect("publish inbound")
            .await
            .expect("inbound acknowledged");
        TurnId::for_message(&chat, id)
    }

    /// What the chat reads: its outbound items, through a consumer of its own.
    async fn read(&self, chat: &str) -> Vec<OutboundItem> {
        let chat = ChatId::new(chat).expect("chat id");
        outbound(&self.js, &subjects::chat_out(&chat)).await
    }
}

fn replies(items: &[OutboundItem]) -> Vec<&str> {
    items
        .iter()
        .filter(|i| i.kind == OutboundKind::Message)
        .map(|i| i.text.as_str())
        .collect()
}

#[tokio::test]
async fn each_role_does_its_whole_job_with_only_its_own_rights() {
    init_logs();
    let server = NatsServer::start_with_accounts();
    let (admin, roles) = pipeline_as_roles(&test_config(&server, AGENT), &ALL_ROLES).await;
    let mut chat = chat_client(&server).await;

    // Upload an attachment as the chat user; the runner reads it.
    let store = chat
        .js
        .get_object_store(subjects::OBJECTS_ATTACHMENTS)
        .await
        .expect("chat user opens the attachment store");
    let mut bytes: &[u8] = b"least privilege";
    store
        .put("lp3/m3/a.txt", &mut bytes)
        .await
        .expect("chat user uploads");

    let reply = chat.send("lp", "lp-1", "reply:one", vec![]).await;
    let retried = chat.send("lp2", "lp-2", "die-until:2", vec![]).await;
    let attached = chat
        .send(
            "lp3",
            "lp-3",
            "attachments",
            vec![Attachment {
                name: "a.txt".into(),
                object: "lp3/m3/a.txt".into(),
            }],
        )
        .await;
    let hung = chat.send("lp4", "lp-4", "hang", vec![]).await;

    assert_eq!(wait_ended(&admin, &reply, T).await.state, TurnState::Done);
    let r = wait_ended(&admin, &retried, T).await;
    assert_eq!((r.state, r.attempts.len()), (TurnState::Done, 2));
    assert_eq!(
        wait_ended(&admin, &attached, T).await.state,
        TurnState::Done
    );
    // An operator action through the coordinators' service.
    wait_state(&admin, &hung, TurnState::Running).await;
    let answer = ops(
        &admin,
        subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("op", hung.clone()),
    )
    .await;
    assert!(answer.ok, "kill refused: {}", answer.message);
    assert_eq!(wait_ended(&admin, &hung, T).await.state, TurnState::Killed);

    assert_eq!(replies(&chat.read("lp").await), vec!["one"]);
    assert_eq!(replies(&chat.read("lp2").await).len(), 1);
    let seen = replies(&chat.read("lp3").await).join(" ");
    assert!(seen.contains("a.txt"), "runner read the attachment: {seen}");

    // Nothing any role did was refused.
    assert_no_violations(&server, "a role lacked a permission it needs");

    // A chat user may not act as a runner, a coordinator or an operator.
    for forged in [
        format!("turnpike.events.{}.r1", reply.as_str()),
        format!("$KV.turnpike_turns.{}", reply.as_str()),
        format!("turnpike.work.run.{}", reply.as_str()),
        "turnpike.chat.out.lp".to_owned(),
        "turnpike.ops.kill".to_owned(),
        "$JS.API.STREAM.DELETE.TURNPIKE_CHAT_IN".to_owned(),
        // Attachment names are write-once: no chat user may purge the store.
        "$JS.API.STREAM.PURGE.OBJ_turnpike_attachments".to_owned(),
    ] {
        let why = chat.watched.refused(&forged).await;
        assert!(why.contains("Permissions Violation"), "{why}");
    }
    // None of it reached a stream: the turn is as it was, no event beyond the runner's.
    let record = wait_ended(&admin, &reply, T).await;
    assert_eq!((record.state, record.attempts.len()), (TurnState::Done, 1));
    assert_eq!(replies(&chat.read("lp").await), vec!["one"]);
    admin
        .js
        .get_stream(subjects::STREAM_CHAT_IN)
        .await
        .expect("the inbound stream was not deleted");

    // A runner may not write turn state.
    let mut runner = connect_as("runner-r1", vec![server.url()]).await;
    let runner_js = jetstream::new(runner.client.clone());
    let put = tokio::time::timeout(
        Duration::from_secs(3),
        runner_js.publish(format!("$KV.turnpike_turns.{}", reply.as_str()), "x".into()),
    )
    .await;
    let stored = match put {
        Ok(Ok(ack)) => tokio::time::timeout(Duration::from_secs(3), ack)
            .await
            .map(|a| a.is_ok())
            .unwrap_or(false),
        _ => false,
    };
    assert!(!stored, "a runner wrote a turn record");
    // Nor read any chat's history or any turn record: an attempt gets its own chat's history in
    // its work item, and needs nothing else of either bucket.
    for forged in [
        "$JS.API.STREAM.MSG.GET.KV_turnpike_chats".to_owned(),
        "$JS.API.STREAM.MSG.GET.KV_turnpike_turns".to_owned(),
        "$JS.API.DIRECT.GET.KV_turnpike_chats.$KV.turnpike_chats.lp".to_owned(),
        format!(
            "$JS.API.DIRECT.GET.KV_turnpike_turns.$KV.turnpike_turns.{}",
            reply.as_str()
        ),
        "$JS.API.STREAM.MSG.GET.TURNPIKE_CHAT_IN".to_owned(),
    ] {
        let why = runner.refused(&forged).await;
        assert!(why.contains("Permissions Violation"), "{forged}: {why}");
    }
    let record = wait_ended(&admin, &reply, T).await;
    assert_eq!(record.state, TurnState::Done, "the record is untouched");

    for r in roles {
        r.stop().await;
    }
}

/// The pipeline's roles, each as its own user on the accounts server (the runner as `r1`).
const ALL_ROLES: [&str; 3] = ["dispatcher", "coordinator", "runner"];

/// `roles` of the pipeline on the accounts server, each as its own user with `base`'s settings:
/// only admin may create the topology; the roles only open it. Returns admin's bus and the roles.
async fn pipeline_as_roles(base: &Config, roles: &[&str]) -> (Bus, Vec<Role>) {
    let admin = Bus::connect(&as_role(base, "admin"), "test-admin")
        .await
        .expect("admin creates the topology");
    let mut started = Vec::new();
    for &role in roles {
        let config = as_role(base, role);
        started.push(match role {
            "dispatcher" => start_dispatcher(&config).await,
            "coordinator" => start_coordinator(&config).await,
            "runner" => start_runner(&config).await,
            other => panic!("no role {other}"),
        });
    }
    (admin, started)
}

/// A role's config on the accounts server: its own user, its own reply prefix, no topology rights.
/// `runner` is runner `r1`.
fn as_role(base: &Config, role: &str) -> Config {
    if role == "runner" {
        return as_runner(base, "r1");
    }
    Config {
        nats_user: Some(role.into()),
        nats_password: Some(test_password(role)),
        nats_inbox_prefix: (role != "admin").then(|| format!("_INBOX_{role}")),
        manage_topology: role == "admin",
        ..base.clone()
    }
}

/// Runner `id`'s config on the accounts server: its own user `runner-<id>` (its reply prefix
/// follows from its id).
fn as_runner(base: &Config, id: &str) -> Config {
    let user = format!("runner-{id}");
    Config {
        nats_password: Some(test_password(&user)),
        nats_user: Some(user),
        nats_inbox_prefix: None,
        runner_id: Some(id.into()),
        manage_topology: false,
        ..base.clone()
    }
}

/// Issue 33: every runner has its own NATS user and speaks only for itself. Runner A (`r1`)
/// acting on runner B's (`r2`) running attempt is refused at every turn: B's events subject,
/// B's lease and presence keys, B's replies; its own events about B's attempt are believed from
/// the subject (never the payload) and dead-lettered for not holding the claim; and B's claim
/// can be neither overwritten nor rolled up, nor the claims bucket wiped; and a kill marker
/// under A's own name on B's fence is not believed. Failing first: with the shared `runner`
/// user, A published B's exit naming B in the payload and the coordinator applied it; a plain
/// write replaced B's claim; and A's kill marker killed the turn.
#[tokio::test]
async fn a_runner_speaks_only_for_itself() {
    use turnpike_core::fence::{FenceHolder, FenceMarker, FenceWriter};
    use turnpike_core::wire::{
        ClaimHolder, ClaimRecord, ExitClass, ExitReport, RunnerEvent, RunnerEventKind,
    };
    use turnpike_core::RunnerId;
    init_logs();
    let server = NatsServer::start_with_accounts();
    let base = test_config(&server, AGENT);
    let (admin, mut roles) = pipeline_as_roles(&base, &["dispatcher", "coordinator"]).await;
    roles.push(start_runner(&as_runner(&base, "r2")).await);
    let chat = chat_client(&server).await;
    let turn = chat.send("b-chat", "b-1", "hang", vec![]).await;
    let running = wait_state(&admin, &turn, TurnState::Running).await;
    let b = RunnerId::new("r2").expect("id");
    assert_eq!(running.attempts[0].runner.as_ref(), Some(&b));
    let claim_before = turnpike_tests::bucket(&admin, subjects::BUCKET_CLAIMS)
        .await
        .entry(subjects::claim_key(&turn, 1))
        .await
        .expect("read the claim")
        .expect("B's claim");

    let mut a = connect_as("runner-r1", vec![server.url()]).await;
    let a_js = jetstream::new(a.client.clone());
    let a_id = RunnerId::new("r1").expect("id");
    // B's subjects and keys are not A's to write, nor B's replies A's to read.
    for forged in [
        subjects::events(&turn, &b),
        subjects::fence_marker(&turn, &FenceWriter::Runner(b.clone())),
        // Only a coordinator or dispatcher kills, or fences out as a service.
        subjects::fence_marker(&turn, &FenceWriter::Service),
        format!("$KV.turnpike_leases.{}", subjects::lease_key(&turn, 1, &b)),
        "$KV.turnpike_runners.r2".to_owned(),
        // Nor may A write a turn record, schedule work, or kill.
        format!("$KV.turnpike_turns.{turn}"),
        format!("turnpike.work.run.{turn}"),
        format!("turnpike.control.kill.{turn}"),
    ] {
        let why = a.refused(&forged).await;
        assert!(why.contains("Permissions Violation"), "{forged}: {why}");
    }
    let why = a.refused_subscription("_INBOX_runner.r2.>").await;
    assert!(why.contains("Permissions Violation"), "{why}");

    // A's own subject, B's attempt: a clean exit, once in A's name and once in B's. The subject
    // names A either way: the first does not hold the claim, the second lies about its sender.
    let exit = |runner: &RunnerId| RunnerEvent {
        v: turnpike_core::FORMAT_VERSION,
        turn: turn.clone(),
        chat: running.chat.clone(),
        attempt: 1,
        runner: runner.clone(),
        at: turnpike_jetstream::now(),
        kind: RunnerEventKind::Exited {
            report: ExitReport::without_output(
                ExitClass::Clean,
                "forged by r1",
                turnpike_jetstream::now(),
            ),
        },
    };
    for (k, sender) in [&a_id, &b].into_iter().enumerate() {
        let mut h = async_nats::HeaderMap::new();
        h.insert("Nats-Msg-Id", format!("forged-{k}").as_str());
        a_js.publish_with_headers(
            subjects::events(&turn, &a_id),
            h,
            serde_json::to_vec(&exit(sender)).expect("json").into(),
        )
        .await
        .expect("publish")
        .await
        .expect("A may publish on its own subject");
    }
    let reasons: Vec<String> = eventually(T, "both forged exits dead-lettered", || async {
        let reasons: Vec<String> = dead_letters(&admin)
            .await
            .into_iter()
            .map(|(_, r)| r)
            .collect();
        (reasons.len() >= 2).then_some(reasons)
    })
    .await;
    assert!(
        reasons.iter().any(|r| r.contains("held by runner r2")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("another runner")),
        "{reasons:?}"
    );

    // B's claim stays B's: neither a plain write, nor a roll-up of the key, nor one of the whole
    // bucket, is stored.
    let mine = ClaimRecord {
        v: turnpike_core::FORMAT_VERSION,
        turn: turn.clone(),
        attempt: 1,
        holder: ClaimHolder::Runner {
            runner: a_id.clone(),
        },
        at: turnpike_jetstream::now(),
        token: None,
    };
    let claim_subject = format!("$KV.turnpike_claims.{}", subjects::claim_key(&turn, 1));
    for rollup in [None, Some("sub"), Some("all")] {
        let mut h = async_nats::HeaderMap::new();
        if let Some(r) = rollup {
            h.insert("Nats-Rollup", r);
        }
        let stored = a_js
            .publish_with_headers(
                claim_subject.clone(),
                h,
                serde_json::to_vec(&mine).expect("json").into(),
            )
            .await
            .expect("publish")
            .await;
        assert!(stored.is_err(), "rollup {rollup:?}: {stored:?}");
    }
    let claim_after = turnpike_tests::bucket(&admin, subjects::BUCKET_CLAIMS)
        .await
        .entry(subjects::claim_key(&turn, 1))
        .await
        .expect("read the claim")
        .expect("B's claim");
    assert_eq!(
        (claim_after.revision, claim_after.value),
        (claim_before.revision, claim_before.value)
    );

    // None of it moved the turn: still B's running attempt.
    let record = wait_state(&admin, &turn, TurnState::Running).await;
    assert_eq!(record.attempts.len(), 1, "{record:#?}");
    assert_eq!(record.attempts[0].runner.as_ref(), Some(&b));

    // A kill marker under A's own name is not believed: it moves the fence (so B's attempt
    // stops, and is retried), but the turn was not killed. A runner can deny service, not end
    // a turn as an operator would.
    let last = turnpike_store::fence::last(&admin, &turn)
        .await
        .expect("read the fence")
        .expect("B's marker");
    let kill_marker = FenceMarker {
        v: turnpike_core::FORMAT_VERSION,
        turn: turn.clone(),
        attempt: 1,
        holder: FenceHolder::Killed { by: "op".into() },
        replaces: last.seq,
    };
    let mut h = async_nats::HeaderMap::new();
    h.insert(
        "Nats-Expected-Last-Subject-Sequence",
        last.seq.to_string().as_str(),
    );
    h.insert(
        "Nats-Expected-Last-Subject-Sequence-Subject",
        subjects::fence(&turn).as_str(),
    );
    a_js.publish_with_headers(
        subjects::fence_marker(&turn, &FenceWriter::Runner(a_id.clone())),
        h,
        serde_json::to_vec(&kill_marker).expect("json").into(),
    )
    .await
    .expect("publish")
    .await
    .expect("A may append under its own name");
    let retried = eventually(T, "attempt 2 running", || async {
        turnpike_store::turns::load(&admin, &turn)
            .await
            .ok()
            .flatten()
            .map(|v| v.record)
            .filter(|r| r.state == TurnState::Running && r.attempts.len() == 2)
    })
    .await;
    assert_eq!(retried.kill, None, "{retried:#?}");
    // An operator's kill is a kill.
    let answer = ops(
        &admin,
        subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("op", turn.clone()),
    )
    .await;
    assert!(answer.ok, "kill refused: {}", answer.message);
    let killed = wait_ended(&admin, &turn, T).await;
    assert_eq!(killed.state, TurnState::Killed);
    assert_eq!(killed.kill.map(|k| k.by), Some("op".to_owned()));
    for r in roles {
        r.stop().await;
    }
}

/// The dashboard shows every page and acts, holding only the `dashboard` user's rights, and
/// that user can neither write state nor pose as another role.
#[tokio::test]
async fn the_dashboard_reads_and_acts_with_only_its_own_rights() {
    init_logs();
    let server = NatsServer::start_with_accounts();
    let base = test_config(&server, AGENT);
    let (admin, roles) = pipeline_as_roles(&base, &ALL_ROLES).await;
    let chat = chat_client(&server).await;
    let done = chat.send("dash", "d-1", "reply:shown", vec![]).await;
    assert_eq!(wait_ended(&admin, &done, T).await.state, TurnState::Done);
    let hung = chat.send("dash2", "d-2", "hang", vec![]).await;
    wait_state(&admin, &hung, TurnState::Running).await;

    let config = as_role(&base, "dashboard");
    let bus = Bus::connect(&config, "test-dashboard")
        .await
        .expect("dashboard connects");
    let users = turnpike_dashboard::Users::default()
        .with("op", turnpike_dashboard::hash_password("pw").expect("hash"));
    let access = turnpike_dashboard::Access {
        users,
        key: turnpike_dashboard::SessionKey::random().expect("key"),
        session_ttl: Duration::from_secs(600),
        proxies: Default::default(),
    };
    let listener = turnpike_dashboard::Dashboard::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let stop = tokio_util::sync::CancellationToken::new();
    let dashboard = turnpike_dashboard::Dashboard::new(bus, config, access).expect("dashboard");
    let metrics = dashboard.metrics();
    let serving = tokio::spawn(dashboard.serve(listener, stop.clone()));

    let cookie = dashboard_login(&url, "op", "pw").await;
    let chat_page = "/chats/dash".to_owned();
    let turn_page = format!("/turns/{done}");
    for page in ["/", "/errored", "/live", "/runners", &turn_page, &chat_page] {
        let (status, _, body) = http(&url, "GET", page, &[("Cookie", &cookie)], "").await;
        assert_eq!(status, 200, "{page}: {body}");
    }
    let (_, _, body) = http(&url, "GET", &chat_page, &[("Cookie", &cookie)], "").await;
    assert!(
        body.contains("reply:shown"),
        "the chat's recent turn is listed: {body}"
    );
    let (_, _, body) = http(&url, "GET", &turn_page, &[("Cookie", &cookie)], "").await;
    assert!(
        body.contains(">shown</pre>"),
        "the turn's reply, read from the chat's output: {body}"
    );
    let (_, _, live) = http(&url, "GET", "/live", &[("Cookie", &cookie)], "").await;
    assert!(
        live.contains(hung.as_str()),
        "the hanging turn is live: {live}"
    );
    // An action, as the operator, through the ops service.
    let (status, headers, _) = http(
        &url,
        "POST",
        &format!("/turns/{hung}/kill"),
        &[("Cookie", &cookie), ("Origin", &url)],
        &format!("csrf={}", csrf_of(&live)),
    )
    .await;
    assert_eq!(status, 303);
    let location = headers
        .iter()
        .find(|(k, _)| k == "location")
        .map(|(_, v)| v.clone());
    assert!(
        location.as_deref().is_some_and(|l| l.contains("ok=true")),
        "{location:?}"
    );
    let killed = wait_ended(&admin, &hung, T).await;
    assert_eq!(killed.state, TurnState::Killed);
    assert_eq!(killed.kill.map(|k| k.by), Some("op".to_owned()));
    // Its cluster gauges (for metrics_listen), read with its own rights.
    let gauges = eventually(T, "the cluster gauges read", || {
        let text = metrics().unwrap_or_default();
        std::future::ready(
            text.contains("turnpike_cluster_runner_slots")
                .then_some(text),
        )
    })
    .await;
    assert!(
        gauges.contains("turnpike_cluster_coordinators 1"),
        "{gauges}"
    );
    // Its logout, shared through the sessions bucket.
    let (_, _, page) = http(&url, "GET", "/live", &[("Cookie", &cookie)], "").await;
    let (status, _, _) = http(
        &url,
        "POST",
        "/logout",
        &[("Cookie", &cookie), ("Origin", &url)],
        &format!("csrf={}", csrf_of(&page)),
    )
    .await;
    assert_eq!(status, 303);

    assert_no_violations(&server, "the dashboard lacked a permission it needs");
    // It may not write state, publish for a chat, or pose as a runner or coordinator.
    let mut user = connect_as("dashboard", vec![server.url()]).await;
    for forged in [
        format!("$KV.turnpike_turns.{done}"),
        "$KV.turnpike_chats.dash".to_owned(),
        "turnpike.chat.in.dash".to_owned(),
        "turnpike.chat.out.dash".to_owned(),
        format!("turnpike.events.{done}.r1"),
        format!("turnpike.control.kill.{done}"),
        format!("turnpike.work.run.{done}"),
        "$JS.API.STREAM.PURGE.TURNPIKE_WORK".to_owned(),
    ] {
        let why = user.refused(&forged).await;
        assert!(why.contains("Permissions Violation"), "{forged}: {why}");
    }

    stop.cancel();
    serving.await.expect("join").expect("served");
    for r in roles {
        r.stop().await;
    }
}

/// The coordinator's sweep declares a claimed attempt with no lease lost, holding only the
/// `coordinator` user's rights: that includes leaving its marker on the lease key (the fault
/// suite's cluster found a turn wedged when the marker's publish was refused).
#[tokio::test]
async fn the_sweep_declares_a_lease_less_attempt_lost_with_only_the_coordinators_rights() {
    init_logs();
    let server = NatsServer::start_with_accounts();
    let base = Config {
        heartbeat: Duration::from_secs(20),
        lease: Duration::from_secs(60),
        max_turn_retry: 1,
        ..test_config(&server, AGENT)
    };
    let (admin, roles) = pipeline_as_roles(&base, &["dispatcher", "runner"]).await;
    let chat = chat_client(&server).await;
    let turn = chat.send("lost", "l-1", "hang", vec![]).await;
    // Running, and its lease not due for twenty seconds. No coordinator runs: the sweeper below
    // is the only one, with a lease short enough to stand for the time that would pass.
    eventually(T, "the attempt claimed", || async {
        turnpike_tests::bucket(&admin, subjects::BUCKET_CLAIMS)
            .await
            .get(subjects::claim_key(&turn, 1))
            .await
            .ok()
            .flatten()
            .map(|_| ())
    })
    .await;
    let coordinator = as_role(&base, "coordinator");
    let bus = Bus::connect(&coordinator, "test-sweeper")
        .await
        .expect("the coordinator connects");
    let sweep = Config {
        lease: Duration::from_millis(300),
        ..coordinator
    };
    let mut sweeper = turnpike_coordinator::sweep::Sweeper::default();
    sweeper
        .pass(&bus, &sweep, &Default::default())
        .await
        .expect("sweep");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let report = sweeper
        .pass(&bus, &sweep, &Default::default())
        .await
        .expect("sweep");
    assert_eq!(report.runner_lost, 1, "{report:?}");
    assert_no_violations(&server, "the sweep lacked a permission it needs");
    for r in roles {
        r.stop().await;
    }
}
