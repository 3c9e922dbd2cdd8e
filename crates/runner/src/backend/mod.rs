//! Where an attempt's agent runs. Both backends take the same [`RunSpec`], stream the agent's
//! output as raw chunks, honour stop requests (polite stop, grace, kill) and report a [`RawExit`];
//! classification is shared ([`crate::classify`]).

mod docker;
mod process;
pub mod tree;

pub use docker::{
    attach_options, watchdog_command, Container, ContainerSettings, DockerBackend, Orphan,
    ATTACHMENT_DIR, INIT_PATH, LABEL_ATTEMPT, LABEL_CHAT, LABEL_INSTANCE, LABEL_MANAGED,
    LABEL_RUNNER, LABEL_TURN, RUN_DIR,
};
pub use process::ProcessBackend;

use bytes::Bytes;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use turnpike_core::exit::{RawExit, StopReason};
use turnpike_core::wire::WorkItem;

/// One attempt to run.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub work: WorkItem,
    /// Attachment files, spooled on disk, with the names the agent sees.
    pub attachments: Vec<crate::attachments::Spooled>,
    /// The resource profile it runs with (image, limits, network, secrets' names).
    pub profile: turnpike_config::Profile,
    /// When the run's time limit stops it (this host's clock): the agent is told, to post a
    /// summary before then.
    pub deadline: turnpike_core::Timestamp,
    /// The agent's secrets: files, and variables where asked.
    pub secrets: crate::secrets::Secrets,
    /// The attempt's copy of its chat's workspace (a directory on the runner), if its profile
    /// gives one: the agent's `$TURNPIKE_WORKSPACE`, read back after the run.
    pub workspace: Option<std::path::PathBuf>,
    pub stop_grace: Duration,
    /// When the agent must be stopped if the runner cannot stop it itself (frozen, cut off):
    /// moved on by each lease renewal. The docker backend's watchdog enforces it inside the
    /// container.
    pub watchdog: watch::Receiver<std::time::Instant>,
}

#[derive(Debug)]
pub enum Output {
    /// The agent is running (its process or container has started): sent once, before output.
    Started,
    Stdout(Bytes),
    Stderr(Bytes),
}

pub enum Backend {
    Docker(Box<DockerBackend>),
    Process(ProcessBackend),
}

/// Why a backend could not be set up, or could not list its runs.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("the process backend needs agent_command (TURNPIKE_AGENT_COMMAND)")]
    NoAgentCommand,
    #[error("agent_command is empty; set TURNPIKE_AGENT_COMMAND to the agent's command line")]
    EmptyAgentCommand,
    #[error("scratch_dir {} is not a directory (TURNPIKE_SCRATCH_DIR)", .0.display())]
    ScratchDir(std::path::PathBuf),
    #[error("cannot connect to the Docker Engine: {0}")]
    DockerConnect(#[source] bollard::errors::Error),
    #[error(
        "cannot talk to the Docker Engine (is it running, and may this user use its socket?): {0}"
    )]
    DockerUnreachable(#[source] bollard::errors::Error),
    #[error("cannot read the agent watchdog from image {image:?} (agent_init_image; build it with deploy/build-images.sh): {detail}")]
    InitImage { image: String, detail: String },
    #[error("a profile has an egress list (egress_allow) but the proxy image {image:?} is not there (egress_proxy_image; build it with deploy/build-images.sh): {detail}")]
    ProxyImage { image: String, detail: String },
    #[error("the Docker Engine failed to {what}: {source}")]
    Docker {
        what: &'static str,
        #[source]
        source: bollard::errors::Error,
    },
}

impl Backend {
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Docker(_) => "docker",
            Backend::Process(_) => "process",
        }
    }

    /// Run to the end. Output goes to `out` (dropped when the run is over); a value on `stop`
    /// stops the run: polite stop, `stop_grace`, then kill.
    pub async fn run(
        &self,
        spec: &RunSpec,
        out: mpsc::Sender<Output>,
        stop: watch::Receiver<Option<StopReason>>,
    ) -> RawExit {
        match self {
            Backend::Docker(d) => d.run(spec, out, stop).await,
            Backend::Process(p) => p.run(spec, out, stop).await,
        }
    }

    /// Remove runs left by an earlier life of this runner; the attempts they belonged to.
    pub async fn reap_orphans(&self) -> Result<Vec<Orphan>, BackendError> {
        match self {
            Backend::Docker(d) => d.reap_orphans().await,
            // A child process dies with its runner (kill_on_drop, own process group).
            Backend::Process(_) => Ok(Vec::new()),
        }
    }
}

/// A run stopped before its agent started (its lease deadline passed during a slow create, a
/// kill, the time limit) never starts it: the agent would run beside the attempt that replaced
/// it until the stop caught up. Checked by each backend as the last step before the start.
pub(crate) fn stopped_before_start(stop: &watch::Receiver<Option<StopReason>>) -> Option<RawExit> {
    let reason = (*stop.borrow())?;
    Some(RawExit {
        stopped_by: Some(reason),
        ..RawExit::default()
    })
}
