//! The coordinator: applies runner events to turn records through the core lifecycle, with
//! compare-and-set on the `turnpike_turns` bucket, and carries out what the lifecycle decides
//! (retries scheduled by JetStream, notices, errored flags). It keeps nothing that matters in
//! memory; any number of coordinators may run at once.

use async_nats::jetstream::AckKind;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};
use turnpike_config::Config;
use turnpike_core::lifecycle::Event;
use turnpike_core::subjects;
use turnpike_core::wire::{ClaimHolder, RunnerEvent, RunnerEventKind};
use turnpike_core::RunnerId;
use turnpike_jetstream::{decode, Bus, BusError};
use turnpike_store::turns::{self, Applied, ApplyError};

/// Events applied at once by one coordinator (events of one turn may race; CAS sorts them out).
const IN_FLIGHT: usize = 32;

pub mod counters;
pub mod ops;
mod recent;
pub mod sweep;

pub mod metrics;
pub use counters::{Counters, CountersSnapshot};

/// Claims this coordinator has checked, by key: a claim never changes once created, so one leader
/// read per attempt serves all of its events. Bounded; only saves reads, decides nothing.
#[derive(Default)]
struct ClaimCache(std::sync::Mutex<std::collections::HashMap<String, RunnerId>>);

const CLAIM_CACHE: usize = 4096;

impl ClaimCache {
    /// Is `ev` from the runner that holds its attempt's claim?
    async fn check(&self, bus: &Bus, ev: &RunnerEvent) -> Result<(), ApplyError> {
        let key = subjects::claim_key(&ev.turn, ev.attempt);
        let cached = self.0.lock().ok().and_then(|c| c.get(&key).cloned());
        if cached.as_ref() == Some(&ev.runner) {
            return Ok(());
        }
        let holder = turnpike_store::claims::holder(bus, &ev.turn, ev.attempt).await?;
        match holder {
            Some(ClaimHolder::Runner { runner }) if runner == ev.runner => {
                if let Ok(mut c) = self.0.lock() {
                    if c.len() >= CLAIM_CACHE {
                        c.clear();
                    }
                    c.insert(key, runner);
                }
                Ok(())
            }
            // Only on refusal: an event for a turn that does not exist says so.
            None if turns::load(bus, &ev.turn).await?.is_none() => {
                Err(ApplyError::UnknownTurn(ev.turn.clone()))
            }
            other => Err(ApplyError::NotClaimant {
                turn: ev.turn.clone(),
                attempt: ev.attempt,
                runner: ev.runner.clone(),
                holder: match other {
                    Some(ClaimHolder::Runner { runner }) => format!("held by runner {runner}"),
                    Some(ClaimHolder::Cancelled) => "cancelled".to_owned(),
                    None => "not taken".to_owned(),
                },
            }),
        }
    }
}

pub struct Coordinator {
    /// Shared by every in-flight event: a `Bus` holds a dozen stream handles, and cloning one
    /// per event showed up in the benchmark's profile.
    bus: Arc<Bus>,
    config: Config,
    counters: Arc<Counters>,
    claims: Arc<ClaimCache>,
    recent: Arc<recent::Recent>,
}

impl Coordinator {
    pub fn new(bus: Bus, config: &Config) -> Self {
        Coordinator {
            bus: Arc::new(bus),
            config: config.clone(),
            counters: Arc::new(Counters::default()),
            claims: Arc::new(ClaimCache::default()),
            recent: Arc::new(recent::Recent::default()),
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BusError> {
        let consumer = turnpike_jetstream::consume::durable(
            &self.bus.js,
            subjects::STREAM_EVENTS,
            subjects::CONSUMER_COORDINATOR,
        )
        .await?;
        info!("coordinator started");
        // Runner-lost detection is bounded by lease + this interval.
        let sweeper = tokio::spawn(sweep::run(
            Bus::clone(&self.bus),
            self.config.clone(),
            self.counters.clone(),
            self.config.heartbeat,
            shutdown.clone(),
        ));
        let ops = {
            let (bus, config, counters, token) = (
                Bus::clone(&self.bus),
                self.config.clone(),
                self.counters.clone(),
                shutdown.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = ops::serve(bus, config, counters, token).await {
                    warn!(error = %e, "operator service stopped");
                }
            })
        };
        let slots = Arc::new(Semaphore::new(IN_FLIGHT));
        let tasks = tokio_util::task::TaskTracker::new();
        turnpike_jetstream::consume::each_message(&consumer, IN_FLIGHT, &shutdown, |msg| {
            let (slots, tasks) = (slots.clone(), tasks.clone());
            let shared = Shared {
                bus: self.bus.clone(),
                counters: self.counters.clone(),
                claims: self.claims.clone(),
                recent: self.recent.clone(),
            };
            async move {
                // Wait for a free slot before taking the next event (backpressure).
                if let Ok(permit) = slots.acquire_owned().await {
                    tasks.spawn(async move {
                        handle(&shared, msg).await;
                        drop(permit);
                    });
                }
            }
        })
        .await;
        tasks.close();
        tasks.wait().await;
        let _ = sweeper.await;
        let _ = ops.await;
        info!("coordinator stopped");
        Ok(())
    }
}

/// Turn a runner event into a lifecycle event (progress is for watchers only).
fn lifecycle_event(ev: &RunnerEvent) -> Option<Event> {
    Some(match &ev.kind {
        RunnerEventKind::Started { published_at } => Event::Started {
            attempt: ev.attempt,
            runner: ev.runner.clone(),
            published_at: *published_at,
        },
        RunnerEventKind::MessageLanded { seq, stream_seq } => Event::MessageLanded {
            attempt: ev.attempt,
            seq: *seq,
            stream_seq: *stream_seq,
        },
        RunnerEventKind::Exited { report } => Event::Exited {
            attempt: ev.attempt,
            report: report.clone(),
        },
        RunnerEventKind::Progress { .. } => return None,
    })
}

/// What every in-flight event's task shares.
struct Shared {
    bus: Arc<Bus>,
    counters: Arc<Counters>,
    claims: Arc<ClaimCache>,
    recent: Arc<recent::Recent>,
}

async fn handle(shared: &Shared, msg: async_nats::jetstream::Message) {
    let (bus, counters, claims) = (&*shared.bus, &*shared.counters, &*shared.claims);
    let ev: RunnerEvent = match decode(msg.headers.as_ref(), &msg.payload) {
        Ok(ev) => ev,
        Err(e) => {
            return refuse(
                bus,
                counters,
                &msg,
                &format!("undecodable runner event: {e}"),
            )
            .await
        }
    };
    let span = tracing::info_span!("event", turn_id = %ev.turn, attempt = ev.attempt,
        chat_id = %ev.chat, runner_id = %ev.runner);
    async {
        if msg.subject.as_str() != subjects::events(&ev.turn) {
            return refuse(
                bus,
                counters,
                &msg,
                "event names another turn than its subject",
            )
            .await;
        }
        let Some(event) = lifecycle_event(&ev) else {
            let _ = msg.ack().await;
            return;
        };
        // Believed only from the runner that holds the attempt's claim: a runner's account may
        // publish events for any turn, so the claim is what proves who runs an attempt.
        let checked = claims.check(bus, &ev).await;
        let applied = match checked {
            Ok(()) => {
                // The event's time by the server's clock: the one that fires retries.
                let at = msg
                    .info()
                    .map(|i| {
                        turnpike_core::Timestamp::from_system_time(std::time::SystemTime::from(
                            i.published,
                        ))
                    })
                    .unwrap_or_else(|_| turnpike_jetstream::now());
                apply(shared, &ev, &event, at).await
            }
            Err(e) => Err(e),
        };
        match applied {
            Ok(()) => {
                let _ = msg.ack().await;
            }
            Err(e) if e.is_transient() => {
                warn!(error = %e, "event not applied yet; will retry");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
            }
            Err(e) => refuse(bus, counters, &msg, &e.to_string()).await,
        }
    }
    .instrument(span)
    .await
}

/// The coordinator's one way to refuse an event: dead letter, counted, never redelivered.
async fn refuse(
    bus: &Bus,
    counters: &Counters,
    msg: &async_nats::jetstream::Message,
    reason: &str,
) {
    turnpike_jetstream::refuse(&bus.js, "coordinator", msg, reason, &counters.dead_lettered).await;
}

async fn apply(
    shared: &Shared,
    ev: &RunnerEvent,
    event: &Event,
    at: turnpike_core::Timestamp,
) -> Result<(), ApplyError> {
    let (bus, counters) = (&*shared.bus, &*shared.counters);
    let _one_at_a_time = shared.recent.one_at_a_time(&ev.turn).await;
    // At the revision this coordinator last wrote, if it did: no read before the write.
    let known = shared.recent.get(&ev.turn);
    let applied = match turns::apply_event_from(bus, &ev.turn, event, at, known).await {
        Ok(applied) => applied,
        Err(e) => {
            shared.recent.forget(&ev.turn);
            return Err(e);
        }
    };
    match &applied {
        Applied::Changed { current, effects } => {
            info!(state = %current.record.state, retry_count = current.record.retry_count, "turn updated");
            counters.applied(true);
            counters.effects(effects);
            counters.timings.observe(&current.record, event);
        }
        Applied::Unchanged(why, _) => {
            debug!(?why, "event changed nothing");
            counters.applied(false);
        }
    }
    // Whatever is still owed (ours, or left by a coordinator that died) is done now.
    match turns::run_owed(bus, applied).await {
        Ok(after) => {
            shared.recent.remember(after);
            Ok(())
        }
        Err(e) => {
            shared.recent.forget(&ev.turn);
            Err(e)
        }
    }
}
