//! The coordinator: applies runner events to turn records through the core lifecycle, with
//! compare-and-set on the `turnpike_turns` bucket, and carries out what the lifecycle decides
//! (retries scheduled by JetStream, notices, errored flags). It keeps nothing that matters in
//! memory; any number of coordinators may run at once.

use async_nats::jetstream::AckKind;
use batches::{Batches, Joined, Leading, Queued};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};
use turnpike_config::Config;
use turnpike_core::lifecycle::{Event, EventOutcome};
use turnpike_core::subjects;
use turnpike_core::wire::{ClaimHolder, RunnerEvent, RunnerEventKind};
use turnpike_core::{RunnerId, TurnId};
use turnpike_jetstream::{decode, BusError};
use turnpike_store::outbox;
use turnpike_store::turns::{self, Applied, ApplyError};
use turnpike_store::Bus;

/// Events handled at once by one coordinator (one turn's go in its batches, one batch at a time;
/// other coordinators' writes race through CAS).
const IN_FLIGHT: usize = 32;

mod batches;
pub mod counters;
pub mod due;
pub mod follow;
pub mod ops;
mod recent;
pub mod sweep;
pub mod timings;

pub mod metrics;
pub use counters::Counters;

/// Claims this coordinator has checked, by key: a claim never changes once created, so one leader
/// read per attempt serves all of its events. Bounded; only saves reads, decides nothing.
#[derive(Default)]
struct ClaimCache(std::sync::Mutex<std::collections::HashMap<String, RunnerId>>);

const CLAIM_CACHE: usize = 4096;

impl ClaimCache {
    /// Does `sender` hold its attempt's claim?
    async fn check(&self, bus: &Bus, sender: &Sender) -> Result<(), ApplyError> {
        let key = subjects::claim_key(&sender.turn, sender.attempt);
        let cached = self.0.lock().ok().and_then(|c| c.get(&key).cloned());
        if cached.as_ref() == Some(&sender.runner) {
            return Ok(());
        }
        let holder = turnpike_store::claims::holder(bus, &sender.turn, sender.attempt).await?;
        match holder {
            Some(ClaimHolder::Runner { runner }) if runner == sender.runner => {
                if let Ok(mut c) = self.0.lock() {
                    if c.len() >= CLAIM_CACHE {
                        c.clear();
                    }
                    c.insert(key, runner);
                }
                Ok(())
            }
            // Only on refusal: an event for a turn that does not exist says so.
            None if turns::load(bus, &sender.turn).await?.is_none() => {
                Err(ApplyError::UnknownTurn(sender.turn.clone()))
            }
            other => Err(ApplyError::NotClaimant {
                turn: sender.turn.clone(),
                attempt: sender.attempt,
                runner: sender.runner.clone(),
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
        let Some(consumer) = turnpike_jetstream::consume::durable_patiently(
            &self.bus.js,
            subjects::STREAM_EVENTS,
            subjects::CONSUMER_COORDINATOR,
            &shutdown,
        )
        .await
        else {
            return Ok(());
        };
        info!("coordinator started");
        // What the sweep must look at, and the live turns' counts, kept from watches.
        let index = follow::Shared::new(due::Timing::new(self.config.heartbeat));
        let follower = tokio::spawn(follow::follow(
            Bus::clone(&self.bus),
            index.clone(),
            shutdown.clone(),
        ));
        // Runner-lost detection is bounded by lease + this interval.
        let sweeper = tokio::spawn(sweep::run(
            Bus::clone(&self.bus),
            self.config.clone(),
            self.counters.clone(),
            self.config.heartbeat,
            index.clone(),
            shutdown.clone(),
        ));
        let ops = {
            let (bus, config, counters, index, token) = (
                Bus::clone(&self.bus),
                self.config.clone(),
                self.counters.clone(),
                index.clone(),
                shutdown.clone(),
            );
            tokio::spawn(async move {
                if let Err(e) = ops::serve(bus, config, counters, index, token).await {
                    warn!(error = %e, "operator service stopped");
                }
            })
        };
        let shared = Arc::new(Shared {
            bus: self.bus.clone(),
            counters: self.counters.clone(),
            claims: self.claims.clone(),
            recent: self.recent.clone(),
            batches: Batches::default(),
            slots: Arc::new(Semaphore::new(IN_FLIGHT)),
            batch_wait: self.config.event_batch_wait,
        });
        let tasks = tokio_util::task::TaskTracker::new();
        turnpike_jetstream::consume::each_message(&consumer, IN_FLIGHT, &shutdown, |msg| {
            let (shared, tasks) = (shared.clone(), tasks.clone());
            async move {
                // Wait for a free slot before taking the next event (backpressure).
                let Ok(permit) = shared.slots.clone().acquire_owned().await else {
                    return;
                };
                // Sorted here, one at a time: a turn's events join its batches in the order
                // they were delivered (its start before its exit).
                match sort(msg) {
                    Sorted::Apply(queued) => {
                        let turn = queued.sender.turn.clone();
                        let lingers = batches::lingers(&queued.event);
                        let wakes = batches::wakes(&queued.event);
                        if let Joined::Lead { arrived } = shared.batches.join(&turn, queued, wakes)
                        {
                            tasks.spawn(async move {
                                lead(&shared, &turn, lingers, arrived, permit).await
                            });
                        }
                    }
                    Sorted::Settle(msg, verdict, span) => {
                        tasks.spawn(async move {
                            settle(&shared, &msg, verdict).instrument(span).await;
                            drop(permit);
                        });
                    }
                }
            }
        })
        .await;
        tasks.close();
        tasks.wait().await;
        let _ = sweeper.await;
        let _ = follower.await;
        let _ = ops.await;
        info!("coordinator stopped");
        Ok(())
    }
}

/// Who sent a runner event: the claim it must hold to be believed.
pub(crate) struct Sender {
    pub(crate) turn: TurnId,
    pub(crate) attempt: u32,
    pub(crate) runner: RunnerId,
}

/// Split a runner event into its sender and its lifecycle event (progress is for watchers only).
fn lifecycle_event(ev: RunnerEvent) -> (Sender, Option<Event>) {
    let event = match ev.kind {
        RunnerEventKind::Started { published_at } => Some(Event::Started {
            attempt: ev.attempt,
            runner: ev.runner.clone(),
            published_at,
        }),
        RunnerEventKind::MessageLanded { seq, stream_seq } => Some(Event::MessageLanded {
            attempt: ev.attempt,
            seq,
            stream_seq,
        }),
        RunnerEventKind::Exited { report } => Some(Event::Exited {
            attempt: ev.attempt,
            report,
        }),
        RunnerEventKind::Progress { .. } => None,
    };
    let sender = Sender {
        turn: ev.turn,
        attempt: ev.attempt,
        runner: ev.runner,
    };
    (sender, event)
}

/// What every in-flight event's task shares.
struct Shared {
    bus: Arc<Bus>,
    counters: Arc<Counters>,
    claims: Arc<ClaimCache>,
    recent: Arc<recent::Recent>,
    batches: Batches<Queued>,
    /// The in-flight slots (a leader waiting for more of its turn gives its slot back meanwhile).
    slots: Arc<Semaphore>,
    /// How long a start waits for more of its turn (`event_batch_wait`).
    batch_wait: Duration,
}

/// What to do with a delivered event.
#[allow(clippy::large_enum_variant)] // made and matched once per event: a box would only allocate
enum Sorted {
    /// Apply it with its turn's batch.
    Apply(Queued),
    /// Settle it now: nothing to apply (progress), or never applicable.
    Settle(async_nats::jetstream::Message, Verdict, tracing::Span),
}

/// Decode and check what needs no IO; an event to apply is queued with its span and the time
/// the server stored it.
fn sort(msg: async_nats::jetstream::Message) -> Sorted {
    let ev: RunnerEvent = match decode(msg.headers.as_ref(), &msg.payload) {
        Ok(ev) => ev,
        Err(e) => {
            let why = Verdict::Refuse(format!("undecodable runner event: {e}"));
            return Sorted::Settle(msg, why, tracing::Span::none());
        }
    };
    let span = tracing::info_span!("event", turn_id = %ev.turn, attempt = ev.attempt,
        chat_id = %ev.chat, runner_id = %ev.runner);
    // The subject says who sent it: each runner's NATS user may publish only on its own. The
    // payload must agree, and the claim is then checked against the subject's runner.
    let why = match subjects::parse_events(msg.subject.as_str()) {
        None => Some("event on a subject that names no turn and runner"),
        Some((turn, _)) if turn != ev.turn => Some("event names another turn than its subject"),
        Some((_, runner)) if runner != ev.runner => {
            Some("event names another runner than its subject")
        }
        Some(_) => None,
    };
    if let Some(why) = why {
        return Sorted::Settle(msg, Verdict::Refuse(why.to_owned()), span);
    }
    let (sender, Some(event)) = lifecycle_event(ev) else {
        return Sorted::Settle(msg, Verdict::Ack, span);
    };
    // The event's time by the server's clock: the one that fires retries.
    let at = msg
        .info()
        .map(|i| {
            turnpike_core::Timestamp::from_system_time(std::time::SystemTime::from(i.published))
        })
        .unwrap_or_else(|_| turnpike_jetstream::now());
    Sorted::Apply(Queued {
        sender,
        event,
        at,
        msg,
        span,
    })
}

/// Lead a turn's batches: wait for more of the turn if the first event asks to, then apply
/// batches until none is left.
async fn lead(
    shared: &Shared,
    turn: &TurnId,
    lingers: bool,
    arrived: Arc<tokio::sync::Notify>,
    permit: OwnedSemaphorePermit,
) {
    let mut permit = Some(permit);
    if lingers && !shared.batch_wait.is_zero() {
        // The slot serves other events meanwhile, this turn's exit among them.
        drop(permit.take());
        let _ = tokio::time::timeout(shared.batch_wait, arrived.notified()).await;
        permit = shared.slots.clone().acquire_owned().await.ok();
    }
    let mut leading = Leading::new(&shared.batches, turn);
    while let Some(batch) = leading.next_batch() {
        apply(shared, turn, batch).await;
    }
    drop(permit);
}

/// End a turn whose events cannot be written for good; what becomes of those events: refused
/// (dead-lettered) once the turn has ended, or tried again if ending it failed for now.
async fn abandoned(bus: &Bus, turn: &TurnId, error: &ApplyError) -> Verdict {
    let reason = error.to_string();
    match outbox::abandon(bus, turn, &reason).await {
        Ok(_) => Verdict::Refuse(reason),
        Err(e) if e.is_transient() => Verdict::Later(e.to_string()),
        Err(e) => {
            tracing::error!(turn_id = %turn, error = %e, "the turn could not be ended either");
            Verdict::Refuse(format!("{reason}; ending the turn failed too: {e}"))
        }
    }
}

/// What becomes of an event's message.
#[derive(Clone)]
enum Verdict {
    Ack,
    /// Not applied yet; redelivered in a second.
    Later(String),
    /// Never applicable: dead-lettered.
    Refuse(String),
}

impl Verdict {
    fn of(e: &ApplyError) -> Self {
        if e.is_transient() {
            Verdict::Later(e.to_string())
        } else {
            Verdict::Refuse(e.to_string())
        }
    }
}

async fn settle(shared: &Shared, msg: &async_nats::jetstream::Message, verdict: Verdict) {
    match verdict {
        Verdict::Ack => {
            let _ = msg.ack().await;
        }
        Verdict::Later(error) => {
            warn!(%error, "event not applied yet; will retry");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
        }
        Verdict::Refuse(reason) => refuse(&shared.bus, &shared.counters, msg, &reason).await,
    }
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

/// Apply a batch of one turn's events: those from the runner holding their attempt's claim, in
/// one write.
async fn apply(shared: &Shared, turn: &TurnId, batch: Vec<Queued>) {
    let bus = &*shared.bus;
    // Believed only from the runner that holds the attempt's claim: a runner's account may
    // publish events for any turn, so the claim is what proves who runs an attempt.
    let mut believed = Vec::with_capacity(batch.len());
    for q in batch {
        match shared
            .claims
            .check(bus, &q.sender)
            .instrument(q.span.clone())
            .await
        {
            Ok(()) => believed.push(q),
            Err(e) => {
                settle(shared, &q.msg, Verdict::of(&e))
                    .instrument(q.span)
                    .await
            }
        }
    }
    if let Some(span) = believed.last().map(|q| q.span.clone()) {
        write(shared, turn, believed).instrument(span).await;
    }
}

/// Write a batch of believed events in one compare-and-set, carry out what is owed, and settle
/// each event's message.
async fn write(shared: &Shared, turn: &TurnId, batch: Vec<Queued>) {
    let (bus, counters) = (&*shared.bus, &*shared.counters);
    let events: Vec<(&Event, turnpike_core::Timestamp)> =
        batch.iter().map(|q| (&q.event, q.at)).collect();
    // At the revision this coordinator last wrote, if it did: no read before the write.
    let known = shared.recent.get(turn);
    let applied = match turns::apply_events_from(bus, turn, &events, known).await {
        Ok(applied) => applied,
        Err(e) => {
            shared.recent.forget(turn);
            let verdict = if e.ends_the_turn() {
                // The turn's record can never take these events (NATS refuses it for good):
                // the turn ends failed instead of the events coming back forever.
                abandoned(bus, turn, &e).await
            } else {
                Verdict::of(&e)
            };
            for q in batch {
                settle(shared, &q.msg, verdict.clone())
                    .instrument(q.span)
                    .await;
            }
            return;
        }
    };
    let changed = |o: &EventOutcome| *o == EventOutcome::Changed;
    for o in applied
        .outcomes
        .iter()
        .filter(|o| !matches!(o, EventOutcome::Refused(_)))
    {
        counters.applied(changed(o));
    }
    // Whatever is still owed (ours, or left by a coordinator that died) is done now.
    let owed = match applied.applied {
        Some(done) => {
            match &done {
                Applied::Changed { current, effects } => {
                    info!(state = %current.record.state, retry_count = current.record.retry_count,
                        events = events.len(), "turn updated");
                    counters.effects(effects);
                    for ((event, _), o) in events.iter().zip(&applied.outcomes) {
                        if changed(o) {
                            counters.timings.observe(&current.record, event);
                        }
                    }
                }
                Applied::Unchanged(why, _) => debug!(?why, "events changed nothing"),
            }
            match outbox::run_owed(bus, done).await {
                Ok(after) => {
                    shared.recent.remember(after);
                    Verdict::Ack
                }
                Err(e) => {
                    shared.recent.forget(turn);
                    Verdict::of(&e)
                }
            }
        }
        None => Verdict::Ack,
    };
    for (q, outcome) in batch.into_iter().zip(applied.outcomes) {
        let verdict = match outcome {
            EventOutcome::Refused(e) => Verdict::Refuse(ApplyError::from(e).to_string()),
            _ => owed.clone(),
        };
        settle(shared, &q.msg, verdict).instrument(q.span).await;
    }
}
