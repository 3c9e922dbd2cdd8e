//! The harness for end-to-end tests: a real nats-server, and Turnpike's roles started in-process
//! against it, each stoppable on its own (to test restarts) — no mocks.

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::StreamExt;
use std::time::Duration;
use turnpike_config::Config;
use turnpike_core::wire::{InboundMessage, OutboundItem};
use turnpike_core::{subjects, ChatId, TurnId, TurnRecord};
use turnpike_jetstream::decode;
use turnpike_store::turns;
use turnpike_store::Bus;
use turnpike_testkit::{eventually, NatsServer};

/// Logs for a test run, when `RUST_LOG` asks for them (e.g. `RUST_LOG=info`).
pub fn init_logs() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
    }
}

/// A nats-server with a fault injector (`CutProxy`) in front of it, and the test config for it:
/// roles started with [`Faulty::through_proxy`] talk to NATS only through the proxy.
pub struct Faulty {
    pub server: NatsServer,
    pub proxy: turnpike_testkit::CutProxy,
    pub config: Config,
}

impl Faulty {
    pub async fn start(agent: &str) -> Faulty {
        let server = NatsServer::start();
        let proxy = turnpike_testkit::CutProxy::start(server.port()).await;
        let config = test_config(&server, agent);
        Faulty {
            server,
            proxy,
            config,
        }
    }

    /// The config of a role behind the proxy.
    pub fn through_proxy(&self) -> Config {
        Config {
            nats_url: self.proxy.url(),
            ..self.config.clone()
        }
    }
}

pub use turnpike_testkit::pipeline::{
    start_coordinator, start_dispatcher, start_runner, test_config, Pipeline, Role,
};

/// Publish an inbound chat message as a chat adapter would; returns its turn id.
pub async fn send(bus: &Bus, chat: &str, id: &str, text: &str) -> TurnId {
    send_message(bus, chat, id, text, vec![]).await
}

/// Publish an inbound message with its attachments (already in the object store).
pub async fn send_message(
    bus: &Bus,
    chat: &str,
    id: &str,
    text: &str,
    attachments: Vec<turnpike_core::wire::Attachment>,
) -> TurnId {
    let chat = ChatId::new(chat).expect("valid chat");
    let msg = InboundMessage {
        attachments,
        ..InboundMessage::new(chat, id, text, Some("tester".into()))
    };
    turnpike_jetstream::publish_inbound(&bus.js, bus.codec, &msg)
        .await
        .expect("inbound accepted");
    msg.turn()
}

pub use turnpike_test_agent::fnv1a;

/// The resource profile (name, memory limit) attempt `attempt` (from 0) of `record` reports it
/// ran with, once it ended.
pub fn profile_used(record: &TurnRecord, attempt: usize) -> Option<(String, u64)> {
    let start = record
        .attempts
        .get(attempt)?
        .exit
        .as_ref()?
        .started
        .as_ref()?;
    start
        .profile
        .as_ref()
        .map(|p| (p.name.clone(), p.memory_limit))
}

/// A running turn whose agent replies only when told (`reply-when-file`), then hangs: a test
/// looks at the turn before and after its reply lands, with no timing involved.
pub struct ToldTurn {
    pub turn: TurnId,
    go: std::path::PathBuf,
}

impl ToldTurn {
    /// Send the turn's message and wait until the turn runs.
    pub async fn start(bus: &Bus, chat: &str, id: &str) -> ToldTurn {
        let go =
            std::env::temp_dir().join(format!("turnpike-told-{}-{chat}-{id}", std::process::id()));
        let _ = std::fs::remove_file(&go);
        let turn = send(bus, chat, id, &format!("reply-when-file:{}", go.display())).await;
        wait_state(bus, &turn, turnpike_core::TurnState::Running).await;
        ToldTurn { turn, go }
    }

    /// Let the agent reply ("an answer, once told").
    pub fn tell(&self) {
        std::fs::write(&self.go, b"").expect("tell the agent");
    }
}

impl Drop for ToldTurn {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.go);
    }
}

/// A role in its own process (the `test-role` binary), killed -9 on drop.
pub struct RoleProcess(std::process::Child);

impl RoleProcess {
    /// `role` is `runner` or `coordinator`; the config reaches it through the environment.
    pub fn start(bin: &str, role: &str, config: &Config) -> Self {
        let mut cmd = std::process::Command::new(bin);
        cmd.arg(role)
            .env("TURNPIKE_NATS_URL", &config.nats_url)
            .env("TURNPIKE_RUNNER_BACKEND", config.runner_backend.to_string())
            .env("TURNPIKE_AGENT_IMAGE", &config.agent_image)
            .env("TURNPIKE_LEASE", format!("{}ms", config.lease.as_millis()))
            .env(
                "TURNPIKE_HEARTBEAT",
                format!("{}ms", config.heartbeat.as_millis()),
            )
            .env(
                "TURNPIKE_RETRY_DELAY",
                format!("{}ms", config.retry_delay.as_millis()),
            )
            .env("MAX_TURN_RETRY", config.max_turn_retry.to_string())
            .env("TURNPIKE_LOG", "warn");
        if let Some(id) = &config.runner_id {
            cmd.env("TURNPIKE_RUNNER_ID", id);
        }
        if let Some(c) = &config.agent_command {
            cmd.env("TURNPIKE_AGENT_COMMAND", c);
        }
        RoleProcess(cmd.spawn().expect("start the role process"))
    }

    pub fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for RoleProcess {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Ask the coordinators for an operator action.
pub async fn ops(
    bus: &Bus,
    subject: &str,
    req: turnpike_core::wire::OpsRequest,
) -> turnpike_core::wire::OpsReply {
    let reply = bus
        .client
        .request(subject.to_owned(), bytes::Bytes::from(req.to_json()))
        .await
        .expect("a coordinator answers");
    serde_json::from_slice(&reply.payload).expect("an ops reply")
}

/// The coordinators' counters, as `turnpike status` and the dashboard read them.
pub async fn ops_stats(bus: &Bus) -> turnpike_core::wire::OpsStats {
    let reply = bus
        .client
        .request(
            turnpike_core::subjects::OPS_STATS.to_owned(),
            bytes::Bytes::new(),
        )
        .await
        .expect("stats answered");
    serde_json::from_slice(&reply.payload).expect("stats JSON")
}

/// An operator's kill of `turn`, by "tester".
pub async fn kill_turn(bus: &Bus, turn: &TurnId) -> turnpike_core::wire::OpsReply {
    ops(
        bus,
        subjects::OPS_KILL,
        turnpike_core::wire::OpsRequest::turn("tester", turn.clone()),
    )
    .await
}

/// The exit report a runner published for `attempt` of `turn`, once it is in the events stream
/// (the runner's own account, whether or not the coordinator took it).
pub async fn exit_report(
    bus: &Bus,
    turn: &TurnId,
    attempt: u32,
) -> turnpike_core::wire::ExitReport {
    use turnpike_core::wire::{RunnerEvent, RunnerEventKind};
    eventually(
        Duration::from_secs(60),
        &format!("exit report of {turn}.{attempt}"),
        || async {
            read_all(&bus.js, subjects::STREAM_EVENTS, &subjects::events_of(turn))
                .await
                .into_iter()
                .filter_map(|m| decode::<RunnerEvent>(m.headers.as_ref(), &m.payload).ok())
                .find_map(|ev| match ev.kind {
                    RunnerEventKind::Exited { report } if ev.attempt == attempt => Some(report),
                    _ => None,
                })
        },
    )
    .await
}

/// The leases-bucket key of `attempt`'s claimant (the attempt must be claimed by a runner).
pub async fn lease_key(bus: &Bus, turn: &TurnId, attempt: u32) -> String {
    let claimed = turnpike_store::claims::claim(bus, turn, attempt)
        .await
        .expect("read the claim");
    let runner = claimed.runner.expect("a runner holds the claim");
    subjects::lease_key(turn, attempt, &runner)
}

/// Publish an inbound message with one attachment (already uploaded under `object`).
pub async fn send_with_attachment(
    bus: &Bus,
    chat: &str,
    id: &str,
    text: &str,
    name: &str,
    object: &str,
) -> TurnId {
    let attachment = turnpike_core::wire::Attachment {
        name: name.to_owned(),
        object: object.to_owned(),
    };
    send_message(bus, chat, id, text, vec![attachment]).await
}

/// Wait until the turn is in `state`.
pub async fn wait_state(bus: &Bus, turn: &TurnId, state: turnpike_core::TurnState) -> TurnRecord {
    eventually(
        Duration::from_secs(60),
        &format!("turn {turn} {state}"),
        || async {
            turns::load(bus, turn)
                .await
                .ok()
                .flatten()
                .map(|v| v.record)
                .filter(|r| r.state == state)
        },
    )
    .await
}

/// Every message stored under `filter` in `stream` when called, oldest first (and perhaps some
/// stored meanwhile), read through a consumer of its own.
pub async fn read_all(
    js: &async_nats::jetstream::Context,
    stream: &str,
    filter: &str,
) -> Vec<async_nats::jetstream::Message> {
    let mut consumer = js
        .get_stream(stream)
        .await
        .unwrap_or_else(|e| panic!("stream {stream}: {e}"))
        .create_consumer(pull::Config {
            filter_subject: filter.to_owned(),
            deliver_policy: DeliverPolicy::All,
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("ephemeral consumer");
    // Read what the stream held when the consumer was made: a fetch that comes back empty says
    // nothing (a busy cluster can take longer than one fetch to deliver the first message).
    let want = consumer
        .info()
        .await
        .unwrap_or_else(|e| panic!("consumer info on {stream}: {e}"))
        .num_pending as usize;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut out = Vec::new();
    while out.len() < want {
        assert!(
            std::time::Instant::now() < deadline,
            "read {} of the {want} messages on {filter} in {stream} within 60 s",
            out.len()
        );
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_secs(1))
            .messages()
            .await
            .expect("fetch");
        while let Some(m) = batch.next().await {
            match m {
                Ok(m) => out.push(m),
                // Ended early (a timeout, a leader moved): the next fetch goes on from here.
                Err(_) => break,
            }
        }
    }
    out
}

/// Outbound items stored under `filter` (one chat's subject, or all of them), in order.
pub async fn outbound(js: &async_nats::jetstream::Context, filter: &str) -> Vec<OutboundItem> {
    read_all(js, subjects::STREAM_CHAT_OUT, filter)
        .await
        .into_iter()
        .map(|m| decode(m.headers.as_ref(), &m.payload).expect("outbound item decodes"))
        .collect()
}

/// Every dead letter so far: (subject, reason).
pub async fn dead_letters(bus: &Bus) -> Vec<(String, String)> {
    read_all(&bus.js, subjects::STREAM_DEAD, subjects::DEAD_ALL)
        .await
        .into_iter()
        .map(|m| {
            let reason = m
                .headers
                .as_ref()
                .and_then(|h| h.get(subjects::HDR_DEAD_REASON))
                .map(|v| v.to_string())
                .unwrap_or_default();
            (m.subject.to_string(), reason)
        })
        .collect()
}

/// Wait until the turn is terminal with its effects carried out.
pub async fn wait_ended(bus: &Bus, turn: &TurnId, timeout: Duration) -> TurnRecord {
    eventually(timeout, &format!("turn {turn} to end"), || async {
        match turns::load(bus, turn).await {
            // Its effects are carried out once it has left the live index.
            Ok(Some(v))
                if v.record.state.is_terminal()
                    && matches!(turnpike_store::live::is_listed(bus, turn).await, Ok(false)) =>
            {
                Some(v.record)
            }
            _ => None,
        }
    })
    .await
}

/// A bucket opened directly, as `nats kv` would: what a test plants or inspects from outside,
/// never how a role reaches stored state (that is `turnpike-store`).
pub async fn bucket(bus: &Bus, name: &str) -> async_nats::jetstream::kv::Store {
    bus.js.get_key_value(name).await.expect("open bucket")
}

/// The chat's record as stored (the test fails if it is missing or unreadable).
pub async fn chat_record(bus: &Bus, chat: &str) -> turnpike_core::wire::ChatRecord {
    let chat = ChatId::new(chat).expect("chat id");
    turnpike_store::views::chat(bus, &chat)
        .await
        .expect("read chat")
        .expect("record")
}

/// The chat's bot messages and notices, in order: what a user reads (live-progress status items
/// left out).
pub async fn visible_items(bus: &Bus, chat: &str) -> Vec<OutboundItem> {
    chat_items(bus, chat)
        .await
        .into_iter()
        .filter(|i| i.kind != turnpike_core::wire::OutboundKind::Status)
        .collect()
}

/// Every outbound item stored for a chat, in order.
pub async fn chat_items(bus: &Bus, chat: &str) -> Vec<OutboundItem> {
    let chat = ChatId::new(chat).expect("valid chat");
    outbound(&bus.js, &subjects::chat_out(&chat)).await
}

/// A client of one of the deployment's users (`test_password`), that hears the server's
/// refusals (permission violations) as they come. Service roles get their own reply prefix.
pub struct Watched {
    pub client: async_nats::Client,
    violations: tokio::sync::mpsc::UnboundedReceiver<String>,
}

pub async fn connect_as(user: &str, urls: Vec<String>) -> Watched {
    let (tx, violations) = tokio::sync::mpsc::unbounded_channel();
    let mut opts = async_nats::ConnectOptions::with_user_and_password(
        user.to_owned(),
        turnpike_testkit::test_password(user),
    )
    .event_callback(move |event| {
        let tx = tx.clone();
        async move {
            if let async_nats::Event::ServerError(e) = event {
                let _ = tx.send(e.to_string());
            }
        }
    });
    if let Some(runner) = user.strip_prefix("runner-") {
        let id = turnpike_core::RunnerId::new(runner).expect("a runner id");
        opts = opts.custom_inbox_prefix(turnpike_jetstream::accounts::runner_inbox(&id));
    } else if !matches!(user, "chat" | "admin") {
        opts = opts.custom_inbox_prefix(format!("_INBOX_{user}"));
    }
    let client = opts
        .connect(urls)
        .await
        .unwrap_or_else(|e| panic!("{user} connects: {e}"));
    Watched { client, violations }
}

impl Watched {
    /// Publish where this user may not, and return what the server said (within 10 s).
    pub async fn refused(&mut self, subject: &str) -> String {
        self.client
            .publish(subject.to_owned(), "forged".into())
            .await
            .expect("the client sends it");
        self.violation_on(subject, "a publish").await
    }

    /// Subscribe where this user may not, and return what the server said (within 10 s).
    pub async fn refused_subscription(&mut self, subject: &str) -> String {
        let _sub = self
            .client
            .subscribe(subject.to_owned())
            .await
            .expect("the client sends it");
        self.violation_on(subject, "a subscription").await
    }

    /// The server's permissions violation naming `subject`, once what was sent reached it.
    async fn violation_on(&mut self, subject: &str, what: &str) -> String {
        self.client.flush().await.expect("flush");
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                match self.violations.recv().await {
                    Some(v) if v.contains(subject) => return v,
                    Some(_) => continue,
                    None => panic!("event channel closed"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("the server did not refuse {what} to {subject}"))
    }
}
pub mod cluster;

/// Containers a runner started, in any state (by its `turnpike.runner` label).
pub async fn runner_containers(
    docker: &bollard::Docker,
    runner_id: &str,
) -> Vec<bollard::models::ContainerSummary> {
    let label = format!("{}={runner_id}", turnpike_runner::backend::LABEL_RUNNER);
    containers_where(docker, "label", &label).await
}

/// Containers in any state that match one engine filter (`label`, `ancestor`, ...).
pub async fn containers_where(
    docker: &bollard::Docker,
    filter: &str,
    value: &str,
) -> Vec<bollard::models::ContainerSummary> {
    let filters = std::collections::HashMap::from([(filter, vec![value.to_owned()])]);
    docker
        .list_containers(Some(
            bollard::query_parameters::ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list containers")
}

pub use turnpike_testkit::{csrf_of, dashboard_login, http};

/// A pipeline config whose runner runs the test agent's image in Docker, one retry.
pub fn docker_config(server: &NatsServer, runner_id: &str) -> Config {
    Config {
        runner_backend: turnpike_config::Backend::Docker,
        agent_command: None,
        agent_image: "turnpike-test-agent:latest".into(),
        runner_id: Some(runner_id.into()),
        memory_limit: turnpike_config::ByteSize(128 << 20),
        max_turn_retry: 1,
        ..test_config(server, "unused")
    }
}

pub async fn docker_client() -> bollard::Docker {
    bollard::Docker::connect_with_local_defaults()
        .expect("docker client")
        .negotiate_version()
        .await
        .expect("the Docker Engine answers (these tests need it)")
}

/// A network of a test's own and stand-in model endpoints on it (the test agent image's `/llm`,
/// `turnpike-test-llm`); removed on drop (also after a failure).
pub struct Endpoints {
    docker: bollard::Docker,
    pub network: String,
    containers: Vec<String>,
}

impl Endpoints {
    /// A network `tp-egress-<tag>-<pid>` with a stand-in endpoint per name, each reachable
    /// there by its name on port 8080.
    /// `args` go to every endpoint (e.g. `--key <key>`).
    pub async fn start(tag: &str, names: &[&str], args: &[&str]) -> Endpoints {
        let docker = docker_client().await;
        let network = format!("tp-egress-{tag}-{}", std::process::id());
        let labels =
            std::collections::HashMap::from([("turnpike.test".to_owned(), "egress".to_owned())]);
        let _ = docker.remove_network(&network).await;
        docker
            .create_network(bollard::models::NetworkCreateRequest {
                name: network.clone(),
                driver: Some("bridge".into()),
                labels: Some(labels.clone()),
                ..Default::default()
            })
            .await
            .expect("create the test's network");
        let mut me = Endpoints {
            docker,
            network,
            containers: Vec::new(),
        };
        for name in names {
            let container = format!("{}-{name}", me.network);
            me.remove(&container).await;
            me.containers.push(container.clone());
            me.docker
                .create_container(
                    Some(
                        bollard::query_parameters::CreateContainerOptionsBuilder::new()
                            .name(&container)
                            .build(),
                    ),
                    bollard::models::ContainerCreateBody {
                        image: Some("turnpike-test-agent:latest".into()),
                        entrypoint: Some(
                            ["/llm", "--port", "8080", "--name", name]
                                .iter()
                                .chain(args)
                                .map(|a| a.to_string())
                                .collect(),
                        ),
                        labels: Some(labels.clone()),
                        host_config: Some(bollard::models::HostConfig {
                            network_mode: Some(me.network.clone()),
                            ..Default::default()
                        }),
                        networking_config: Some(bollard::models::NetworkingConfig {
                            endpoints_config: Some(std::collections::HashMap::from([(
                                me.network.clone(),
                                bollard::models::EndpointSettings {
                                    aliases: Some(vec![(*name).into()]),
                                    ..Default::default()
                                },
                            )])),
                        }),
                        ..Default::default()
                    },
                )
                .await
                .expect("create an endpoint");
            me.docker
                .start_container(&container, None)
                .await
                .expect("start an endpoint");
        }
        me
    }

    /// The address of endpoint `name` on the test's network.
    pub async fn address(&self, name: &str) -> String {
        let c = self
            .docker
            .inspect_container(&format!("{}-{name}", self.network), None)
            .await
            .expect("inspect");
        c.network_settings
            .and_then(|n| n.networks)
            .and_then(|n| n.get(&self.network).cloned())
            .and_then(|e| e.ip_address)
            .filter(|ip| !ip.is_empty())
            .expect("an address on the test's network")
    }

    async fn remove(&self, container: &str) {
        let opts = bollard::query_parameters::RemoveContainerOptionsBuilder::new()
            .force(true)
            .build();
        let _ = self.docker.remove_container(container, Some(opts)).await;
    }
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        // Drop cannot await: the CLI removes them, bounded, whatever the test's outcome.
        for c in &self.containers {
            let _ = std::process::Command::new("docker")
                .args(["rm", "-f", c])
                .output();
        }
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
    }
}

/// What an attempt's egress left: proxies and networks labelled with the runner's id.
pub async fn egress_left(runner_id: &str) -> Vec<String> {
    let docker = docker_client().await;
    let label = format!("turnpike.egress.runner={runner_id}");
    let mut left: Vec<String> = containers_where(&docker, "label", &label)
        .await
        .into_iter()
        .flat_map(|c| c.names.unwrap_or_default())
        .collect();
    let filters = std::collections::HashMap::from([("label", vec![label])]);
    let networks = docker
        .list_networks(Some(
            bollard::query_parameters::ListNetworksOptionsBuilder::new()
                .filters(&filters)
                .build(),
        ))
        .await
        .expect("list networks");
    left.extend(networks.into_iter().filter_map(|n| n.name));
    left
}
