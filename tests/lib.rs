//! The harness for end-to-end tests: a real nats-server, and Turnpike's roles started in-process
//! against it, each stoppable on its own (to test restarts) — no mocks.

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::StreamExt;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use turnpike_config::{Backend, Config};
use turnpike_core::wire::{InboundMessage, OutboundItem};
use turnpike_core::{subjects, ChatId, TurnId, TurnRecord, FORMAT_VERSION};
use turnpike_jetstream::{decode, turns, Bus, Publish};
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

/// A config for tests: the given server, the process backend running the test agent, short
/// delays (tests that check the real values set their own).
pub fn test_config(server: &NatsServer, agent: &str) -> Config {
    Config {
        nats_url: server.url(),
        runner_backend: Backend::Process,
        agent_command: Some(agent.to_owned()),
        retry_delay: Duration::from_millis(500),
        stop_grace: Duration::from_secs(2),
        lease: Duration::from_secs(4),
        heartbeat: Duration::from_secs(1),
        ..Config::default()
    }
}

/// One role running in this process.
pub struct Role {
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl Role {
    pub async fn stop(self) {
        self.token.cancel();
        let _ = self.task.await;
    }

    /// Stop at once, like kill -9 (the task is aborted where it stands).
    pub fn abort(self) {
        self.task.abort();
    }
}

impl Role {
    /// Run `role` (a role's `run(token)` future) as a task that can be stopped or aborted.
    fn spawn<F, E>(name: &'static str, role: impl FnOnce(CancellationToken) -> F) -> Role
    where
        F: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let token = CancellationToken::new();
        let run = role(token.clone());
        Role {
            token,
            task: tokio::spawn(async move {
                if let Err(e) = run.await {
                    panic!("{name} failed: {e}");
                }
            }),
        }
    }
}

pub async fn start_dispatcher(config: &Config) -> Role {
    let bus = Bus::connect(config, "test-dispatcher").await.expect("bus");
    let d = turnpike_dispatcher::Dispatcher::new(bus, config.clone());
    Role::spawn("dispatcher", |t| d.run(t))
}

pub async fn start_coordinator(config: &Config) -> Role {
    let bus = Bus::connect(config, "test-coordinator").await.expect("bus");
    let c = turnpike_coordinator::Coordinator::new(bus, config);
    Role::spawn("coordinator", |t| c.run(t))
}

pub async fn start_runner(config: &Config) -> Role {
    let bus = Bus::connect(config, "test-runner").await.expect("bus");
    let r = turnpike_runner::Runner::new(bus, config.clone())
        .await
        .expect("runner config");
    Role::spawn("runner", |t| r.run(t))
}

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
        v: FORMAT_VERSION,
        id: id.to_owned(),
        chat: chat.clone(),
        text: text.to_owned(),
        sender: Some("tester".into()),
        attachments,
    };
    Publish::new(bus.codec, subjects::chat_in(&chat), &msg)
        .expect("encodes")
        .msg_id(id)
        .send(&bus.js)
        .await
        .expect("inbound accepted");
    TurnId::for_message(&chat, id)
}

pub use turnpike_test_agent::fnv1a;

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
    req: serde_json::Value,
) -> turnpike_core::wire::OpsReply {
    let reply = bus
        .client
        .request(subject.to_owned(), bytes::Bytes::from(req.to_string()))
        .await
        .expect("a coordinator answers");
    serde_json::from_slice(&reply.payload).expect("an ops reply")
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

/// A whole pipeline on its own nats-server: dispatcher, coordinator and one runner in-process.
pub struct Pipeline {
    pub server: NatsServer,
    pub bus: Bus,
    pub config: Config,
    pub roles: Vec<Role>,
}

impl Pipeline {
    /// `test_config` with the given agent, adjusted by `tweak`.
    pub async fn start(agent: &str, tweak: impl FnOnce(&mut Config)) -> Pipeline {
        let server = NatsServer::start();
        let mut config = test_config(&server, agent);
        tweak(&mut config);
        let roles = vec![
            start_dispatcher(&config).await,
            start_coordinator(&config).await,
            start_runner(&config).await,
        ];
        let bus = Bus::connect(&config, "test").await.expect("bus");
        Pipeline {
            server,
            bus,
            config,
            roles,
        }
    }

    pub async fn stop(self) {
        for r in self.roles {
            r.stop().await;
        }
    }
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

/// Every dead letter so far: (subject, reason).
pub async fn dead_letters(bus: &Bus) -> Vec<(String, String)> {
    let stream = bus
        .js
        .get_stream(subjects::STREAM_DEAD)
        .await
        .expect("dead-letter stream");
    let consumer = stream
        .create_consumer(pull::Config {
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("ephemeral consumer");
    let mut batch = consumer
        .fetch()
        .max_messages(10_000)
        .expires(Duration::from_millis(500))
        .messages()
        .await
        .expect("fetch");
    let mut out = Vec::new();
    while let Some(Ok(m)) = batch.next().await {
        let reason = m
            .headers
            .as_ref()
            .and_then(|h| h.get(subjects::HDR_DEAD_REASON))
            .map(|v| v.to_string())
            .unwrap_or_default();
        out.push((m.subject.to_string(), reason));
    }
    out
}

/// Wait until the turn is terminal with its effects carried out.
pub async fn wait_ended(bus: &Bus, turn: &TurnId, timeout: Duration) -> TurnRecord {
    eventually(timeout, &format!("turn {turn} to end"), || async {
        match turns::load(bus, turn).await {
            Ok(Some(v)) if v.record.state.is_terminal() && v.record.outbox.is_empty() => {
                Some(v.record)
            }
            _ => None,
        }
    })
    .await
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
    let stream = bus
        .js
        .get_stream(subjects::STREAM_CHAT_OUT)
        .await
        .expect("chat-out stream");
    let consumer = stream
        .create_consumer(pull::Config {
            filter_subject: subjects::chat_out(&chat),
            deliver_policy: DeliverPolicy::All,
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(30),
            ..Default::default()
        })
        .await
        .expect("ephemeral consumer");
    let mut out = Vec::new();
    let mut batch = consumer
        .fetch()
        .max_messages(10_000)
        .expires(Duration::from_millis(500))
        .messages()
        .await
        .expect("fetch");
    while let Some(Ok(m)) = batch.next().await {
        out.push(
            decode::<OutboundItem>(m.headers.as_ref(), &m.payload).expect("outbound item decodes"),
        );
    }
    out
}
pub mod cluster;
