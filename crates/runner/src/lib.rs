//! A runner node: pulls turn attempts from the shared work consumer, at most `runner_slots` at a
//! time, runs each in a fresh container (Docker) or child process, lands the agent's bot messages
//! on the chat's outbound subject, and reports how each attempt ended.

pub mod attachments;
mod attempt;
pub mod backend;
mod claim;
mod context;
mod events;
mod kills;
mod land;
mod lease;
pub mod lines;
mod patience;
mod reaper;
mod retries;
mod scratch;
pub mod secrets;
mod stop;
mod workspace;

use async_nats::jetstream::consumer::PullConsumer;
use backend::{Backend, DockerBackend, ProcessBackend};
use context::RunnerContext;
use std::sync::Arc;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use turnpike_config::Config;
use turnpike_core::{subjects, RunnerId};
use turnpike_jetstream::BusError;
use turnpike_store::Bus;

#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error(transparent)]
    Bus(#[from] BusError),
    #[error("runner backend: {0}")]
    Backend(#[from] backend::BackendError),
    #[error("{0}")]
    Identity(String),
    #[error(transparent)]
    Config(#[from] turnpike_config::ConfigError),
    #[error(transparent)]
    Secret(#[from] secrets::SecretError),
}

pub struct Runner {
    ctx: Arc<RunnerContext>,
}

/// A runner's `/metrics` (on `metrics_listen`): its slots and the attempts running now.
#[derive(Clone)]
pub struct RunnerMetrics(Arc<RunnerContext>);

impl RunnerMetrics {
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        use prometheus_client::metrics::gauge::Gauge;
        let mut registry = prometheus_client::registry::Registry::with_prefix("turnpike");
        let slots = self.0.config.runner_slots;
        let running = self.0.running.load(std::sync::atomic::Ordering::Relaxed);
        for (name, help, n) in [
            ("runner_slots", "Attempts this runner runs at once", slots),
            (
                "runner_slots_in_use",
                "Attempts this runner runs now",
                running.min(slots),
            ),
        ] {
            let g = Gauge::<i64>::default();
            g.set(i64::from(n));
            registry.register(name, help, g);
        }
        let refused = prometheus_client::metrics::counter::Counter::<u64>::default();
        refused.inc_by(self.0.refused.load(std::sync::atomic::Ordering::Relaxed));
        registry.register(
            "work_refused",
            "Work items this runner refused (dead letter)",
            refused,
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// The runner id: configured, or the host name.
pub fn runner_id(config: &Config) -> RunnerId {
    match &config.runner_id {
        Some(id) => RunnerId::sanitized(id),
        None => RunnerId::sanitized(&turnpike_jetstream::host_name()),
    }
}

/// `config` as this runner connects with it. Every runner has a NATS user of its own,
/// `runner-<id>`, that may write only what names it (`deploy/nats/accounts.conf`), and its own
/// reply prefix, `_INBOX_runner.<id>` (set here unless configured). A user or prefix for
/// another id would have every event refused: refuse to start instead, saying what to set.
pub fn nats_identity(mut config: Config) -> Result<Config, RunnerError> {
    if config.nats_user.is_some() && config.nats_inbox_prefix.is_none() {
        config.nats_inbox_prefix = Some(turnpike_jetstream::accounts::runner_inbox(&runner_id(
            &config,
        )));
    }
    check_identity(&config)?;
    Ok(config)
}

fn check_identity(config: &Config) -> Result<(), RunnerError> {
    use turnpike_jetstream::accounts::{runner_inbox, runner_user};
    let Some(user) = &config.nats_user else {
        return Ok(());
    };
    let id = runner_id(config);
    if *user != runner_user(&id) {
        return Err(RunnerError::Identity(format!(
            "this runner's id is {id:?}, so its NATS user is {:?}, not {user:?}: every runner \
             has its own (set runner_id, or the user deploy/secrets.sh made for it)",
            runner_user(&id)
        )));
    }
    match &config.nats_inbox_prefix {
        Some(p) if *p != runner_inbox(&id) => Err(RunnerError::Identity(format!(
            "runner {id:?} replies on {:?} (its user may read nothing else), not {p:?}: \
             leave nats_inbox_prefix unset",
            runner_inbox(&id)
        ))),
        _ => Ok(()),
    }
}

impl Runner {
    pub fn metrics(&self) -> RunnerMetrics {
        RunnerMetrics(self.ctx.clone())
    }

    pub async fn new(bus: Bus, config: Config) -> Result<Runner, RunnerError> {
        check_identity(&config)?;
        let id = runner_id(&config);
        // Every profile's secrets readable now, or no start: better than every attempt of a
        // profile failing to start.
        if let Some(dir) = &config.secrets_dir {
            for name in config.profile_names() {
                if let Some(profile) = config.profile(Some(&name)) {
                    secrets::Secrets::read(dir, &profile.agent_secrets).await?;
                }
            }
        }
        let backend = match config.runner_backend {
            turnpike_config::Backend::Process => {
                let command = config
                    .agent_command
                    .as_deref()
                    .ok_or(backend::BackendError::NoAgentCommand)?;
                let lists: Vec<String> = config
                    .profile_names()
                    .into_iter()
                    .filter(|p| {
                        config
                            .profile(Some(p))
                            .is_some_and(|p| !p.egress_allow.is_empty())
                    })
                    .collect();
                if !lists.is_empty() {
                    tracing::warn!(
                        profiles = %lists.join(","),
                        "egress lists are advisory with the process backend: agents get the proxy, \
                         but nothing stops a direct connection (use the docker backend to enforce them)"
                    );
                }
                Backend::Process(ProcessBackend::new(command, config.scratch_dir.clone())?)
            }
            turnpike_config::Backend::Docker => {
                let mut docker = DockerBackend::connect(&config, id.clone()).await?;
                docker.set_deployment(turnpike_store::runners::deployment(&bus).await?);
                Backend::Docker(Box::new(docker))
            }
        };
        Ok(Runner {
            ctx: Arc::new(RunnerContext {
                id,
                bus,
                config,
                backend,
                hard_stop: CancellationToken::new(),
                running: std::sync::atomic::AtomicU32::new(0),
                refused: std::sync::atomic::AtomicU64::new(0),
                kills: Arc::default(),
            }),
        })
    }

    pub fn id(&self) -> &RunnerId {
        &self.ctx.id
    }

    /// Pull and run attempts until `shutdown` is cancelled; then take no new work, let running
    /// attempts finish for up to `stop_grace`, kill what is left, and return once all reported.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), RunnerError> {
        let ctx = self.ctx;
        let Some(consumer): Option<PullConsumer> = turnpike_jetstream::consume::durable_patiently(
            &ctx.bus.js,
            subjects::STREAM_WORK,
            subjects::CONSUMER_RUNNERS,
            &shutdown,
        )
        .await
        else {
            return Ok(());
        };
        // Before any work is taken: a run registers for kills before its claim, and from then
        // on this subscription hears them.
        let kills = ctx
            .bus
            .client
            .subscribe(subjects::KILL_ALL)
            .await
            .map_err(|e| BusError::kv("subscribe to operator kills", e))?;
        let kills = tokio::spawn(kills::route(ctx.kills.clone(), kills));
        let slots = Arc::new(Semaphore::new(ctx.config.runner_slots as usize));
        reap_orphans(&ctx).await;
        let presence = tokio::spawn(announce(ctx.clone()));
        let reaper_stop = CancellationToken::new();
        let reaper = tokio::spawn(reaper::run(
            ctx.clone(),
            ctx.config.lease,
            reaper_stop.clone(),
        ));
        let mut tasks = tokio::task::JoinSet::new();
        info!(runner_id = %ctx.id, slots = ctx.config.runner_slots, backend = ctx.backend.name(), "runner started");
        turnpike_jetstream::consume::each_with_slot(&consumer, slots, &shutdown, |msg, slot| {
            let ctx = ctx.clone();
            ctx.running
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tasks.spawn(async move {
                attempt::handle(ctx.clone(), msg).await;
                ctx.running
                    .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
                drop(slot);
            });
            while tasks.try_join_next().is_some() {}
        })
        .await;
        info!(running = tasks.len(), "runner draining");
        let grace = ctx.config.stop_grace;
        if tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} })
            .await
            .is_err()
        {
            warn!(
                running = tasks.len(),
                "drain grace over; stopping running attempts"
            );
            ctx.hard_stop.cancel();
            while tasks.join_next().await.is_some() {}
        }
        presence.abort();
        reaper_stop.cancel();
        let _ = reaper.await;
        kills.abort();
        // Going away: say so at once rather than letting the presence TTL run out.
        let _ = turnpike_store::runners::withdraw(&ctx.bus, &ctx.id).await;
        info!("runner stopped");
        Ok(())
    }
}

/// Remove runs an earlier life of this runner left behind and report their attempts as runner
/// lost. Idempotent: the event's dedup id is the one the attempt's own exit report would use, and
/// the coordinator ignores it if its sweep declared the attempt lost already.
async fn reap_orphans(ctx: &Arc<RunnerContext>) {
    let orphans = match ctx.backend.reap_orphans().await {
        Ok(o) => o,
        Err(e) => {
            warn!(error = %e, "could not look for runs left by an earlier life");
            return;
        }
    };
    for o in orphans {
        let (Some(turn), Some(attempt), Some(chat)) = (o.turn, o.attempt, o.chat) else {
            warn!(container = %o.container, "removed an unlabelled leftover container");
            continue;
        };
        warn!(turn_id = %turn, attempt, container = %o.container, "removed a run left by an earlier life; reporting it lost");
        events::report_orphan(ctx, turn, chat, attempt).await;
    }
}

/// Keep this runner's presence (id, host, slots, slots in use, version) fresh in the runners
/// bucket; the TTL removes it if the runner dies.
async fn announce(ctx: Arc<RunnerContext>) {
    let ttl = ctx.config.lease * 2;
    loop {
        let total = ctx.config.runner_slots;
        let presence = turnpike_core::wire::RunnerPresence {
            v: turnpike_core::FORMAT_VERSION,
            runner: ctx.id.clone(),
            host: turnpike_jetstream::host_name(),
            backend: ctx.backend.name().to_owned(),
            slots: total,
            slots_in_use: ctx
                .running
                .load(std::sync::atomic::Ordering::Relaxed)
                .min(total),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            at: turnpike_jetstream::now(),
        };
        if let Err(e) = turnpike_store::runners::announce(&ctx.bus, &presence, ttl).await {
            warn!(error = %e, "presence not refreshed");
        }
        tokio::time::sleep(ctx.config.heartbeat).await;
    }
}
