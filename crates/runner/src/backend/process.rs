//! The process backend: one child process per attempt, for machines without Docker and for fast
//! tests. Memory is bounded with `RLIMIT_AS`: no cgroup kills the agent, its allocation fails and
//! its runtime dies in its own way; where the agent's last words say so (see
//! [`ran_out_of_memory`]), the death is named out of memory, as Docker's OOM kill is. Time is
//! bounded by the runner's stop request, and the whole process group is killed at the end so no
//! grandchild outlives its attempt.

use super::{tree, BackendError, Output, RunSpec};
use crate::scratch::AttemptDir;
use bytes::Bytes;
use rustix::process::Signal;
use rustix::process::{kill_process_group, prlimit, Pid, Resource, Rlimit};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;
use tokio::sync::{mpsc, watch};
use tracing::warn;
use turnpike_core::exit::{RawExit, StopReason};
use turnpike_core::wire::AgentInput;

pub struct ProcessBackend {
    argv: Vec<String>,
    /// Parent of the attempts' working directories; `None` for the system's temporary directory.
    scratch: Option<PathBuf>,
    /// This runner, as its runs' processes are tagged ([`tree::RUN_TAG`]).
    instance: tree::Instance,
}

impl ProcessBackend {
    /// `command` is split on white space: program, then arguments. `scratch` is where each
    /// attempt's fresh working directory is made (`scratch_dir`), checked here so that a typo
    /// fails the runner at start rather than every attempt.
    pub fn new(command: &str, scratch: Option<PathBuf>) -> Result<Self, BackendError> {
        let argv: Vec<String> = command.split_whitespace().map(str::to_owned).collect();
        if argv.is_empty() {
            return Err(BackendError::EmptyAgentCommand);
        }
        if let Some(dir) = &scratch {
            if !dir.is_dir() {
                return Err(BackendError::ScratchDir(dir.clone()));
            }
        }
        Ok(ProcessBackend {
            argv,
            scratch,
            instance: tree::Instance::new(),
        })
    }

    /// This runner, as its runs' processes are tagged.
    pub fn instance(&self) -> &tree::Instance {
        &self.instance
    }

    /// Run one attempt, in its phases: create (a fresh directory with the attachments, the
    /// input document, the command), start (spawn, then the memory limit), watch (until it
    /// exits or is stopped), collect (its output settled, how it ended).
    pub async fn run(
        &self,
        spec: &RunSpec,
        out: mpsc::Sender<Output>,
        mut stop: watch::Receiver<Option<StopReason>>,
    ) -> RawExit {
        let created = match self.create(spec).await {
            Ok(c) => c,
            Err(raw) => return raw,
        };
        if let Some(stopped) = super::stopped_before_start(&stop) {
            return stopped;
        }
        let (mut child, pid) = match self
            .start(created.command, spec.profile.memory_limit.0)
            .await
        {
            Ok(started) => started,
            Err(raw) => return raw,
        };
        // Only now is the agent running within its limits.
        let _ = out.send(Output::Started).await;
        let input = created.input;
        let stdin = child.stdin.take();
        let feeder = tokio::spawn(async move {
            if let Some(mut stdin) = stdin {
                // An agent that exits without reading its input is not an error here.
                let _ = stdin.write_all(&input).await;
                let _ = stdin.shutdown().await;
            }
        });
        let stdout = child
            .stdout
            .take()
            .map(|s| pump(s, out.clone(), Output::Stdout));
        let stderr = child
            .stderr
            .take()
            .map(|s| pump(s, out.clone(), Output::Stderr));
        drop(out);
        let (status, stopped_by) = watch_run(&mut child, pid, &mut stop, spec.stop_grace).await;
        // Grandchildren may still hold the pipes: end the whole group, and any process of the
        // run that left it; never wait for output once the run is over.
        let _ = kill_process_group(pid, Signal::KILL);
        feeder.abort();
        let run = (
            self.instance.clone(),
            spec.work.turn.to_string(),
            spec.work.attempt,
        );
        let _ = settle(stdout, &run).await;
        let stderr_tail = settle(stderr, &run).await.unwrap_or_default();
        if let Some(egress) = created.egress {
            egress.report();
        }
        drop(created.dir);
        collect(status, stopped_by, &stderr_tail)
    }

    /// The attempt's fresh working directory (its attachments under `attachments/`), its input
    /// document, and the command that will run it there.
    async fn create(&self, spec: &RunSpec) -> Result<Created, RawExit> {
        let work = &spec.work;
        let prefix = format!("turnpike-{}-{}-", work.turn, work.attempt);
        // Directory calls block (on a journalled disk, behind I/O): keep them off the runtime's
        // workers, which also drive this runner's NATS connection and its leases.
        let dir = AttemptDir::make(self.scratch.as_deref(), &prefix, &work.turn)
            .await
            .map_err(|e| engine_error(format!("cannot create the attempt's temp dir: {e}")))?;
        let paths = place_attachments(&dir.path().join("attachments"), spec).await?;
        let secrets_dir = dir.path().join("secrets");
        place_secrets(&secrets_dir, spec).await?;
        let input = serde_json::to_vec(&AgentInput::from_work(work, paths, spec.deadline))
            .map_err(|e| engine_error(format!("cannot encode the input document: {e}")))?;
        let mut command = Command::new(&self.argv[0]);
        command
            .args(&self.argv[1..])
            .current_dir(dir.path())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", dir.path())
            .envs(&spec.profile.agent_env)
            .env("TURNPIKE_TURN", work.turn.as_str())
            .env("TURNPIKE_ATTEMPT", work.attempt.to_string())
            .env("TURNPIKE_DEADLINE", spec.deadline.to_string())
            .env("TURNPIKE_SECRETS", &secrets_dir)
            .envs(
                spec.workspace
                    .iter()
                    .map(|w| ("TURNPIKE_WORKSPACE", w.as_os_str())),
            )
            // Inherited by every process of the run, also one that leaves its process group.
            .env(
                tree::RUN_TAG,
                tree::Tag::value(&self.instance, work.turn.as_str(), work.attempt),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        for s in spec.secrets.iter() {
            if let (Some(var), Some(value)) = (&s.env, s.env_value()) {
                command.env(var, value);
            }
        }
        let egress = if spec.profile.egress_allow.is_empty() {
            None
        } else {
            Some(LocalEgress::start(&spec.profile.egress_allow, &mut command).await?)
        };
        Ok(Created {
            dir,
            input,
            command,
            egress,
        })
    }

    /// Spawn the agent and bound its memory. The agent gets its input only after the limit is
    /// in place, so its work is bounded. What its runtime maps before the limit is not: an
    /// allocator that reserves more address space than the limit at start-up (mimalloc's arena
    /// did, in the benchmarks) fails later maps at random. Setting the limit before exec needs
    /// `pre_exec` (unsafe); use Docker for real isolation.
    async fn start(
        &self,
        mut command: Command,
        memory_limit: u64,
    ) -> Result<(tokio::process::Child, Pid), RawExit> {
        let mut child = command.spawn().map_err(|e| RawExit {
            start_error: Some(format!("cannot start {:?}: {e}", self.argv[0])),
            ..RawExit::default()
        })?;
        let Some(pid) = child.id().and_then(|id| Pid::from_raw(id as i32)) else {
            return Err(engine_error(
                "the agent exited before its limits could be set".into(),
            ));
        };
        let limit = Rlimit {
            current: Some(memory_limit),
            maximum: Some(memory_limit),
        };
        if let Err(e) = prlimit(Some(pid), Resource::As, limit) {
            let _ = kill_process_group(pid, Signal::KILL);
            let _ = child.wait().await;
            return Err(engine_error(format!("cannot set the memory limit: {e}")));
        }
        Ok((child, pid))
    }
}

/// An attempt's egress proxy on loopback. Its list is applied to what goes through it; a child
/// process can still connect directly (there is no network namespace here): use Docker to
/// enforce the list.
struct LocalEgress {
    _serve: tokio_util::task::AbortOnDropHandle<()>,
    decisions: std::sync::Arc<std::sync::Mutex<Vec<turnpike_egress::Decision>>>,
}

impl LocalEgress {
    async fn start(
        allow: &turnpike_egress::Allowlist,
        command: &mut Command,
    ) -> Result<LocalEgress, RawExit> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| engine_error(format!("cannot open the egress proxy: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| engine_error(format!("cannot open the egress proxy: {e}")))?;
        let decisions = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = decisions.clone();
        let serve = tokio::spawn(turnpike_egress::serve(listener, allow.clone(), move |d| {
            if let Ok(mut log) = log.lock() {
                log.push(d);
            }
        }));
        let url = format!("http://{addr}");
        for var in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            command.env(var, &url);
        }
        Ok(LocalEgress {
            _serve: tokio_util::task::AbortOnDropHandle::new(serve),
            decisions,
        })
    }

    /// Log what it refused (an agent asking for an unlisted destination is news to its
    /// operator).
    fn report(&self) {
        let Ok(decisions) = self.decisions.lock() else {
            return;
        };
        let refused: Vec<String> = decisions
            .iter()
            .filter(|d| matches!(d, turnpike_egress::Decision::Refused { .. }))
            .map(|d| d.to_string())
            .collect();
        if !refused.is_empty() {
            tracing::info!(
                refused = refused.len(),
                destinations = %refused.join(","),
                "egress refused destinations not on the profile's list"
            );
        }
    }
}

/// What [`ProcessBackend::create`] made ready: the directory lives until the run is over.
struct Created {
    dir: AttemptDir,
    input: Vec<u8>,
    command: Command,
    egress: Option<LocalEgress>,
}

/// The attachments, under `dir` (made only if there are any); their paths as the agent sees them.
async fn place_attachments(dir: &std::path::Path, spec: &RunSpec) -> Result<Vec<String>, RawExit> {
    let mut paths = Vec::new();
    if spec.attachments.is_empty() {
        return Ok(paths);
    }
    tokio::fs::create_dir(dir)
        .await
        .map_err(|e| engine_error(format!("cannot create {}: {e}", dir.display())))?;
    for a in &spec.attachments {
        let path = dir.join(&a.name);
        // A hard link when the spool shares the file system, else a copy: never in memory.
        let placed = match tokio::fs::hard_link(&a.path, &path).await {
            Ok(()) => Ok(()),
            Err(_) => tokio::fs::copy(&a.path, &path).await.map(drop),
        };
        placed.map_err(|e| engine_error(format!("cannot place {}: {e}", path.display())))?;
        paths.push(path.to_string_lossy().into_owned());
    }
    Ok(paths)
}

/// The agent's secrets as files of `dir` (readable by their owner only), which the run's
/// directory takes away with it. An error names the file, never what it holds.
async fn place_secrets(dir: &std::path::Path, spec: &RunSpec) -> Result<(), RawExit> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if spec.secrets.is_empty() {
        return Ok(());
    }
    let (dir, secrets) = (dir.to_path_buf(), spec.secrets.clone());
    let placed = tokio::task::spawn_blocking(move || {
        std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
        for s in secrets.iter() {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o400)
                .open(dir.join(&s.name))?;
            std::io::Write::write_all(&mut file, s.value())?;
        }
        Ok::<_, std::io::Error>(())
    })
    .await
    .map_err(std::io::Error::other)
    .and_then(|r| r);
    placed.map_err(|e| engine_error(format!("cannot place the agent's secrets: {}", e.kind())))
}

/// Wait until the agent exits or a stop comes; on a stop, TERM its process group, then KILL it
/// after `grace` (none for an urgent stop). Returns how it exited and what stopped it.
async fn watch_run(
    child: &mut tokio::process::Child,
    pid: Pid,
    stop: &mut watch::Receiver<Option<StopReason>>,
    grace: std::time::Duration,
) -> (std::io::Result<ExitStatus>, Option<StopReason>) {
    tokio::select! {
        status = child.wait() => (status, None),
        reason = wait_stop(stop) => {
            let grace = if reason.is_urgent() { std::time::Duration::ZERO } else { grace };
            let _ = kill_process_group(pid, Signal::TERM);
            let status = match tokio::time::timeout(grace, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    let _ = kill_process_group(pid, Signal::KILL);
                    child.wait().await
                }
            };
            (status, Some(reason))
        }
    }
}

/// How the run ended, from its exit status and the tail of what it wrote to stderr (which tells
/// an out-of-memory death, see [`ran_out_of_memory`]).
fn collect(
    status: std::io::Result<ExitStatus>,
    stopped_by: Option<StopReason>,
    stderr_tail: &[u8],
) -> RawExit {
    match status {
        Ok(status) => {
            let mut raw = from_status(status, stopped_by);
            let died = raw.signal.is_some() || raw.exit_code.is_some_and(|c| c != 0);
            raw.oom_killed = died
                && stopped_by.is_none()
                && ran_out_of_memory(&String::from_utf8_lossy(stderr_tail));
            raw
        }
        Err(e) => {
            warn!(error = %e, "lost track of the agent process");
            RawExit {
                stopped_by,
                ..engine_error(format!("waiting for the agent failed: {e}"))
            }
        }
    }
}

/// How long a run's output may stay open once its agent and process group are gone before the
/// run's other processes (tagged, out of the group) are looked for and killed.
const OUTPUT_AFTER_EXIT: std::time::Duration = std::time::Duration::from_millis(500);
/// How long after that the output is still read before it is let go.
const OUTPUT_AFTER_KILL: std::time::Duration = std::time::Duration::from_secs(5);

/// The end of one of a run's output streams once its agent has exited: it closes when the last
/// process holding it is gone. One that stays open (a grandchild that left the process group
/// with `setsid`) gets the run's tagged processes killed; if even then it stays open (a process
/// that also dropped the tag), it is let go: the run never waits on it.
async fn settle<T: Send + 'static>(
    reader: Option<tokio::task::JoinHandle<T>>,
    (instance, turn, attempt): &(tree::Instance, String, u32),
) -> Option<T> {
    let mut reader = reader?;
    if let Ok(done) = tokio::time::timeout(OUTPUT_AFTER_EXIT, &mut reader).await {
        return done.ok();
    }
    let (instance, turn, attempt) = (instance.clone(), turn.clone(), *attempt);
    let killed = tokio::task::spawn_blocking(move || tree::kill_run(&instance, &turn, attempt))
        .await
        .unwrap_or(0);
    warn!(
        killed,
        "the agent's output stayed open after it exited: killed what of its run was left"
    );
    match tokio::time::timeout(OUTPUT_AFTER_KILL, &mut reader).await {
        Ok(done) => done.ok(),
        Err(_) => {
            warn!("the agent's output is still open; no longer read");
            reader.abort();
            None
        }
    }
}

fn engine_error(message: String) -> RawExit {
    RawExit {
        engine_error: Some(message),
        ..RawExit::default()
    }
}

fn from_status(status: ExitStatus, stopped_by: Option<StopReason>) -> RawExit {
    RawExit {
        exit_code: status.code().map(i64::from),
        signal: status.signal(),
        stopped_by,
        ..RawExit::default()
    }
}

/// Resolves when a stop is requested (at once if one already was). Never resolves if the sender
/// is gone without asking.
pub(crate) async fn wait_stop(stop: &mut watch::Receiver<Option<StopReason>>) -> StopReason {
    loop {
        if let Some(reason) = *stop.borrow_and_update() {
            return reason;
        }
        if stop.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// How much of the end of a stream [`pump`] keeps: enough for a runtime's dying words.
const TAIL: usize = 4096;

/// Forward a stream to the attempt; returns its last [`TAIL`] bytes.
fn pump<R: AsyncRead + Unpin + Send + 'static>(
    mut r: R,
    out: mpsc::Sender<Output>,
    wrap: fn(Bytes) -> Output,
) -> tokio::task::JoinHandle<Vec<u8>> {
    tokio::spawn(async move {
        let mut buf = vec![0u8; 64 * 1024];
        let mut tail = Vec::new();
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    tail.extend_from_slice(&buf[..n]);
                    if tail.len() > TAIL {
                        tail.drain(..tail.len() - TAIL);
                    }
                    if out
                        .send(wrap(Bytes::copy_from_slice(&buf[..n])))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
            }
        }
        tail
    })
}

/// Did the agent die of a failed allocation? Under `RLIMIT_AS` nothing kills it: its runtime
/// says so on stderr and then aborts or exits, each in its own words. These are the words of
/// the common ones (Rust, Go, Python, C++, Node, Java, and libc's `strerror(ENOMEM)`).
pub fn ran_out_of_memory(stderr_tail: &str) -> bool {
    const MARKERS: [&str; 6] = [
        "fatal error: runtime: out of memory",
        "MemoryError",
        "std::bad_alloc",
        "JavaScript heap out of memory",
        "java.lang.OutOfMemoryError",
        "Cannot allocate memory",
    ];
    let rust = stderr_tail
        .lines()
        .any(|l| l.contains("memory allocation of ") && l.contains(" failed"));
    rust || MARKERS.iter().any(|m| stderr_tail.contains(m))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run whose stop came before its agent started (a lease deadline passed during a slow
    /// set-up, a kill) reports the stop and never starts the agent: it would otherwise run beside
    /// the attempt that replaced it until the stop caught up.
    #[tokio::test]
    async fn a_run_stopped_before_its_agent_starts_never_starts_it() {
        let dir = tempfile::tempdir().expect("temp dir");
        let marker = dir.path().join("ran");
        // The agent leaves a file if it ever runs.
        let script = dir.path().join("agent.sh");
        std::fs::write(&script, format!("#!/bin/sh\ntouch {}\n", marker.display()))
            .expect("write agent");
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod agent");
        let backend =
            ProcessBackend::new(&script.display().to_string(), None).expect("process backend");
        let chat = turnpike_core::ChatId::new("c").expect("chat id");
        let message = turnpike_core::wire::InboundMessage::new(chat.clone(), "m", "hi", None);
        let spec = RunSpec {
            workspace: None,
            work: turnpike_core::wire::WorkItem {
                workspace: None,
                v: turnpike_core::FORMAT_VERSION,
                turn: message.turn(),
                chat,
                attempt: 1,
                max_attempts: 3,
                message,
                history: Vec::new(),
                profile: None,
            },
            attachments: Vec::new(),
            profile: turnpike_config::Config::default()
                .profile(None)
                .expect("the default profile"),
            deadline: turnpike_jetstream::now(),
            secrets: Default::default(),
            stop_grace: std::time::Duration::from_secs(1),
            watchdog: watch::channel(std::time::Instant::now()).1,
        };
        let (out_tx, mut out_rx) = mpsc::channel(8);
        let (stop_tx, stop_rx) = watch::channel(None);
        stop_tx.send_replace(Some(StopReason::LeaseLost));

        let raw = backend.run(&spec, out_tx, stop_rx).await;

        assert_eq!(raw.stopped_by, Some(StopReason::LeaseLost));
        assert_eq!(raw.exit_code, None, "{raw:?}");
        let mut outputs = Vec::new();
        while let Some(o) = out_rx.recv().await {
            outputs.push(o);
        }
        assert!(outputs.is_empty(), "the agent started: {outputs:?}");
        assert!(!marker.exists(), "the agent ran");
    }

    #[test]
    fn dying_words_of_a_failed_allocation_name_it() {
        for words in [
            "memory allocation of 16777216 bytes failed\n",
            "fatal error: runtime: out of memory\n\ngoroutine 1 [running]:",
            "Traceback (most recent call last):\n  File \"a.py\", line 1\nMemoryError\n",
            "terminate called after throwing an instance of 'std::bad_alloc'\n",
            "FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory",
            "Exception in thread \"main\" java.lang.OutOfMemoryError: Java heap space",
            "mmap: Cannot allocate memory",
        ] {
            assert!(ran_out_of_memory(words), "{words}");
        }
        for words in [
            "",
            "thread 'main' panicked at src/main.rs:3:5:\nindex out of bounds",
            "Segmentation fault",
            "allocation of memory went fine",
            "retrying: the cache is out of memory budget",
        ] {
            assert!(!ran_out_of_memory(words), "{words}");
        }
    }

    #[test]
    fn a_scratch_dir_that_is_not_a_directory_fails_at_start_naming_the_setting() {
        let file = tempfile::NamedTempFile::new().expect("temp file");
        for bad in [file.path().to_path_buf(), file.path().join("missing")] {
            let err = ProcessBackend::new("agent", Some(bad.clone()))
                .err()
                .expect("refused")
                .to_string();
            assert!(err.contains("scratch_dir"), "{err}");
            assert!(err.contains(&bad.display().to_string()), "{err}");
        }
        assert!(ProcessBackend::new("agent", Some(std::env::temp_dir())).is_ok());
        assert!(ProcessBackend::new("agent", None).is_ok());
    }
}
