//! The cluster's containers and network through the engine: create, start, and the synchronous
//! clean-up that runs in Drop (the docker CLI, since no runtime may be left by then).

use super::*;

/// The cluster while it is being built (and the synchronous clean-up both share).
pub(super) struct Partial {
    pub(super) docker: Docker,
    pub(super) id: String,
    pub(super) network: String,
    /// Remove everything of this cluster when dropped: set while start-up has no Cluster yet.
    pub(super) armed: bool,
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
    pub(super) fn name(&self, name: &str) -> String {
        format!("tpf-{}-{name}", self.id)
    }

    pub(super) fn labels(&self, role: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL.to_owned(), self.id.clone()),
            ("turnpike.fault.role".to_owned(), role.to_owned()),
        ])
    }

    pub(super) fn networking(&self, name: &str) -> NetworkingConfig {
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

    pub(super) async fn create(&self, name: &str, body: ContainerCreateBody) -> String {
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

    pub(super) async fn start(&self, name: &str) {
        self.docker
            .start_container(&self.name(name), None::<StartContainerOptions>)
            .await
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
    }

    pub(super) async fn create_nats(&self, k: usize, port: u16, secrets: &std::path::Path) {
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
                // The users, runners included: rewritten when a runner is added.
                binds: Some(vec![format!(
                    "{}:/etc/nats/accounts:ro",
                    secrets.join("nats").display()
                )]),
                ..Default::default()
            }),
            networking_config: Some(self.networking(&name)),
            ..Default::default()
        };
        self.create(&name, body).await;
    }

    pub(super) async fn create_role_in(
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
        // Each runner's own user (`runner-<id>`); its reply prefix follows from its id.
        let runner = user.starts_with("runner-");
        if user != "admin" && !runner {
            env.push(format!("TURNPIKE_NATS_INBOX_PREFIX=_INBOX_{user}"));
        }
        let mut binds = vec![format!(
            "{}:/run/secrets/nats_password:ro",
            secrets.join(user).display()
        )];
        let mut group_add = None;
        if runner {
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
            .find(|r| *r == user || (runner && *r == "runner"))
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
    pub(super) fn dump_logs(&self) {
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
    pub(super) fn remove_all(&self, runner_ids: &[String]) {
        let mut filters = vec![
            format!("label={LABEL}={}", self.id),
            // Turn containers carry the runner's label, and their names start with its id.
            format!("name=^turnpike-tpf{}-", self.id),
        ];
        filters.extend(
            runner_ids
                .iter()
                .map(|r| format!("label={}={r}", turnpike_runner::backend::LABEL_RUNNER)),
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
pub(super) fn health_check(role: &str) -> HealthConfig {
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

/// Run the docker CLI where a failure needs no report: its stdout, or nothing.
pub(super) fn docker_cli(args: &[&str]) -> String {
    match docker_cli_checked(args) {
        (true, out) => out,
        (false, _) => String::new(),
    }
}
