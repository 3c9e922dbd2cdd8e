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
use turnpike_store::turns;
use turnpike_store::Bus;
use turnpike_testkit::{free_port, test_password, ROLES};

pub const NATS_IMAGE: &str = "turnpike-nats:2.15.1";
pub const TURNPIKE_IMAGE: &str = "turnpike:latest";
pub const AGENT_IMAGE: &str = "turnpike-test-agent:latest";
pub const LABEL: &str = "turnpike.fault";
mod containers;
mod judge;

use containers::Partial;
pub use judge::*;

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

fn runner_id_of(cluster: &str, k: usize) -> String {
    format!("tpf{cluster}-runner-{k}")
}

fn runner_user_of(runner: &str) -> String {
    let id = turnpike_core::RunnerId::new(runner).expect("a valid runner id");
    turnpike_jetstream::accounts::runner_user(&id)
}

/// `user`'s password in the file its container mounts. Roles run as uid 65534 inside their
/// containers.
fn write_secret(dir: &std::path::Path, user: &str) {
    let f = dir.join(user);
    std::fs::write(&f, test_password(user)).expect("write a secret");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o444)).expect("chmod a secret");
}

/// The runners' secrets and the nodes' accounts file (`nats/accounts.conf`, the folder the
/// nodes mount) for runners 1..=`runners`. Written by rename, so a node reading it while it is
/// rewritten sees the old file or the new one.
fn write_accounts(dir: &std::path::Path, cluster: &str, runners: usize) {
    let ids: Vec<String> = (1..=runners).map(|k| runner_id_of(cluster, k)).collect();
    for id in &ids {
        write_secret(dir, &runner_user_of(id));
    }
    let nats = dir.join("nats");
    std::fs::create_dir_all(&nats).expect("the nodes' config folder");
    std::fs::set_permissions(&nats, std::fs::Permissions::from_mode(0o755))
        .expect("chmod the nodes' config folder");
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
    let next = nats.join("accounts.conf.next");
    std::fs::write(&next, turnpike_testkit::accounts_conf(&ids)).expect("write accounts.conf");
    std::fs::set_permissions(&next, std::fs::Permissions::from_mode(0o444))
        .expect("chmod accounts.conf");
    std::fs::rename(&next, nats.join("accounts.conf")).expect("replace accounts.conf");
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
            write_secret(secrets.path(), role);
        }
        // Every runner it starts with has its NATS user before the nodes start.
        write_accounts(secrets.path(), &id, opts.runners);
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
            partial.create_nats(k, ports[k - 1], secrets.path()).await;
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
        runner_id_of(&self.id, k)
    }

    async fn start_role(&self, name: &str, user: &str, cmd: &[&str]) {
        let p = self.partial();
        let mut env = vec![];
        let mut user = user.to_owned();
        if user == "runner" {
            let k: usize = name
                .rsplit('-')
                .next()
                .and_then(|k| k.parse().ok())
                .expect("runner-<k>");
            env.push(format!("TURNPIKE_RUNNER_ID={}", self.runner_id(k)));
            user = runner_user_of(&self.runner_id(k));
        }
        p.create_role_in(name, &user, cmd, &self.opts, env, self.secrets.path())
            .await;
        p.start(name).await;
    }

    /// Start one more runner (capacity grows with nothing else changed); returns its name. One
    /// beyond those the cluster started with gets its NATS user first, as the deployment's
    /// `cluster.sh scale` does: the accounts file is written again and every node reloads it.
    pub async fn add_runner(&self) -> String {
        let k = {
            let mut n = self.runners.lock().expect("runner count");
            *n += 1;
            *n
        };
        if k > self.opts.runners {
            write_accounts(self.secrets.path(), &self.id, k);
            self.reload_accounts(&runner_user_of(&self.runner_id(k)))
                .await;
        }
        let name = format!("runner-{k}");
        self.start_role(&name, "runner", &["runner"]).await;
        name
    }

    /// Have every running node reload its config (SIGHUP), and wait until each lets `user` in.
    async fn reload_accounts(&self, user: &str) {
        for (n, port) in self.ports.iter().enumerate() {
            let node = self.container_name(&format!("nats-{}", n + 1));
            let hup = self
                .docker
                .kill_container(
                    &node,
                    Some(KillContainerOptionsBuilder::new().signal("HUP").build()),
                )
                .await;
            // A node that is down reads the new file when it starts again.
            if hup.is_err() {
                continue;
            }
            let url = format!("nats://127.0.0.1:{port}");
            turnpike_testkit::eventually(
                Duration::from_secs(30),
                &format!("{node} lets {user} in"),
                || async {
                    async_nats::ConnectOptions::with_user_and_password(
                        user.to_owned(),
                        test_password(user),
                    )
                    .connect(url.as_str())
                    .await
                    .ok()
                    .map(|_| ())
                },
            )
            .await;
        }
    }

    /// Wait until `n` runners announce themselves.
    pub async fn wait_runners(&self, n: usize) {
        turnpike_testkit::eventually(Duration::from_secs(90), "runners present", || async {
            let runners = turnpike_store::views::runners(&self.bus).await.ok()?;
            let ours = format!("tpf{}-", self.id);
            let count = runners
                .iter()
                .filter(|p| p.runner.as_str().starts_with(&ours))
                .count();
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

    /// Freeze every process of a container (the cgroup freezer: a paused VM, a stop-the-world
    /// stall); its sockets stay open and nothing it holds is released.
    pub async fn pause(&self, name: &str) {
        self.docker
            .pause_container(&self.container_name(name))
            .await
            .unwrap_or_else(|e| panic!("docker pause {name}: {e}"));
    }

    /// Wake a paused container where it stopped.
    pub async fn unpause(&self, name: &str) {
        self.docker
            .unpause_container(&self.container_name(name))
            .await
            .unwrap_or_else(|e| panic!("docker unpause {name}: {e}"));
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
                    labels
                        .get(turnpike_runner::backend::LABEL_TURN)
                        .cloned()
                        .unwrap_or_default(),
                    labels
                        .get(turnpike_runner::backend::LABEL_ATTEMPT)
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
