//! The Docker backend: one brand-new container per attempt through the local Docker Engine
//! (bollard). Memory limit with swap disabled (so the cgroup, not the host, OOM-kills), pids limit,
//! `cap_drop ALL`, `no-new-privileges`, a numeric non-root user, the configured network, and labels
//! naming turn, attempt and runner. The input document goes to stdin; attachments are copied in
//! before start (not bind-mounted: the runner may itself run in a container, where host paths
//! differ). The container is always removed afterwards.
//!
//! Its parts: `settings` (the container every attempt gets), `run` (one attempt's container from
//! create to removal), `image` (the run's volume: the watchdog out of its image, the attachments).

use super::BackendError;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{ListContainersOptionsBuilder, RemoveContainerOptionsBuilder};
use bollard::Docker;
use std::collections::HashMap;
use std::time::Duration;
use tracing::warn;
use turnpike_config::Config;
use turnpike_core::wire::WorkItem;
use turnpike_core::{ChatId, RunnerId, TurnId};

mod egress;
mod image;
mod run;
mod settings;

use image::load_init;
use run::{is_refusal, is_status};

pub use settings::{attach_options, watchdog_command, ContainerSettings};

/// Labels on every container Turnpike starts.
pub const LABEL_MANAGED: &str = "turnpike.managed";
pub const LABEL_RUNNER: &str = "turnpike.runner";
pub const LABEL_TURN: &str = "turnpike.turn";
pub const LABEL_ATTEMPT: &str = "turnpike.attempt";
pub const LABEL_CHAT: &str = "turnpike.chat";
/// Which runner process started the container ([`super::tree::Instance`]): a runner removes
/// what it started for an attempt it no longer runs.
pub const LABEL_INSTANCE: &str = "turnpike.instance";
/// Which deployment (NATS system) the container's runner belongs to: a runner judges another's
/// containers only within its own deployment, whose runners it can see.
pub const LABEL_DEPLOYMENT: &str = "turnpike.deployment";

/// The per-attempt volume inside the container: the watchdog and the attachments.
pub const RUN_DIR: &str = "/turnpike";
/// Where attachments appear inside the container.
pub const ATTACHMENT_DIR: &str = "/turnpike/attachments";
/// Where an agent finds its secrets, one file each (as Docker and compose put them).
pub const SECRETS_DIR: &str = turnpike_agent_init::SECRETS_DIR;
/// The watchdog (`turnpike-agent-init`), PID 1 of every agent container.
pub const INIT_PATH: &str = "/turnpike/init";
/// Size of the agent's writable /tmp (a tmpfs, so it counts against the memory limit).
const TMP_BYTES: u64 = 64 << 20;

/// How long a single engine call may take before it counts as an engine failure.
const ENGINE_TIMEOUT: Duration = Duration::from_secs(60);

pub struct DockerBackend {
    docker: Docker,
    container: ContainerSettings,
    /// The watchdog binary, copied into every agent container (read from `agent_init_image`
    /// once, at start).
    init: bytes::Bytes,
    /// Where egress proxies come from and reach out through.
    egress: egress::EgressSettings,
}

/// A container Turnpike started, as its labels describe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub runner: Option<String>,
    pub instance: Option<String>,
    pub deployment: Option<String>,
    pub turn: Option<TurnId>,
    pub attempt: Option<u32>,
    pub chat: Option<ChatId>,
    /// When the engine created it (Unix seconds).
    pub created: Option<i64>,
}

/// A container left by an earlier life of this runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub container: String,
    pub turn: Option<TurnId>,
    pub attempt: Option<u32>,
    pub chat: Option<ChatId>,
}

impl DockerBackend {
    /// Connect to the local engine (DOCKER_HOST or the default socket), negotiating the API version.
    pub async fn connect(config: &Config, runner: RunnerId) -> Result<Self, BackendError> {
        let docker = match config.docker_host.as_deref() {
            Some(host) => {
                let path = host.strip_prefix("unix://").unwrap_or(host);
                Docker::connect_with_unix(
                    path,
                    ENGINE_TIMEOUT.as_secs(),
                    bollard::API_DEFAULT_VERSION,
                )
            }
            None => Docker::connect_with_local_defaults(),
        }
        .map_err(BackendError::DockerConnect)?
        .with_timeout(ENGINE_TIMEOUT)
        .negotiate_version()
        .await
        .map_err(BackendError::DockerUnreachable)?;
        let init = load_init(&docker, &config.agent_init_image).await?;
        let egress = egress::EgressSettings {
            image: config.egress_proxy_image.clone(),
            network: config.egress_network.clone(),
        };
        // An attempt would find out too late: a profile with an egress list needs the proxy.
        let lists = config
            .profile_names()
            .iter()
            .filter_map(|p| config.profile(Some(p)))
            .any(|p| !p.egress_allow.is_empty());
        if lists {
            if let Err(e) = docker.inspect_image(&egress.image).await {
                return Err(BackendError::ProxyImage {
                    image: egress.image,
                    detail: e.to_string(),
                });
            }
        }
        Ok(DockerBackend {
            docker,
            container: ContainerSettings::new(config, runner),
            init,
            egress,
        })
    }

    /// The agent image's own entrypoint and command, read at each attempt: an image rebuilt
    /// under the same tag runs with its new command. `Err`: a refusal (no such image, or an
    /// image with nothing to run), which no retry changes.
    async fn agent_command(
        &self,
        image_name: &str,
    ) -> Result<Result<Vec<String>, String>, DockerError> {
        let image = match self.docker.inspect_image(image_name).await {
            Ok(i) => i,
            Err(e) if is_refusal(&e) => {
                return Ok(Err(format!("cannot use image {:?}: {e}", image_name)))
            }
            Err(e) => return Err(e),
        };
        let config = image.config.unwrap_or_default();
        let command: Vec<String> = config
            .entrypoint
            .unwrap_or_default()
            .into_iter()
            .chain(config.cmd.unwrap_or_default())
            .collect();
        if command.is_empty() {
            return Ok(Err(format!(
                "image {:?} has neither an entrypoint nor a command",
                image_name
            )));
        }
        Ok(Ok(command))
    }

    /// Does the engine enforce memory limits (cgroup memory controller present)?
    pub async fn enforces_memory_limits(&self) -> Result<bool, BackendError> {
        let info = self
            .docker
            .info()
            .await
            .map_err(|source| BackendError::Docker {
                what: "describe itself",
                source,
            })?;
        Ok(info.memory_limit.unwrap_or(false))
    }

    fn container_name(&self, turn: &TurnId, attempt: u32) -> String {
        self.container.name(turn, attempt)
    }

    /// Remove every container labelled with this runner's id (left by an earlier life), and
    /// its attempts' egress proxies and networks.
    pub async fn reap_orphans(&self) -> Result<Vec<Orphan>, BackendError> {
        let mut out = Vec::new();
        for c in self
            .list(vec![format!("{LABEL_RUNNER}={}", self.container.runner)])
            .await?
        {
            self.remove(&c.id).await;
            out.push(Orphan {
                container: c.id,
                turn: c.turn,
                attempt: c.attempt,
                chat: c.chat,
            });
        }
        self.reap_egress().await?;
        Ok(out)
    }

    /// Every container Turnpike started on this engine, any runner's, in any state.
    pub async fn containers(&self) -> Result<Vec<Container>, BackendError> {
        self.list(vec![format!("{LABEL_MANAGED}=true")]).await
    }

    async fn list(&self, labels: Vec<String>) -> Result<Vec<Container>, BackendError> {
        let filters: HashMap<&str, Vec<String>> = HashMap::from([("label", labels)]);
        let list = self
            .docker
            .list_containers(Some(
                ListContainersOptionsBuilder::new()
                    .all(true)
                    .filters(&filters)
                    .build(),
            ))
            .await
            .map_err(|source| BackendError::Docker {
                what: "list containers",
                source,
            })?;
        Ok(list
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                Some(Container {
                    id: c.id?,
                    runner: labels.get(LABEL_RUNNER).cloned(),
                    instance: labels.get(LABEL_INSTANCE).cloned(),
                    deployment: labels.get(LABEL_DEPLOYMENT).cloned(),
                    turn: labels
                        .get(LABEL_TURN)
                        .and_then(|t| TurnId::new(t.as_str()).ok()),
                    attempt: labels.get(LABEL_ATTEMPT).and_then(|a| a.parse().ok()),
                    chat: labels
                        .get(LABEL_CHAT)
                        .and_then(|c| ChatId::new(c.as_str()).ok()),
                    created: c.created,
                })
            })
            .collect())
    }

    /// Did this runner start `c`?
    pub fn started(&self, c: &Container) -> bool {
        c.instance.as_deref() == Some(self.container.instance.as_str())
    }

    /// Was `c` started by a runner of this runner's deployment?
    pub fn same_deployment(&self, c: &Container) -> bool {
        !self.container.deployment.is_empty()
            && c.deployment.as_deref() == Some(self.container.deployment.as_str())
    }

    /// Name this runner's deployment in its containers' labels.
    pub fn set_deployment(&mut self, deployment: String) {
        self.container.deployment = deployment;
    }

    /// Remove a container (forced, with its volumes); a missing one is no error.
    pub async fn remove_container(&self, id: &str) {
        self.remove(id).await
    }

    /// After an engine failure, remove every container this runner made for the attempt: a
    /// create or a start the engine was still working on when the call failed may leave one,
    /// even one that starts later, running beside the attempt's retry with nobody reading it.
    /// What cannot be removed now, the reaper removes later.
    async fn reconcile(&self, work: &WorkItem) {
        let labels = vec![
            format!("{LABEL_RUNNER}={}", self.container.runner),
            format!("{LABEL_TURN}={}", work.turn),
            format!("{LABEL_ATTEMPT}={}", work.attempt),
        ];
        match self.list(labels).await {
            Ok(left) => {
                for c in left {
                    warn!(container = %c.id, "removing the attempt's container after an engine failure");
                    self.remove(&c.id).await;
                }
            }
            Err(e) => {
                warn!(error = %e, "cannot look for the attempt's containers; the reaper will")
            }
        }
    }

    async fn remove(&self, id: &str) {
        let opts = RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(true)
            .build();
        if let Err(e) = self.docker.remove_container(id, Some(opts)).await {
            if !is_status(&e, 404) {
                warn!(container = id, error = %e, "could not remove container");
            }
        }
    }
}
