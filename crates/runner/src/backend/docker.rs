//! The Docker backend: one brand-new container per attempt through the local Docker Engine
//! (bollard). Memory limit with swap disabled (so the cgroup, not the host, OOM-kills), pids limit,
//! `cap_drop ALL`, `no-new-privileges`, a numeric non-root user, the configured network, and labels
//! naming turn, attempt and runner. The input document goes to stdin; attachments are copied in
//! before start (not bind-mounted: the runner may itself run in a container, where host paths
//! differ). The container is always removed afterwards.

use super::{BackendError, Output, RunSpec};
use crate::backend::process::wait_stop;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType};
use bollard::query_parameters::{
    AttachContainerOptions, AttachContainerOptionsBuilder, CreateContainerOptionsBuilder,
    EventsOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder, UploadToContainerOptionsBuilder, WaitContainerOptions,
};
use bollard::Docker;
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};
use turnpike_config::Config;
use turnpike_core::exit::{RawExit, StopReason};
use turnpike_core::wire::{AgentInput, WorkItem};
use turnpike_core::{ChatId, RunnerId, TurnId};

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
}

/// The entrypoint of an agent container: the watchdog, the time it may wait for the runner's
/// first word, then the agent's own command (the image's entrypoint and command).
pub fn watchdog_command(first: Duration, agent: impl IntoIterator<Item = String>) -> Vec<String> {
    [INIT_PATH.to_owned(), first.as_millis().to_string()]
        .into_iter()
        .chain(agent)
        .collect()
}

/// The container every attempt of a runner gets, from its config: image, numeric user, limits,
/// network, labels, a read-only root. Public for review (`turnpike runner container-spec` prints
/// it) and so the benchmarks time a bare run of exactly this container.
#[derive(Debug, Clone)]
pub struct ContainerSettings {
    runner: RunnerId,
    instance: super::tree::Instance,
    deployment: String,
    image: String,
    user: String,
    network_mode: String,
    pids_limit: i64,
    nano_cpus: i64,
}

impl ContainerSettings {
    pub fn new(config: &Config, runner: RunnerId) -> Self {
        ContainerSettings {
            runner,
            instance: super::tree::Instance::new(),
            deployment: String::new(),
            image: config.agent_image.clone(),
            user: config.agent_user.clone(),
            network_mode: config.network_mode.clone(),
            pids_limit: config.pids_limit,
            nano_cpus: (config.cpus * 1e9) as i64,
        }
    }

    /// What an attempt's container is created with: the image, the numeric user, stdin for the
    /// input document, the limits, the network and the labels; `command` replaces the image's
    /// entrypoint and command (the watchdog in front of them, [`watchdog_command`]), `None`
    /// keeps the image's own.
    pub fn body(
        &self,
        work: &WorkItem,
        memory_limit: u64,
        command: Option<Vec<String>>,
    ) -> ContainerCreateBody {
        let memory = i64::try_from(memory_limit).unwrap_or(i64::MAX);
        let cmd = command.as_ref().map(|_| Vec::new());
        ContainerCreateBody {
            image: Some(self.image.clone()),
            entrypoint: command,
            cmd,
            user: Some(self.user.clone()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            env: Some(vec![
                format!("TURNPIKE_TURN={}", work.turn),
                format!("TURNPIKE_ATTEMPT={}", work.attempt),
            ]),
            labels: Some(HashMap::from([
                (LABEL_MANAGED.to_owned(), "true".to_owned()),
                (LABEL_RUNNER.to_owned(), self.runner.to_string()),
                (LABEL_INSTANCE.to_owned(), self.instance.as_str().to_owned()),
                (LABEL_DEPLOYMENT.to_owned(), self.deployment.clone()),
                (LABEL_TURN.to_owned(), work.turn.to_string()),
                (LABEL_ATTEMPT.to_owned(), work.attempt.to_string()),
                (LABEL_CHAT.to_owned(), work.chat.to_string()),
            ])),
            host_config: Some(HostConfig {
                memory: Some(memory),
                memory_swap: Some(memory),
                pids_limit: Some(self.pids_limit),
                nano_cpus: Some(self.nano_cpus),
                network_mode: Some(self.network_mode.clone()),
                cap_drop: Some(vec!["ALL".to_owned()]),
                security_opt: Some(vec!["no-new-privileges".to_owned()]),
                // Nothing of the image can be changed: the agent writes to a small /tmp in
                // memory (counted against its memory limit), and reads its attachments (and
                // runs behind the watchdog) from an anonymous volume (the engine copies into a
                // volume even on a read-only root; it goes with the container, which is removed
                // with its volumes).
                readonly_rootfs: Some(true),
                tmpfs: Some(HashMap::from([(
                    "/tmp".to_owned(),
                    format!("rw,noexec,nosuid,size={TMP_BYTES}"),
                )])),
                mounts: Some(vec![Mount {
                    target: Some(RUN_DIR.to_owned()),
                    typ: Some(MountType::VOLUME),
                    ..Default::default()
                }]),
                // The engine keeps what the agent prints in the container's log too: bounded.
                log_config: Some(HostConfigLogConfig {
                    typ: Some("json-file".to_owned()),
                    config: Some(HashMap::from([
                        ("max-size".to_owned(), "10m".to_owned()),
                        ("max-file".to_owned(), "1".to_owned()),
                    ])),
                }),
                auto_remove: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
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
}

/// A container left by an earlier life of this runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    pub container: String,
    pub turn: Option<TurnId>,
    pub attempt: Option<u32>,
    pub chat: Option<ChatId>,
}

/// How an attempt's container is attached, before start: stdin for the input document and both
/// output streams. Public so that the benchmarks' bare run attaches alike.
pub fn attach_options() -> AttachContainerOptions {
    AttachContainerOptionsBuilder::new()
        .stdin(true)
        .stdout(true)
        .stderr(true)
        .stream(true)
        .build()
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
        Ok(DockerBackend {
            docker,
            container: ContainerSettings::new(config, runner),
            init,
        })
    }

    /// The agent image's own entrypoint and command, read at each attempt: an image rebuilt
    /// under the same tag runs with its new command. `Err`: a refusal (no such image, or an
    /// image with nothing to run), which no retry changes.
    async fn agent_command(&self) -> Result<Result<Vec<String>, String>, DockerError> {
        let image = match self.docker.inspect_image(&self.container.image).await {
            Ok(i) => i,
            Err(e) if is_refusal(&e) => {
                return Ok(Err(format!(
                    "cannot use image {:?}: {e}",
                    self.container.image
                )))
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
                self.container.image
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
        // Docker names: [a-zA-Z0-9][a-zA-Z0-9_.-]*; our ids already fit.
        format!("turnpike-{}-{turn}-{attempt}", self.container.runner)
    }

    /// Remove every container labelled with this runner's id (left by an earlier life).
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

    pub async fn run(
        &self,
        spec: &RunSpec,
        out: mpsc::Sender<Output>,
        stop: watch::Receiver<Option<StopReason>>,
    ) -> RawExit {
        let work = &spec.work;
        let name = self.container_name(&work.turn, work.attempt);
        // A container of the same name can only be a leftover of this very attempt: replace it.
        self.remove(&name).await;
        let paths = spec
            .attachments
            .iter()
            .map(|a| format!("{ATTACHMENT_DIR}/{}", a.name))
            .collect();
        let input = match serde_json::to_vec(&AgentInput::from_work(work, paths)) {
            Ok(i) => i,
            Err(e) => return engine_error(format!("cannot encode the input document: {e}")),
        };
        let command = match self.agent_command().await {
            Ok(Ok(c)) => c,
            Ok(Err(refused)) => {
                return RawExit {
                    start_error: Some(refused),
                    ..RawExit::default()
                }
            }
            Err(e) => return engine_error(format!("inspecting the agent image failed: {e}")),
        };
        let first = spec
            .watchdog
            .borrow()
            .saturating_duration_since(std::time::Instant::now());
        let body = self.container.body(
            work,
            spec.memory_limit,
            Some(watchdog_command(first, command)),
        );
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptionsBuilder::new().name(&name).build()),
                body,
            )
            .await;
        let id = match created {
            Ok(c) => c.id,
            Err(e) if is_refusal(&e) => {
                return RawExit {
                    start_error: Some(format!(
                        "cannot create the container from image {:?}: {e}",
                        self.container.image
                    )),
                    ..RawExit::default()
                }
            }
            Err(e) => {
                // The engine may have made it all the same.
                self.reconcile(work).await;
                return engine_error(format!("creating the container failed: {e}"));
            }
        };
        let raw = self.run_created(&id, spec, input, out, stop).await;
        self.remove(&id).await;
        if raw.engine_error.is_some() {
            self.reconcile(work).await;
        }
        raw
    }

    async fn run_created(
        &self,
        id: &str,
        spec: &RunSpec,
        input: Vec<u8>,
        out: mpsc::Sender<Output>,
        mut stop: watch::Receiver<Option<StopReason>>,
    ) -> RawExit {
        let tar = match run_dir_tar(self.init.clone(), spec.attachments.clone()).await {
            Ok(t) => t,
            Err(e) => {
                return engine_error(format!("cannot pack the watchdog and attachments: {e}"))
            }
        };
        let opts = UploadToContainerOptionsBuilder::new().path(RUN_DIR).build();
        let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(tar));
        if let Err(e) = self.docker.upload_to_container(id, Some(opts), body).await {
            return engine_error(format!(
                "copying the watchdog and attachments into the container failed: {e}"
            ));
        }

        // The engine's oom event: State.OOMKilled alone misses a child killed inside the cgroup.
        let oom = Arc::new(AtomicBool::new(false));
        let oom_watch = {
            let docker = self.docker.clone();
            let oom = oom.clone();
            let filters: HashMap<&str, Vec<String>> = HashMap::from([
                ("type", vec!["container".to_owned()]),
                ("event", vec!["oom".to_owned()]),
                ("container", vec![id.to_owned()]),
            ]);
            let opts = EventsOptionsBuilder::new().filters(&filters).build();
            tokio::spawn(async move {
                let mut events = docker.events(Some(opts));
                while let Some(ev) = events.next().await {
                    if ev.is_ok() {
                        oom.store(true, Ordering::SeqCst);
                    }
                }
            })
        };

        // Attach before start, so no output is missed.
        let attach = self
            .docker
            .attach_container(id, Some(attach_options()))
            .await;
        let attach = match attach {
            Ok(a) => a,
            Err(e) => {
                oom_watch.abort();
                return engine_error(format!("attaching to the container failed: {e}"));
            }
        };
        if let Some(stopped) = super::stopped_before_start(&stop) {
            oom_watch.abort();
            return stopped;
        }
        // Past the watchdog's deadline (this runtime froze during the create): the attempt may
        // be another's by now. The watchdog would not start the agent either.
        if *spec.watchdog.borrow() <= std::time::Instant::now() {
            oom_watch.abort();
            return RawExit {
                stopped_by: Some(StopReason::LeaseLost),
                ..RawExit::default()
            };
        }
        if let Err(e) = self.docker.start_container(id, None).await {
            oom_watch.abort();
            return if is_refusal(&e) {
                RawExit {
                    start_error: Some(format!("the container would not start: {e}")),
                    ..RawExit::default()
                }
            } else {
                engine_error(format!("starting the container failed: {e}"))
            };
        }
        let _ = out.send(Output::Started).await;
        let feeder = tokio::spawn(feed(attach.input, input, spec.watchdog.clone()));
        let mut output = attach.output;
        let pump = tokio::spawn(async move {
            while let Some(item) = output.next().await {
                let chunk = match item {
                    Ok(LogOutput::StdOut { message }) | Ok(LogOutput::Console { message }) => {
                        Output::Stdout(message)
                    }
                    Ok(LogOutput::StdErr { message }) => Output::Stderr(message),
                    Ok(LogOutput::StdIn { .. }) => continue,
                    Err(e) => {
                        debug!(error = %e, "attach stream ended");
                        break;
                    }
                };
                if out.send(chunk).await.is_err() {
                    break;
                }
            }
        });

        let (wait_code, stopped_by) = self.wait_exit(id, spec, &mut stop).await;
        // The attach stream can stay open after exit: drain briefly, then let go.
        if tokio::time::timeout(Duration::from_secs(2), pump)
            .await
            .is_err()
        {
            debug!("attach stream still open after exit");
        }
        feeder.abort();
        let inspected = self.docker.inspect_container(id, None).await;
        // The oom event may trail the exit; only a SIGKILL death (137) can be an OOM kill, so
        // only then is it worth waiting for.
        if wait_code == Some(137) && !oom.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        oom_watch.abort();
        let (state_code, oom_killed) = match &inspected {
            Ok(info) => {
                let state = info.state.as_ref();
                // A container still running has an exit code of 0: never an exit.
                let exited = state.and_then(|s| s.running) == Some(false);
                (
                    state.and_then(|s| s.exit_code).filter(|_| exited),
                    state.and_then(|s| s.oom_killed).unwrap_or(false),
                )
            }
            Err(_) => (None, false),
        };
        let exit_code = wait_code.or(state_code);
        // The watchdog stopped the agent: this runner did not renew the lease in time (it was
        // frozen, or too slow to reach NATS), so the attempt is not its own any more.
        let stopped_by = match (stopped_by, exit_code) {
            (None, Some(code)) if code == i64::from(turnpike_agent_init::EXIT_WATCHDOG) => {
                warn!("the watchdog stopped the agent: the lease was not renewed in time");
                Some(StopReason::LeaseLost)
            }
            (by, _) => by,
        };
        if exit_code.is_none() {
            return RawExit {
                stopped_by,
                ..engine_error(match inspected {
                    Err(e) => format!("lost track of the container: {e}"),
                    Ok(_) => "the engine reported no exit code".to_owned(),
                })
            };
        }
        RawExit {
            exit_code,
            signal: None,
            oom_killed: oom_killed || oom.load(Ordering::SeqCst),
            stopped_by,
            ..RawExit::default()
        }
    }
}

impl DockerBackend {
    /// Wait for the container to exit, stopping it when a stop is asked for; its exit code
    /// (`None`: the engine lost track of it) and who stopped it. A wait that ends without an
    /// exit (the engine restarted, the socket dropped, a time-out) never counts as one: the
    /// engine is asked whether the container still runs, and if it does, it is waited for
    /// again.
    async fn wait_exit(
        &self,
        id: &str,
        spec: &RunSpec,
        stop: &mut watch::Receiver<Option<StopReason>>,
    ) -> (Option<i64>, Option<StopReason>) {
        let mut stopped_by = None;
        let mut waits_lost = 0u32;
        let mut pauses = turnpike_core::backoff::Backoff::doubling(
            Duration::from_millis(200),
            Duration::from_secs(5),
        );
        loop {
            let mut wait = self.docker.wait_container(id, None::<WaitContainerOptions>);
            let waited = tokio::select! {
                w = wait.next() => w,
                reason = wait_stop(stop), if stopped_by.is_none() => {
                    stopped_by = Some(reason);
                    let grace = if reason.is_urgent() { 0 } else { spec.stop_grace.as_secs().clamp(1, i32::MAX as u64) as i32 };
                    let opts = StopContainerOptionsBuilder::new().t(grace).build();
                    if let Err(e) = self.docker.stop_container(id, Some(opts)).await {
                        warn!(error = %e, "stopping the container failed; killing it");
                        let _ = self.docker.kill_container(id, None).await;
                    }
                    wait.next().await
                }
            };
            let lost = match waited {
                Some(Ok(r)) => return (Some(r.status_code), stopped_by),
                // A non-zero exit is reported as this error: it is a result, not a failure.
                Some(Err(DockerError::DockerContainerWaitError { code, .. })) => {
                    return (Some(code), stopped_by)
                }
                Some(Err(e)) => e.to_string(),
                None => "the wait ended without an exit".to_owned(),
            };
            // Did it exit, or does it still run?
            match self.docker.inspect_container(id, None).await {
                Ok(info) => {
                    let state = info.state.unwrap_or_default();
                    if state.running == Some(false) {
                        return (state.exit_code, stopped_by);
                    }
                    warn!(error = %lost, "the wait for the container ended while it still runs; waiting again");
                }
                Err(e) => {
                    warn!(error = %lost, inspect = %e, "the wait for the container failed, and so did asking about it")
                }
            }
            waits_lost += 1;
            if waits_lost >= WAITS_LOST_MAX {
                return (None, stopped_by);
            }
            tokio::time::sleep(pauses.wait()).await;
        }
    }
}

/// Waits that may end without an exit before the engine is taken to have lost the container
/// (about five minutes of a failing engine, between waits that back off to 5 s).
const WAITS_LOST_MAX: u32 = 60;

fn engine_error(message: String) -> RawExit {
    RawExit {
        engine_error: Some(message),
        ..RawExit::default()
    }
}

fn is_status(e: &DockerError, code: u16) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if *status_code == code)
}

/// The engine answered and said no (missing image, bad config): a retry cannot fix it. Transport
/// errors and 5xx other than a start refusal are engine failures (retryable deaths).
fn is_refusal(e: &DockerError) -> bool {
    match e {
        DockerError::DockerResponseServerError {
            status_code,
            message,
        } => {
            (400..500).contains(status_code)
                // The engine reports an entrypoint it cannot exec as a 500 on start.
                || (*status_code == 500
                    && (message.contains("executable file not found")
                        || message.contains("no such file or directory")
                        || message.contains("exec format error")
                        || message.contains("permission denied")))
        }
        _ => false,
    }
}

/// Where the watchdog binary lies in `agent_init_image`.
const INIT_IN_IMAGE: &str = "/turnpike-agent-init";
/// The watchdog is small (a static binary of a few hundred KiB); anything far larger is not it.
const INIT_MAX_BYTES: u64 = 16 << 20;

/// Read the watchdog binary out of `image`, by exporting the image (`docker save`): no
/// container is made, so a runner killed meanwhile, or an engine refusing removals, leaves
/// nothing behind. The export is a tar of tars (one per layer, as `<id>/layer.tar` or OCI
/// `blobs/sha256/<digest>`, uncompressed either way); the file is looked for in each layer.
async fn load_init(docker: &Docker, image: &str) -> Result<bytes::Bytes, BackendError> {
    let missing = |detail: String| BackendError::InitImage {
        image: image.to_owned(),
        detail,
    };
    // The image holds the binary and little else; anything far larger is not that image.
    let limit = INIT_MAX_BYTES * 4;
    let mut export = Vec::new();
    let mut stream = docker.export_image(image);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| missing(e.to_string()))?;
        if (export.len() + chunk.len()) as u64 > limit {
            return Err(missing(format!("the image is larger than {limit} bytes")));
        }
        export.extend_from_slice(&chunk);
    }
    let wanted = INIT_IN_IMAGE.trim_start_matches('/');
    let mut outer = tar::Archive::new(&export[..]);
    let entries = outer.entries().map_err(|e| missing(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| missing(e.to_string()))?;
        if entry.header().entry_type() != tar::EntryType::Regular || entry.size() == 0 {
            continue;
        }
        let mut layer = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut layer).map_err(|e| missing(e.to_string()))?;
        // Manifests and configs are JSON, not tars: skip whatever does not read as one.
        let mut files = tar::Archive::new(&layer[..]);
        let Ok(files) = files.entries() else { continue };
        for file in files.flatten() {
            let mut file = file;
            let is_it = file
                .path()
                .is_ok_and(|p| p.to_string_lossy().trim_start_matches("./") == wanted);
            if !is_it {
                continue;
            }
            let mut init = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut init).map_err(|e| missing(e.to_string()))?;
            if !init.starts_with(b"\x7fELF") {
                return Err(missing(format!("{INIT_IN_IMAGE} is not an executable")));
            }
            return Ok(bytes::Bytes::from(init));
        }
    }
    Err(missing(format!("{INIT_IN_IMAGE} is not in the image")))
}

/// Write the input document, then a heartbeat each time the watchdog's deadline moves (each
/// lease renewal), until the run is over (the task is aborted) or the deadline's sender is gone
/// (the watchdog then stops the agent at the last deadline it heard).
async fn feed(
    mut stdin: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    input: Vec<u8>,
    mut deadline: watch::Receiver<std::time::Instant>,
) {
    use turnpike_agent_init::{beat, header};
    let mut first = header(input.len());
    first.extend_from_slice(&input);
    loop {
        let until = *deadline.borrow_and_update();
        first.extend(beat(
            until.saturating_duration_since(std::time::Instant::now()),
        ));
        if stdin.write_all(&first).await.is_err() || stdin.flush().await.is_err() {
            // The container is gone or going; its watchdog needs nothing more.
            return;
        }
        first.clear();
        if deadline.changed().await.is_err() {
            return;
        }
    }
}

/// A tar archive for the run's volume: `init` (the watchdog, executable by any user) and
/// `attachments/<name>` per attachment (readable by any user), packed from memory and the
/// spooled files into an unnamed temporary file and streamed from there: never more than a
/// buffer of the attachments in memory.
async fn run_dir_tar(
    init: bytes::Bytes,
    files: Vec<crate::attachments::Spooled>,
) -> std::io::Result<tokio::fs::File> {
    let tar = tokio::task::spawn_blocking(move || {
        let mut builder = tar::Builder::new(tempfile::tempfile()?);
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o555);
        h.set_size(init.len() as u64);
        h.set_cksum();
        builder.append_data(&mut h, "init", &init[..])?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_cksum();
        builder.append_data(&mut h, "attachments/", std::io::empty())?;
        for a in &files {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(a.len);
            h.set_cksum();
            builder.append_data(
                &mut h,
                format!("attachments/{}", a.name),
                std::fs::File::open(&a.path)?,
            )?;
        }
        let mut file = builder.into_inner()?;
        std::io::Seek::rewind(&mut file)?;
        Ok::<_, std::io::Error>(file)
    })
    .await
    .map_err(std::io::Error::other)??;
    Ok(tokio::fs::File::from_std(tar))
}
