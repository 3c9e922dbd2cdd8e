//! One attempt's container: created, fed, started, watched until it exits or is stopped, removed.

use super::super::{Output, RunSpec};
use super::image::{run_dir_tar, secrets_tar};
use super::*;
use crate::backend::process::wait_stop;
use bollard::container::LogOutput;
use bollard::errors::Error as DockerError;
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, EventsOptionsBuilder, StopContainerOptionsBuilder,
    UploadToContainerOptionsBuilder, WaitContainerOptions,
};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, watch};
use tokio_util::task::AbortOnDropHandle;
use tracing::{debug, warn};
use turnpike_core::exit::{RawExit, StopReason};
use turnpike_core::wire::AgentInput;

impl DockerBackend {
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
        let input = match serde_json::to_vec(&AgentInput::from_work(work, paths, spec.deadline)) {
            Ok(i) => i,
            Err(e) => return engine_error(format!("cannot encode the input document: {e}")),
        };
        let command = match self.agent_command(&spec.profile.agent_image).await {
            Ok(Ok(c)) => c,
            Ok(Err(refused)) => {
                return RawExit {
                    start_error: Some(refused),
                    ..RawExit::default()
                }
            }
            Err(e) => return engine_error(format!("inspecting the agent image failed: {e}")),
        };
        let egress = if spec.profile.egress_allow.is_empty() {
            None
        } else {
            match self.egress_up(&name, &spec.profile).await {
                Ok(e) => Some(e),
                Err(raw) => return raw,
            }
        };
        let raw = self.run_named(spec, &name, command, input, out, stop).await;
        if let Some(egress) = egress {
            self.egress_down(&egress, true).await;
        }
        raw
    }

    /// Create the container `name`, run it, remove it.
    async fn run_named(
        &self,
        spec: &RunSpec,
        name: &str,
        command: Vec<String>,
        input: Vec<u8>,
        out: mpsc::Sender<Output>,
        stop: watch::Receiver<Option<StopReason>>,
    ) -> RawExit {
        let work = &spec.work;
        let first = spec
            .watchdog
            .borrow()
            .saturating_duration_since(std::time::Instant::now());
        let body = self.container.body(
            work,
            &spec.profile,
            spec.deadline,
            Some(watchdog_command(first, command)),
        );
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptionsBuilder::new().name(name).build()),
                body,
            )
            .await;
        let id = match created {
            Ok(c) => c.id,
            Err(e) if is_refusal(&e) => {
                return RawExit {
                    start_error: Some(format!(
                        "cannot create the container from image {:?}: {e}",
                        spec.profile.agent_image
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

    /// A created container's run, in its phases: fill (the watchdog and attachments copied
    /// in), start (attached first, so no output is missed), watch (until it exits or is
    /// stopped), collect (how it ended, as the engine tells it).
    async fn run_created(
        &self,
        id: &str,
        spec: &RunSpec,
        input: Vec<u8>,
        out: mpsc::Sender<Output>,
        mut stop: watch::Receiver<Option<StopReason>>,
    ) -> RawExit {
        if let Err(raw) = self.fill(id, spec).await {
            return raw;
        }
        // The engine's oom event: State.OOMKilled alone misses a child killed inside the cgroup.
        let oom = Arc::new(AtomicBool::new(false));
        let _oom_watch = AbortOnDropHandle::new(self.watch_oom(id, oom.clone()));
        let attach = match self.start(id, spec, &stop).await {
            Ok(attach) => attach,
            Err(raw) => return raw,
        };
        let _ = out.send(Output::Started).await;
        let feeder = tokio::spawn(feed(attach.input, input, spec.watchdog.clone()));
        let pump = tokio::spawn(pump(attach.output, out));
        let (wait_code, stopped_by) = self.wait_exit(id, spec, &mut stop).await;
        // The attach stream can stay open after exit: drain briefly, then let go.
        if tokio::time::timeout(Duration::from_secs(2), pump)
            .await
            .is_err()
        {
            debug!("attach stream still open after exit");
        }
        feeder.abort();
        let raw = self.collect(id, wait_code, stopped_by, &oom).await;
        if let Some(dir) = &spec.workspace {
            self.read_back_workspace(id, dir, spec, &raw).await;
        }
        raw
    }

    /// After a clean exit, the run's workspace back into the runner's copy (the attempt then
    /// stores it); after any other end, or when it cannot be read back whole within its limit,
    /// the copy is removed: nothing of this run is saved.
    async fn read_back_workspace(
        &self,
        id: &str,
        dir: &std::path::Path,
        spec: &RunSpec,
        raw: &RawExit,
    ) {
        let clean = raw.exit_code == Some(0) && raw.stopped_by.is_none();
        let read = if clean {
            self.download_workspace(id, dir, spec.profile.workspace_max_bytes.0)
                .await
        } else {
            Err("the run did not end cleanly".to_owned())
        };
        if let Err(why) = read {
            if clean {
                warn!(why, "the run's workspace cannot be read back: not saved");
            }
            let dir = dir.to_path_buf();
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
        }
    }

    async fn download_workspace(
        &self,
        id: &str,
        dir: &std::path::Path,
        max: u64,
    ) -> Result<(), String> {
        use bollard::query_parameters::DownloadFromContainerOptionsBuilder;
        let opts = DownloadFromContainerOptionsBuilder::new()
            .path(&format!("{RUN_DIR}/workspace"))
            .build();
        let mut stream = self.docker.download_from_container(id, Some(opts));
        // The tar adds headers and padding to what the files hold.
        let cap = max.saturating_add(max / 8).saturating_add(1 << 20);
        let mut tar = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| e.to_string())?;
            tar.extend_from_slice(&chunk);
            if tar.len() as u64 > cap {
                return Err(format!("over its limit of {max} bytes"));
            }
        }
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || replace_with(&tar, &dir))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// Copy the watchdog and the attachments into the container's run directory, and its
    /// secrets into their own (readable by the agent's user only).
    async fn fill(&self, id: &str, spec: &RunSpec) -> Result<(), RawExit> {
        if !spec.secrets.is_empty() {
            let tar = secrets_tar(&spec.secrets, self.container.uid())
                .map_err(|e| engine_error(format!("cannot pack the secrets: {}", e.kind())))?;
            let opts = UploadToContainerOptionsBuilder::new()
                .path(SECRETS_DIR)
                .build();
            self.docker
                .upload_to_container(id, Some(opts), bollard::body_full(tar.into()))
                .await
                // The engine's words, never the bytes sent.
                .map_err(|e| {
                    engine_error(format!(
                        "copying the secrets into the container failed: {e}"
                    ))
                })?;
        }
        let workspace = spec
            .workspace
            .clone()
            .map(|dir| (dir, self.container.uid()));
        let tar = run_dir_tar(self.init.clone(), spec.attachments.clone(), workspace)
            .await
            .map_err(|e| engine_error(format!("cannot pack the watchdog and attachments: {e}")))?;
        let opts = UploadToContainerOptionsBuilder::new().path(RUN_DIR).build();
        let body = bollard::body_try_stream(tokio_util::io::ReaderStream::new(tar));
        self.docker
            .upload_to_container(id, Some(opts), body)
            .await
            .map_err(|e| {
                engine_error(format!(
                    "copying the watchdog and attachments into the container failed: {e}"
                ))
            })
    }

    /// Set `oom` when the engine reports the container's cgroup killed a process for memory.
    fn watch_oom(&self, id: &str, oom: Arc<AtomicBool>) -> tokio::task::JoinHandle<()> {
        let docker = self.docker.clone();
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
    }

    /// Attach, then start the container, unless the attempt was stopped meanwhile or is past
    /// its watchdog's deadline.
    async fn start(
        &self,
        id: &str,
        spec: &RunSpec,
        stop: &watch::Receiver<Option<StopReason>>,
    ) -> Result<bollard::container::AttachContainerResults, RawExit> {
        let attach = self
            .docker
            .attach_container(id, Some(attach_options()))
            .await
            .map_err(|e| engine_error(format!("attaching to the container failed: {e}")))?;
        if let Some(stopped) = super::super::stopped_before_start(stop) {
            return Err(stopped);
        }
        // Past the watchdog's deadline (this runtime froze during the create): the attempt may
        // be another's by now. The watchdog would not start the agent either.
        if *spec.watchdog.borrow() <= std::time::Instant::now() {
            return Err(RawExit {
                stopped_by: Some(StopReason::LeaseLost),
                ..RawExit::default()
            });
        }
        match self.docker.start_container(id, None).await {
            Ok(()) => Ok(attach),
            Err(e) if is_refusal(&e) => Err(RawExit {
                start_error: Some(format!("the container would not start: {e}")),
                ..RawExit::default()
            }),
            Err(e) => Err(engine_error(format!("starting the container failed: {e}"))),
        }
    }

    /// How the container ended: the exit code from the wait or else the engine's state, an
    /// out-of-memory kill from the state or the oom event, and the watchdog's stop named.
    async fn collect(
        &self,
        id: &str,
        wait_code: Option<i64>,
        stopped_by: Option<StopReason>,
        oom: &AtomicBool,
    ) -> RawExit {
        let inspected = self.docker.inspect_container(id, None).await;
        // The oom event may trail the exit; only a SIGKILL death (137) can be an OOM kill, so
        // only then is it worth waiting for.
        if wait_code == Some(137) && !oom.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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

/// Forward what the container writes to the attempt's output, until the stream ends.
async fn pump(
    mut output: std::pin::Pin<
        Box<dyn futures::Stream<Item = Result<LogOutput, DockerError>> + Send>,
    >,
    out: mpsc::Sender<Output>,
) {
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

pub(super) fn engine_error(message: String) -> RawExit {
    RawExit {
        engine_error: Some(message),
        ..RawExit::default()
    }
}

pub(super) fn is_status(e: &DockerError, code: u16) -> bool {
    matches!(e, DockerError::DockerResponseServerError { status_code, .. } if *status_code == code)
}

/// The engine answered and said no (missing image, bad config): a retry cannot fix it. Transport
/// errors and 5xx other than a start refusal are engine failures (retryable deaths).
pub(super) fn is_refusal(e: &DockerError) -> bool {
    match e {
        DockerError::DockerResponseServerError {
            status_code,
            message,
        } => {
            // 409 is a conflict with the container's state (being removed, a name still
            // taken): the engine's business, which a retry may find settled; every other 4xx
            // says the request itself cannot be met.
            ((400..500).contains(status_code) && *status_code != 409)
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

/// Empty `dir`, then unpack `tar` (its entries under `workspace/`) into it.
fn replace_with(tar: &[u8], dir: &std::path::Path) -> std::io::Result<()> {
    crate::workspace::clear(dir)?;
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries()? {
        let mut entry = entry?;
        let path = entry.path()?.into_owned();
        let Ok(rel) = path.strip_prefix("workspace") else {
            continue;
        };
        if rel.as_os_str().is_empty() {
            continue;
        }
        // Only plain names, and never through a link the agent made: nothing outside `dir`.
        let plain = rel
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
        let mut through_link = false;
        let mut at = dir.to_path_buf();
        for part in rel.parent().into_iter().flat_map(|p| p.components()) {
            at.push(part);
            through_link |=
                std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink());
        }
        if !plain || through_link {
            continue;
        }
        let dst = dir.join(rel);
        if let Some(parent) = dst.parent() {
            std::fs::create_dir_all(parent)?;
        }
        entry.set_preserve_permissions(false);
        entry.unpack(&dst)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_with_the_containers_state_is_no_refusal() {
        let said = |status_code: u16, message: &str| DockerError::DockerResponseServerError {
            status_code,
            message: message.to_owned(),
        };
        assert!(is_refusal(&said(404, "no such image")));
        assert!(is_refusal(&said(400, "invalid reference format")));
        assert!(is_refusal(&said(
            500,
            "exec: \"/agent\": executable file not found"
        )));
        assert!(!is_refusal(&said(
            409,
            "container is marked for removal and cannot be started"
        )));
        assert!(!is_refusal(&said(500, "the engine is busy")));
    }
}
