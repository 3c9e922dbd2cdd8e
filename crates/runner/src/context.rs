//! What every attempt of this runner shares: its connection, configuration, id and backend,
//! the attempts running, and where operator kills go.

use crate::backend::Backend;
use crate::kills;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use turnpike_config::Config;
use turnpike_core::RunnerId;
use turnpike_store::Bus;

/// One runner's shared state, held by each of its attempts, its lease loops and its reaper.
pub(crate) struct RunnerContext {
    pub(crate) bus: Bus,
    pub(crate) config: Config,
    pub(crate) id: RunnerId,
    pub(crate) backend: Backend,
    /// Cancelled when running attempts must be killed (drain grace over).
    pub(crate) hard_stop: CancellationToken,
    /// Attempts running now. Not the semaphore's count: the pull loop holds a permit while it
    /// merely waits for work.
    pub(crate) running: std::sync::atomic::AtomicU32,
    /// Work items refused (dead-lettered) since start.
    pub(crate) refused: std::sync::atomic::AtomicU64,
    /// Where operator kills go: the runs registered for them.
    pub(crate) kills: Arc<kills::Routes>,
}
