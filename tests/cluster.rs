//! A Turnpike cluster as containers, for the fault suite: three nats-server nodes from the
//! deployment's image and config (JetStream, every stream and bucket R3, per-role users), a
//! `turnpike setup` container, then coordinators, a dispatcher and runners as `turnpike:latest`
//! containers, each with its own NATS user, on a private Docker network this harness creates.
//!
//! Everything it creates carries the label `turnpike.fault=<cluster id>`; agent containers carry
//! their runner's id, which starts with the cluster id. Dropping the cluster removes all of it,
//! and prints the roles' last log lines when the test failed. Needs the images from
//! `bash deploy/build-images.sh`.

use bollard::models::{
    ContainerCreateBody, EndpointSettings, HealthConfig, HealthStatusEnum, HostConfig,
    NetworkConnectRequest, NetworkCreateRequest, NetworkDisconnectRequest, NetworkingConfig,
    PortBinding,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, KillContainerOptionsBuilder, StartContainerOptions,
    StopContainerOptionsBuilder, WaitContainerOptions,
};
use bollard::Docker;
use futures::StreamExt;
use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use turnpike_config::Config;
use turnpike_core::wire::{OutboundItem, OutboundKind};
use turnpike_core::{subjects, TurnId, TurnRecord, TurnState};
use turnpike_jetstream::{turns, Bus};
use turnpike_testkit::{test_password, ROLES};

pub const NATS_IMAGE: &str = "turnpike-nats:2.15.1";
pub const TURNPIKE_IMAGE: &str = "turnpike:latest";
pub const AGENT_IMAGE: &str = "turnpike-test-agent:latest";
pub const LABEL: &str = "turnpike.fault";
const NATS_URLS: &str = "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222";

/// The knobs a case turns; the rest is the deployment's defaults with short leases.
#[derive(Clone, Debug)]
pub struct ClusterOpts {
    pub runners: usize,
    pub coordinators: usize,
    pub runner_slots: u32,
    pub max_turn_retry: u32,
    pub retry_delay: Duration,
    pub lease: Duration,
    pub heartbeat: Duration,
}

impl Default for ClusterOpts {
    fn default() -> Self {
        ClusterOpts {
            runners: 3,
            coordinators: 2,
            runner_slots: 2,
            max_turn_retry: 3,
            retry_delay: Duration::from_secs(2),
            lease: Duration::from_secs(6),
            heartbeat: Duration::from_secs(2),
        }
    }
}

pub struct Cluster {
    pub docker: Docker,
    pub id: String,
    pub network: String,
    pub opts: ClusterOpts,
    /// The admin connection from the host, through the nodes' loopback ports.
    pub bus: Bus,
    /// Loopback ports of nats-1..3, fixed for the cluster's life (a restarted node keeps its).
    pub ports: [u16; 3],
    secrets: tempfile::TempDir,
    runners: Mutex<usize>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn fresh_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!("{:x}{:04x}", std::process::id() & 0xffff, nanos & 0xffff)
}

impl Cluster {
    /// Start the whole cluster and wait until a turn goes through it.
    pub async fn start(opts: ClusterOpts) -> Cluster {
        let docker = Docker::connect_with_local_defaults()
            .expect("docker client")
            .negotiate_version()
            .await
            .expect("the Docker Engine answers (the fault suite needs it)");
        let id = fresh_id();
        let network = format!("tpf-{id}");
        docker
            .create_network(NetworkCreateRequest {
                name: network.clone(),
                driver: Some("bridge".into()),
                labels: Some(HashMap::from([(LABEL.to_owned(), id.clone())])),
                ..Default::default()
            })
            .await
            .expect("create the cluster's network");
        let secrets = tempfile::tempdir().expect("secrets dir");
        for role in ROLES {
            let f = secrets.path().join(role);
            std::fs::write(&f, test_password(role)).expect("write a secret");
            // Roles run as uid 65534 inside their containers.
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444))
                .expect("chmod a secret");
        }
        let ports = [free_port(), free_port(), free_port()];
        let admin = Config {
            nats_url: ports
                .iter()
                .map(|p| format!("nats://127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(","),
            nats_user: Some("admin".into()),
            nats_password: Some(test_password("admin")),
            replicas: 3,
            manage_topology: false,
            ..Config::default()
        };
        // Until the Cluster exists, this removes what was made if start-up fails.
        let mut partial = Partial {
            docker: docker.clone(),
            id: id.clone(),
            network: network.clone(),
            armed: true,
        };
        for k in 1..=3 {
            partial.create_nats(k, ports[k - 1]).await;
        }
        for k in 1..=3 {
            partial.start(&format!("nats-{k}")).await;
        }
        // Setup creates the topology (R3) as admin, as the deployment's setup service does.
        let setup = partial
            .create_role_in(
                "setup",
                "admin",
                &["setup", "--wait", "120s"],
                &opts,
                vec![],
                secrets.path(),
            )
            .await;
        partial.start("setup").await;
        let exit = docker
            .wait_container(&setup, None::<WaitContainerOptions>)
            .next()
            .await;
        let code = match exit {
            Some(Ok(r)) => r.status_code,
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
            other => panic!("waiting for setup: {other:?}"),
        };
        assert_eq!(code, 0, "turnpike setup exited {code}");
        let bus = tokio::time::timeout(
            Duration::from_secs(60),
            Bus::connect_patiently(&admin, "fault-suite"),
        )
        .await
        .expect("the admin connects from the host in time")
        .expect("the admin's settings are valid");
        partial.armed = false; // the Cluster's Drop cleans up from here on
        drop(partial);
        let cluster = Cluster {
            docker,
            id,
            network,
            opts: opts.clone(),
            bus,
            ports,
            secrets,
            runners: Mutex::new(0),
        };
        for k in 1..=opts.coordinators {
            cluster
                .start_role(&format!("coordinator-{k}"), "coordinator", &["coordinator"])
                .await;
        }
        cluster
            .start_role("dispatcher", "dispatcher", &["dispatcher"])
            .await;
        for _ in 0..opts.runners {
            cluster.add_runner().await;
        }
        cluster.wait_runners(opts.runners).await;
        // Every node and role reports healthy through `turnpike healthcheck`, as in compose.
        let mut names: Vec<String> = (1..=3).map(|k| format!("nats-{k}")).collect();
        names.extend((1..=opts.coordinators).map(|k| format!("coordinator-{k}")));
        names.push("dispatcher".into());
        names.extend((1..=opts.runners).map(|k| format!("runner-{k}")));
        for name in &names {
            turnpike_testkit::eventually(
                Duration::from_secs(90),
                &format!("{name} healthy"),
                || async {
                    (cluster.health(name).await == Some(HealthStatusEnum::HEALTHY)).then_some(())
                },
            )
            .await;
        }
        // One turn end to end: every role is up and has found its consumer.
        let warm = send_acked(&cluster.bus, "warmup", "warmup-1", "reply:warm", 60).await;
        let r = wait_all_ended(&cluster.bus, &[warm], Duration::from_secs(120)).await;
        assert_eq!(r[0].as_ref().map(|r| r.state), Some(TurnState::Done));
        cluster
    }

    pub fn container_name(&self, name: &str) -> String {
        format!("tpf-{}-{name}", self.id)
    }

    pub fn runner_id(&self, k: usize) -> String {
        format!("tpf{}-runner-{k}", self.id)
    }

    async fn start_role(&self, name: &str, user: &str, cmd: &[&str]) {
        let p = self.partial();
        let mut env = vec![];
        if user == "runner" {
            let k: usize = name
                .rsplit('-')
                .next()
                .and_then(|k| k.parse().ok())
                .expect("runner-<k>");
            env.push(format!("TURNPIKE_RUNNER_ID={}", self.runner_id(k)));
        }
        p.create_role_in(name, user, cmd, &self.opts, env, self.secrets.path())
            .await;
        p.start(name).await;
    }

    /// Start one more runner (capacity grows with nothing else changed); returns its name.
    pub async fn add_runner(&self) -> String {
        let k = {
            let mut n = self.runners.lock().expect("runner count");
            *n += 1;
            *n
        };
        let name = format!("runner-{k}");
        self.start_role(&name, "runner", &["runner"]).await;
        name
    }

    /// Wait until `n` runners announce themselves.
    pub async fn wait_runners(&self, n: usize) {
        turnpike_testkit::eventually(Duration::from_secs(90), "runners present", || async {
            let keys = self.bus.runners.keys().await.ok()?;
            let count = keys
                .filter(|k| {
                    futures::future::ready(
                        k.as_ref()
                            .map(|k| k.starts_with(&format!("tpf{}-", self.id)))
                            .unwrap_or(false),
                    )
                })
                .count()
                .await;
            (count >= n).then_some(())
        })
        .await
    }

    fn partial(&self) -> Partial {
        Partial {
            docker: self.docker.clone(),
            id: self.id.clone(),
            network: self.network.clone(),
            armed: false,
        }
    }

    /// SIGKILL a container (a machine lost, from the cluster's point of view).
    pub async fn kill(&self, name: &str) {
        self.docker
            .kill_container(
                &self.container_name(name),
                Some(KillContainerOptionsBuilder::new().signal("KILL").build()),
            )
            .await
            .unwrap_or_else(|e| panic!("docker kill {name}: {e}"));
    }

    /// A polite stop (SIGTERM, then SIGKILL after `grace`).
    pub async fn stop(&self, name: &str, grace: Duration) {
        let t = i32::try_from(grace.as_secs()).unwrap_or(10);
        self.docker
            .stop_container(
                &self.container_name(name),
                Some(StopContainerOptionsBuilder::new().t(t).build()),
            )
            .await
            .unwrap_or_else(|e| panic!("docker stop {name}: {e}"));
    }

    /// Start a container that was stopped or killed (same name, network, store).
    pub async fn start_container(&self, name: &str) {
        self.partial().start(name).await;
    }

    /// Cut a container off the cluster's network (it keeps running).
    pub async fn disconnect(&self, name: &str) {
        self.docker
            .disconnect_network(
                &self.network,
                NetworkDisconnectRequest {
                    container: self.container_name(name),
                    force: Some(true),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("disconnect {name}: {e}"));
    }

    /// Put it back, under the same name on the network.
    pub async fn connect(&self, name: &str) {
        self.docker
            .connect_network(
                &self.network,
                NetworkConnectRequest {
                    container: self.container_name(name),
                    endpoint_config: Some(EndpointSettings {
                        aliases: Some(vec![name.to_owned()]),
                        ..Default::default()
                    }),
                },
            )
            .await
            .unwrap_or_else(|e| panic!("connect {name}: {e}"));
    }

    /// (running, restart count) of a container.
    pub async fn state(&self, name: &str) -> (bool, i64) {
        let c = self
            .docker
            .inspect_container(&self.container_name(name), None)
            .await
            .unwrap_or_else(|e| panic!("inspect {name}: {e}"));
        let running = c.state.and_then(|s| s.running).unwrap_or(false);
        (running, c.restart_count.unwrap_or(0))
    }

    /// The container's health as its health check reports it.
    pub async fn health(&self, name: &str) -> Option<HealthStatusEnum> {
        self.docker
            .inspect_container(&self.container_name(name), None)
            .await
            .ok()?
            .state?
            .health?
            .status
    }

    /// Agent containers a runner started (all states): (container id, turn, attempt, running).
    pub async fn agents_of(&self, runner_id: &str) -> Vec<(String, String, u32, bool)> {
        crate::runner_containers(&self.docker, runner_id)
            .await
            .into_iter()
            .map(|c| {
                let labels = c.labels.unwrap_or_default();
                (
                    c.id.unwrap_or_default(),
                    labels.get("turnpike.turn").cloned().unwrap_or_default(),
                    labels
                        .get("turnpike.attempt")
                        .and_then(|a| a.parse().ok())
                        .unwrap_or(0),
                    c.state
                        .map(|s| format!("{s:?}").to_lowercase().contains("running"))
                        .unwrap_or(false),
                )
            })
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let p = self.partial();
        if std::thread::panicking() {
            p.dump_logs();
        }
        let n = *self.runners.lock().unwrap_or_else(|e| e.into_inner());
        let runner_ids: Vec<String> = (1..=n).map(|k| self.runner_id(k)).collect();
        p.remove_all(&runner_ids);
    }
}

/// The cluster while it is being built (and the synchronous clean-up both share).
struct Partial {
    docker: Docker,
    id: String,
    network: String,
    /// Remove everything of this cluster when dropped: set while start-up has no Cluster yet.
    armed: bool,
}

impl Drop for Partial {
    fn drop(&mut self) {
        if self.armed {
            if std::thread::panicking() {
                self.dump_logs();
            }
            self.remove_all(&[]);
        }
    }
}

impl Partial {
    fn name(&self, name: &str) -> String {
        format!("tpf-{}-{name}", self.id)
    }

    fn labels(&self, role: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL.to_owned(), self.id.clone()),
            ("turnpike.fault.role".to_owned(), role.to_owned()),
        ])
    }

    fn networking(&self, name: &str) -> NetworkingConfig {
        NetworkingConfig {
            endpoints_config: Some(HashMap::from([(
                self.network.clone(),
                EndpointSettings {
                    aliases: Some(vec![name.to_owned()]),
                    ..Default::default()
                },
            )])),
        }
    }

    async fn create(&self, name: &str, body: ContainerCreateBody) -> String {
        self.docker
            .create_container(
                Some(
                    CreateContainerOptionsBuilder::new()
                        .name(&self.name(name))
                        .build(),
                ),
                body,
            )
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e} (run bash deploy/build-images.sh)"))
            .id
    }

    async fn start(&self, name: &str) {
        self.docker
            .start_container(&self.name(name), None::<StartContainerOptions>)
            .await
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
    }

    async fn create_nats(&self, k: usize, port: u16) {
        let name = format!("nats-{k}");
        let mut env = vec![format!("NATS_NAME={name}")];
        for role in ROLES.iter().chain(["route"].iter()) {
            env.push(format!(
                "TURNPIKE_{}_PASSWORD={}",
                role.to_uppercase(),
                test_password(role)
            ));
        }
        for r in 1..=3 {
            env.push(format!(
                "TURNPIKE_ROUTE_{r}=nats-route://route:{}@nats-{r}:6222",
                test_password("route")
            ));
        }
        let body = ContainerCreateBody {
            image: Some(NATS_IMAGE.into()),
            hostname: Some(name.clone()),
            healthcheck: Some(health_check("nats")),
            env: Some(env),
            labels: Some(self.labels("nats")),
            exposed_ports: Some(vec!["4222/tcp".into()]),
            host_config: Some(HostConfig {
                port_bindings: Some(HashMap::from([(
                    "4222/tcp".to_owned(),
                    Some(vec![PortBinding {
                        host_ip: Some("127.0.0.1".into()),
                        host_port: Some(port.to_string()),
                    }]),
                )])),
                ..Default::default()
            }),
            networking_config: Some(self.networking(&name)),
            ..Default::default()
        };
        self.create(&name, body).await;
    }

    async fn create_role_in(
        &self,
        name: &str,
        user: &str,
        cmd: &[&str],
        opts: &ClusterOpts,
        extra_env: Vec<String>,
        secrets: &std::path::Path,
    ) -> String {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut env = vec![
            format!("TURNPIKE_NATS_URL={NATS_URLS}"),
            "TURNPIKE_REPLICAS=3".into(),
            format!("TURNPIKE_MANAGE_TOPOLOGY={}", user == "admin"),
            format!("TURNPIKE_NATS_USER={user}"),
            "TURNPIKE_NATS_PASSWORD_FILE=/run/secrets/nats_password".into(),
            format!("MAX_TURN_RETRY={}", opts.max_turn_retry),
            format!("TURNPIKE_RETRY_DELAY={}", ms(opts.retry_delay)),
            format!("TURNPIKE_LEASE={}", ms(opts.lease)),
            format!("TURNPIKE_HEARTBEAT={}", ms(opts.heartbeat)),
            "TURNPIKE_STOP_GRACE=3s".into(),
            "TURNPIKE_LOG=info".into(),
        ];
        if user != "admin" {
            env.push(format!("TURNPIKE_NATS_INBOX_PREFIX=_INBOX_{user}"));
        }
        let mut binds = vec![format!(
            "{}:/run/secrets/nats_password:ro",
            secrets.join(user).display()
        )];
        let mut group_add = None;
        if user == "runner" {
            env.extend([
                "TURNPIKE_RUNNER_BACKEND=docker".to_owned(),
                format!("TURNPIKE_AGENT_IMAGE={AGENT_IMAGE}"),
                format!("TURNPIKE_RUNNER_SLOTS={}", opts.runner_slots),
                "TURNPIKE_MEMORY_LIMIT=64MiB".into(),
                "TURNPIKE_NETWORK_MODE=none".into(),
            ]);
            binds.push("/var/run/docker.sock:/var/run/docker.sock".into());
            let gid = std::fs::metadata("/var/run/docker.sock")
                .map(|m| m.gid())
                .expect("the Docker socket");
            group_add = Some(vec![gid.to_string()]);
        }
        env.extend(extra_env);
        let check = ["runner", "coordinator", "dispatcher"]
            .into_iter()
            .find(|r| *r == user)
            .map(health_check);
        let body = ContainerCreateBody {
            image: Some(TURNPIKE_IMAGE.into()),
            hostname: Some(name.to_owned()),
            healthcheck: check,
            cmd: Some(cmd.iter().map(|s| s.to_string()).collect()),
            env: Some(env),
            labels: Some(self.labels(name)),
            host_config: Some(HostConfig {
                binds: Some(binds),
                group_add,
                ..Default::default()
            }),
            networking_config: Some(self.networking(name)),
            ..Default::default()
        };
        self.create(name, body).await
    }

    /// The last log lines of every container of this cluster, to stderr.
    fn dump_logs(&self) {
        let ids = docker_cli(&[
            "ps",
            "-a",
            "--filter",
            &format!("label={LABEL}={}", self.id),
            "--format",
            "{{.Names}}",
        ]);
        for name in ids.lines() {
            let logs = std::process::Command::new("docker")
                .args(["logs", "--tail", "40", name])
                .output();
            if let Ok(o) = logs {
                let mut err = std::io::stderr().lock();
                let _ = writeln!(err, "----- {name} -----");
                let _ = err.write_all(&o.stdout);
                let _ = err.write_all(&o.stderr);
            }
        }
    }

    /// Remove every container and the network of this cluster (synchronous: runs in Drop).
    ///
    /// A runner still alive while its cluster is removed can start a turn container after the
    /// listing, and the engine can refuse a removal while it is busy: so list and remove again
    /// until nothing of the cluster is left (bounded), and say what could not be removed.
    fn remove_all(&self, runner_ids: &[String]) {
        let mut filters = vec![
            format!("label={LABEL}={}", self.id),
            // Turn containers carry the runner's label, and their names start with its id.
            format!("name=^turnpike-tpf{}-", self.id),
        ];
        filters.extend(
            runner_ids
                .iter()
                .map(|r| format!("label=turnpike.runner={r}")),
        );
        for round in 1..=10 {
            let mut ids: Vec<String> = Vec::new();
            for f in &filters {
                let (ok, out) = docker_cli_checked(&["ps", "-aq", "--filter", f]);
                if !ok {
                    eprintln!(
                        "cluster {}: listing containers ({f}) failed: {out}",
                        self.id
                    );
                }
                ids.extend(
                    out.lines()
                        .filter(|l| !l.trim().is_empty())
                        .map(str::to_owned),
                );
            }
            ids.sort();
            ids.dedup();
            let network_left = docker_cli(&[
                "network",
                "ls",
                "-q",
                "--filter",
                &format!("name=^{}$", self.network),
            ])
            .lines()
            .any(|l| !l.trim().is_empty());
            if ids.is_empty() && !network_left {
                return;
            }
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f", "-v"];
                args.extend(ids.iter().map(String::as_str));
                let (ok, out) = docker_cli_checked(&args);
                if !ok {
                    eprintln!(
                        "cluster {} (round {round}): removing containers: {out}",
                        self.id
                    );
                }
            }
            let (ok, out) = docker_cli_checked(&["network", "rm", &self.network]);
            if !ok && round > 1 {
                eprintln!(
                    "cluster {} (round {round}): removing the network: {out}",
                    self.id
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        eprintln!(
            "cluster {}: containers or the network outlived 10 removal rounds",
            self.id
        );
    }
}

/// The deployment's health check for a role (as in compose.yaml), checked often.
fn health_check(role: &str) -> HealthConfig {
    const SEC: i64 = 1_000_000_000;
    HealthConfig {
        test: Some(vec![
            "CMD".into(),
            "/turnpike".into(),
            "healthcheck".into(),
            role.into(),
        ]),
        interval: Some(2 * SEC),
        timeout: Some(10 * SEC),
        retries: Some(3),
        ..Default::default()
    }
}

/// Run the docker CLI: whether it succeeded, and its stdout (or its stderr when it failed).
fn docker_cli_checked(args: &[&str]) -> (bool, String) {
    match std::process::Command::new("docker").args(args).output() {
        Ok(o) if o.status.success() => (true, String::from_utf8_lossy(&o.stdout).into_owned()),
        Ok(o) => (false, String::from_utf8_lossy(&o.stderr).trim().to_owned()),
        Err(e) => (false, e.to_string()),
    }
}

fn docker_cli(args: &[&str]) -> String {
    std::process::Command::new("docker")
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

// ---- load and verdicts -------------------------------------------------------------------------

/// Publish an inbound message until JetStream acknowledges it (a node may be down), trying for up
/// to `secs`; the same message id each time, so a retry is never a second message.
pub async fn send_acked(bus: &Bus, chat: &str, id: &str, text: &str, secs: u64) -> TurnId {
    try_send(bus, chat, id, text, secs)
        .await
        .unwrap_or_else(|| panic!("inbound {id} not acknowledged within {secs}s"))
}

/// `send_acked` that reports failure instead of panicking: `None` if never acknowledged.
pub async fn try_send(bus: &Bus, chat: &str, id: &str, text: &str, secs: u64) -> Option<TurnId> {
    let chat_id = turnpike_core::ChatId::new(chat).expect("chat id");
    let msg = turnpike_core::wire::InboundMessage {
        v: turnpike_core::FORMAT_VERSION,
        id: id.to_owned(),
        chat: chat_id.clone(),
        text: text.to_owned(),
        sender: Some("fault-suite".into()),
        attachments: vec![],
    };
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let sent = turnpike_jetstream::Publish::new(bus.codec, subjects::chat_in(&chat_id), &msg)
            .expect("encodes")
            .msg_id(id)
            .send(&bus.js)
            .await;
        if sent.is_ok() {
            return Some(TurnId::for_message(&chat_id, id));
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Wait until every turn is terminal with its effects done (or `timeout`); the records as they
/// are then (`None`: the turn does not exist).
pub async fn wait_all_ended(
    bus: &Bus,
    turns_: &[TurnId],
    timeout: Duration,
) -> Vec<Option<TurnRecord>> {
    let deadline = Instant::now() + timeout;
    loop {
        let mut out = Vec::with_capacity(turns_.len());
        for t in turns_ {
            out.push(turns::load(bus, t).await.ok().flatten().map(|v| v.record));
        }
        let done = out.iter().all(|r| {
            r.as_ref()
                .map(|r| r.state.is_terminal() && r.outbox.is_empty())
                .unwrap_or(false)
        });
        if done || Instant::now() >= deadline {
            return out;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every outbound item of every chat, grouped by turn.
pub async fn outbound_by_turn(bus: &Bus) -> HashMap<String, Vec<OutboundItem>> {
    let mut out: HashMap<String, Vec<OutboundItem>> = HashMap::new();
    for item in crate::outbound(&bus.js, subjects::CHAT_OUT_ALL).await {
        out.entry(item.turn.to_string()).or_default().push(item);
    }
    out
}

/// What a turn must end as, by the lifecycle table.
#[derive(Clone, Debug)]
pub struct Expect {
    pub turn: TurnId,
    pub state: TurnState,
    /// Exactly this many attempts, when the faults cannot add any (else only the consistency).
    pub attempts: Option<usize>,
    /// Bot messages that must land (exactly).
    pub replies: usize,
}

/// The expectation for a test-agent script with budget `n`, when no fault can cost an attempt.
pub fn expect_script(turn: TurnId, text: &str, n: u32) -> Expect {
    let n = n.max(1) as usize;
    if let Some(k) = text
        .strip_prefix("die-until:")
        .and_then(|k| k.parse::<usize>().ok())
    {
        return if k <= n {
            Expect {
                turn,
                state: TurnState::Done,
                attempts: Some(k.max(1)),
                replies: 1,
            }
        } else {
            Expect {
                turn,
                state: TurnState::GaveUp,
                attempts: Some(n),
                replies: 0,
            }
        };
    }
    Expect {
        turn,
        state: TurnState::Done,
        attempts: Some(1),
        replies: 1,
    }
}

/// One row of the fault suite's summary.
#[derive(Debug, Default)]
pub struct Tally {
    pub case: String,
    pub turns: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub wrong: usize,
    pub problems: Vec<String>,
    pub note: String,
}

/// Judge every turn against its expectation: lost (never ended), duplicated (a second bot
/// message or notice), wrong (state, attempt count, or an inconsistent record).
pub async fn judge(bus: &Bus, case: &str, expects: &[Expect], timeout: Duration) -> Tally {
    let ids: Vec<TurnId> = expects.iter().map(|e| e.turn.clone()).collect();
    let records = wait_all_ended(bus, &ids, timeout).await;
    let outbound = outbound_by_turn(bus).await;
    let mut t = Tally {
        case: case.to_owned(),
        turns: expects.len(),
        ..Tally::default()
    };
    for (e, r) in expects.iter().zip(records) {
        let Some(r) = r.filter(|r| r.state.is_terminal()) else {
            t.lost += 1;
            t.problems.push(format!("{}: never ended", e.turn));
            continue;
        };
        let items = outbound.get(e.turn.as_str()).cloned().unwrap_or_default();
        let messages = items
            .iter()
            .filter(|i| i.kind == OutboundKind::Message)
            .count();
        let notices = items
            .iter()
            .filter(|i| i.kind == OutboundKind::Notice)
            .count();
        if messages > e.replies || notices > 1 {
            t.duplicated += 1;
            t.problems.push(format!(
                "{}: {messages} bot messages (want {}), {notices} notices",
                e.turn, e.replies
            ));
        }
        let mut wrong = Vec::new();
        if r.state != e.state {
            wrong.push(format!("state {} (want {})", r.state, e.state));
        }
        if messages < e.replies {
            wrong.push(format!("{messages} bot messages (want {})", e.replies));
        }
        if let Some(n) = e.attempts {
            if r.attempts.len() != n {
                wrong.push(format!("{} attempts (want {n})", r.attempts.len()));
            }
        }
        wrong.extend(inconsistencies(&r));
        if !wrong.is_empty() {
            t.wrong += 1;
            t.problems.push(format!("{}: {}", e.turn, wrong.join("; ")));
        }
    }
    t
}

/// What the lifecycle table forbids in any ended record: more attempts than the budget, gaps in
/// attempt numbers, a retry after a reply or a clean exit, a retry without its preamble, a notice
/// on a turn that replied and ended well, a give-up without its notice.
pub fn inconsistencies(r: &TurnRecord) -> Vec<String> {
    let mut out = Vec::new();
    if r.attempts.len() > r.max_attempts as usize {
        out.push(format!(
            "{} attempts over a budget of {}",
            r.attempts.len(),
            r.max_attempts
        ));
    }
    for (i, a) in r.attempts.iter().enumerate() {
        if a.n as usize != i + 1 {
            out.push(format!("attempt #{} numbered {}", i + 1, a.n));
        }
        let last = i + 1 == r.attempts.len();
        if !last {
            let died = a.exit.as_ref().map(|x| x.class.is_death()).unwrap_or(false);
            if !died || a.messages_landed > 0 {
                out.push(format!(
                    "attempt {} was retried but it {}",
                    a.n,
                    if a.messages_landed > 0 {
                        "had replied"
                    } else {
                        "did not die"
                    }
                ));
            }
        }
        if a.n >= 2 {
            let want = turnpike_core::texts::retry_preamble(a.n, r.max_attempts);
            if a.preamble.as_deref() != Some(want.as_str()) {
                out.push(format!("attempt {} preamble {:?}", a.n, a.preamble));
            }
        }
    }
    if r.state == TurnState::GaveUp {
        let want = turnpike_core::texts::give_up_notice(r.max_attempts);
        if r.notice.as_ref().map(|n| n.text.as_str()) != Some(want.as_str()) {
            out.push(format!("give-up notice {:?}", r.notice));
        }
    }
    out
}

impl Tally {
    /// Print the row, add it to the suite's summary file, and fail the case unless every count
    /// of lost, duplicated and wrong turns is zero.
    pub fn report(self) {
        let row = format!(
            "{}\t{}\t{}\t{}\t{}\t{}",
            self.case, self.turns, self.lost, self.duplicated, self.wrong, self.note
        );
        eprintln!("case\tturns\tlost\tduplicated\twrong outcome\tnote\n{row}");
        let path = summary_path();
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
        {
            let _ = writeln!(f, "{row}");
        }
        assert!(
            self.lost == 0 && self.duplicated == 0 && self.wrong == 0 && self.turns > 0,
            "{}: {} lost, {} duplicated, {} wrong of {} turns:\n{}",
            self.case,
            self.lost,
            self.duplicated,
            self.wrong,
            self.turns,
            self.problems.join("\n")
        );
    }
}

/// Where the suite's rows go: `$TURNPIKE_FAULT_SUMMARY`, else target/fault-summary.tsv.
pub fn summary_path() -> std::path::PathBuf {
    std::env::var_os("TURNPIKE_FAULT_SUMMARY")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fault-summary.tsv")
        })
}

/// Scale of the load: 1 for CI, more for the soak (`TURNPIKE_SOAK=<factor>`).
pub fn soak() -> usize {
    std::env::var("TURNPIKE_SOAK")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}
