//! The recovery sweep: at start-up and periodically, look at every turn not yet ended (the
//! `turnpike_live` index, never the whole turns bucket, so its cost does not grow with finished
//! turns) and settle what no event will settle by itself:
//! - a running attempt whose runner lease lapsed (or was never written, for a whole lease since
//!   the sweep first found none) becomes a `runner_lost` death, after the turn's fence is moved
//!   so the lost runner's late output can no longer land;
//! - an attempt owed (queued, or a pending retry) that is neither scheduled, queued nor claimed
//!   is dispatched again;
//! - effects left in an ended turn's outbox are carried out, and the turn leaves the index.

use crate::{follow, Counters};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};
use tracing::{debug, info, warn};
use turnpike_config::Config;
use turnpike_core::fence::FenceWriter;
use turnpike_core::lifecycle::{Effect, Event};
use turnpike_core::record::TurnState;
use turnpike_core::recovery;
use turnpike_core::subjects;
use turnpike_core::wire::ExitReport;
use turnpike_core::{TurnId, TurnRecord};
use turnpike_jetstream::{now, BusError};
use turnpike_store::fence::{self, Losing};
use turnpike_store::leases::Lease;
use turnpike_store::outbox;
use turnpike_store::turns::{self, ApplyError};
use turnpike_store::Bus;

/// What one sweep found; logged, and counted by operators' tools.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepReport {
    /// Live turns listed when the pass began.
    pub live: usize,
    /// Attempts declared lost with their runner.
    pub runner_lost: usize,
    /// Owed attempts found nowhere and dispatched again.
    pub rescheduled: usize,
    /// Attempts queued far longer than expected (how many, and which: a [`Sweeper`] warns of
    /// each once).
    pub queued_long: usize,
    /// Which attempts those are, and how long each has waited.
    pub queued_long_attempts: Vec<(TurnId, u32, Duration)>,
    /// Ended turns whose effects were carried out, and stale index entries dropped.
    pub cleaned: usize,
    /// Turns looked at (in full, or in the work queue).
    pub looked_at: usize,
    /// Owed attempts found claimed (their lease is then looked at every pass).
    pub claimed: Vec<(TurnId, u32)>,
}

/// The least a lost attempt's lease marker lives (the bucket keeps a marker without TTL for a week).
const LOST_MARKER_TTL: Duration = Duration::from_secs(60);

/// An attempt published this long ago and still unclaimed is reported (never silently lost).
const QUEUED_LONG: Duration = Duration::from_secs(300);

/// What one sweeper remembers between its passes: since when (by this host's monotonic clock)
/// it has found no trace of a claimed attempt's lease. A run writes its lease a heartbeat after
/// its claim, so one pass cannot tell a run in its first heartbeat from a runner that died before
/// writing one; a whole lease later it can ([`recovery::absent_lease`]). Lost with the process:
/// a restarted sweeper only takes a lease longer to call such an attempt lost.
#[derive(Debug, Default)]
pub struct Sweeper {
    absent_since: HashMap<String, Instant>,
    /// Attempts already warned of as queued far too long: each is warned of (and counted) once,
    /// not at every pass while it waits.
    warned_queued: HashSet<(TurnId, u32)>,
}

impl Sweeper {
    /// One pass over every live turn (as listed now).
    pub async fn pass(
        &mut self,
        bus: &Bus,
        config: &Config,
        counters: &Counters,
    ) -> Result<SweepReport, BusError> {
        let live = turnpike_store::live::keys(bus).await?;
        let report = self.pass_over(bus, config, counters, live).await?;
        self.warn_queued_once(&report, counters, |_, _| false);
        Ok(report)
    }

    /// One pass over what `index` says is due: the turns it names are looked at in full; the
    /// queued first attempts of a round are looked for in the work queue all at once, and only
    /// those not found there are looked at in full. An index not built yet: every live turn.
    pub async fn pass_due(
        &mut self,
        bus: &Bus,
        config: &Config,
        counters: &Counters,
        index: &follow::Shared,
    ) -> Result<SweepReport, BusError> {
        let planned = {
            let mut f = index.lock();
            f.ready
                .then(|| (f.index.due(Instant::now(), now()), f.index.live()))
        };
        let Some((due, live)) = planned else {
            return self.pass(bus, config, counters).await;
        };
        let full = due.full;
        let (mut on_their_way, mut missing) = (Vec::new(), Vec::new());
        let looked_for = due.queued.len();
        if !due.queued.is_empty() {
            match turnpike_store::work::queued_turns(bus).await {
                Ok(found) => {
                    for q in due.queued {
                        if found.contains(&q.turn) {
                            on_their_way.push(q);
                        } else {
                            missing.push(q.turn);
                        }
                    }
                }
                // The round is taken again at the next pass; what else is due is not held up.
                Err(e) => {
                    warn!(error = %e, queued = due.queued.len(), "could not list the work queue");
                    index.lock().index.round_again();
                }
            }
        }
        // Not in the queue: looked at in full from the next pass, a pass's worth at a time (a
        // purge of the whole queue must not make one pass of every queued turn).
        if !missing.is_empty() {
            index.lock().index.look_again(&missing, Instant::now());
        }
        let keys = full.iter().map(|t| t.as_str().to_owned()).collect();
        let mut report = self.pass_over(bus, config, counters, keys).await?;
        report.live = live;
        report.looked_at = full.len() + looked_for;
        for q in on_their_way {
            let waited = now().since(q.since);
            if waited > QUEUED_LONG {
                report.queued_long += 1;
                report
                    .queued_long_attempts
                    .push((q.turn, q.attempt, waited));
            }
        }
        {
            let mut f = index.lock();
            let at = Instant::now();
            f.index.looked_at(&full, at);
            for (turn, attempt) in &report.claimed {
                f.index.claimed(turn.clone(), *attempt, at);
            }
            self.warn_queued_once(&report, counters, |t, a| f.index.still_queued(t, a));
        }
        Ok(report)
    }

    /// A pass over `listed`, remembering what it found of absent leases.
    async fn pass_over(
        &mut self,
        bus: &Bus,
        config: &Config,
        counters: &Counters,
        listed: Vec<String>,
    ) -> Result<SweepReport, BusError> {
        let mut seen = HashSet::new();
        let report = sweep_listed(bus, config, counters, listed, &mut |key: &str| {
            seen.insert(key.to_owned());
            let since = *self
                .absent_since
                .entry(key.to_owned())
                .or_insert_with(Instant::now);
            recovery::absent_lease(since.elapsed(), config.lease)
        })
        .await?;
        // Forget attempts no longer found without a lease (it came, or the turn moved on): a
        // claimed attempt is looked at every pass until it does.
        self.absent_since.retain(|k, _| seen.contains(k));
        Ok(report)
    }

    /// Warn of (and count) each attempt queued far too long once, when a pass first finds it;
    /// forget those neither found again nor `still_queued` (a round looks for queued attempts
    /// only once in a while), so a later attempt of the turn is warned of in its turn.
    fn warn_queued_once(
        &mut self,
        report: &SweepReport,
        counters: &Counters,
        still_queued: impl Fn(&TurnId, u32) -> bool,
    ) {
        let mut now_queued = HashSet::with_capacity(report.queued_long_attempts.len());
        for (turn, attempt, waited) in &report.queued_long_attempts {
            let key = (turn.clone(), *attempt);
            if !self.warned_queued.contains(&key) {
                warn!(turn_id = %turn, attempt, waited = ?waited, "attempt queued far longer than expected: are runners up?");
                counters.queued_long();
            }
            now_queued.insert(key);
        }
        self.warned_queued
            .retain(|(t, a)| now_queued.contains(&(t.clone(), *a)) || still_queued(t, *a));
        self.warned_queued.extend(now_queued);
    }
}

/// One pass by a sweeper with no memory: a claimed attempt with no trace of a lease is judged
/// not lost yet ([`Sweeper`] judges it over passes).
pub async fn sweep_once(
    bus: &Bus,
    config: &Config,
    counters: &Counters,
) -> Result<SweepReport, BusError> {
    Sweeper::default().pass(bus, config, counters).await
}

/// How a claimed attempt's absent lease (by its key) is judged.
pub type JudgeAbsent<'a> = dyn FnMut(&str) -> recovery::Lease + Send + 'a;

/// A pass over `listed`, the live turns as listed when the pass began (given here by the
/// tests, which make the listing stale). Each turn is read afresh, and a turn's effects are
/// carried out only if it is still listed when that is decided: however long the pass takes
/// (thousands of live turns, a NATS brown-out), what it does never rests on its old listing.
pub async fn sweep_listed(
    bus: &Bus,
    config: &Config,
    counters: &Counters,
    listed: Vec<String>,
    absent: &mut JudgeAbsent<'_>,
) -> Result<SweepReport, BusError> {
    let mut pass = Pass {
        bus,
        config,
        counters,
        absent,
        report: SweepReport {
            live: listed.len(),
            looked_at: listed.len(),
            ..SweepReport::default()
        },
    };
    for key in listed {
        let Ok(turn) = TurnId::new(key.as_str()) else {
            let _ = turnpike_store::live::drop_key(bus, &key).await;
            continue;
        };
        match pass.turn(&turn).await {
            Ok(()) => {}
            // What the turn needs can never be stored or counted: it ends, failed.
            Err(e) if e.ends_the_turn() => {
                if let Err(e) = outbox::abandon(bus, &turn, &e.to_string()).await {
                    warn!(turn_id = %turn, error = %e, "could not end the turn; next sweep retries");
                }
            }
            Err(e) => {
                warn!(turn_id = %turn, error = %e, "sweep could not settle this turn; next sweep retries")
            }
        }
    }
    Ok(pass.report)
}

/// One pass's context: what it reads and writes with, how it judges absent leases, and what it
/// found so far.
struct Pass<'p, 'j> {
    bus: &'p Bus,
    config: &'p Config,
    counters: &'p Counters,
    absent: &'p mut JudgeAbsent<'j>,
    report: SweepReport,
}

impl Pass<'_, '_> {
    /// Settle one live turn, as [`recovery::plan`] says.
    async fn turn(&mut self, turn: &TurnId) -> Result<(), ApplyError> {
        let (bus, config) = (self.bus, self.config);
        let Some(current) = turns::load(bus, turn).await? else {
            // The dispatcher indexes a turn just before creating it: only an old entry is stale.
            if let Ok(Some(listed)) = turnpike_store::live::listed_at(bus, turn).await {
                if age(listed) > config.lease {
                    let _ = turnpike_store::live::unlist(bus, turn).await;
                    self.report.cleaned += 1;
                }
            }
            return Ok(());
        };
        let record = &current.record;
        let stale = now().since(record.updated_at) > config.heartbeat;
        let (leftovers, plan) = recovery::plan(record, stale);
        if !leftovers.is_empty() {
            // Effects decided a while ago and still not confirmed (a kill to forward, say): the
            // writer failed after its CAS. They are idempotent; carry them out now rather than wait
            // for the turn's next event.
            let mut owed = current.clone();
            owed.record.outbox = leftovers;
            outbox::run_outbox(bus, owed).await?;
        }
        match plan {
            recovery::Plan::Finish => {
                // Ended, but its effects did not all happen: carried out, it leaves this index.
                // Only if it is still listed *now*: the pass's listing may be older than the
                // duplicate window, and a turn whose effects were carried out meanwhile (and that
                // left the index) must not send its notice again.
                if !turnpike_store::live::is_listed(bus, turn).await? {
                    return Ok(());
                }
                outbox::run_outbox(bus, current.clone()).await?;
                self.report.cleaned += 1;
            }
            recovery::Plan::CheckAttempt { .. } => self.check_attempt_alive(record).await?,
            recovery::Plan::CheckDispatched { .. } => self.check_dispatched(record).await?,
            recovery::Plan::Nothing => {}
        }
        Ok(())
    }

    /// Is the running (or claimed) current attempt alive? If its lease lapsed, or never came for
    /// a whole lease, it is declared lost: its fence moved, then its death applied.
    async fn check_attempt_alive(&mut self, record: &TurnRecord) -> Result<(), ApplyError> {
        let (bus, config, counters) = (self.bus, self.config, self.counters);
        let turn = &record.turn;
        let k = record.attempt;
        let claimed = turnpike_store::claims::claim(bus, turn, k).await?;
        let claim = claimed.claim;
        if claim != recovery::Claim::Runner {
            return Ok(());
        }
        // Only the claimant writes its lease (the key names it, and only its NATS user may write
        // there): a marker means the server let it lapse (its TTL) or it was taken away; no trace
        // at all is judged by how long this sweeper has found none. No host's clock is compared
        // with another's. A claim that does not decode names no runner whose lease could be found.
        let key = subjects::claim_key(turn, k);
        let lease = match &claimed.runner {
            Some(runner) => turnpike_store::leases::state(bus, turn, k, runner).await?,
            None => Lease::Absent,
        };
        let (lease, lapsed_at) = match lease {
            Lease::Live => (recovery::Lease::Live, None),
            Lease::Lapsed(at) => (recovery::Lease::Lapsed, Some(at)),
            // No trace of a lease: dated below, by the fence marker that declares it lost.
            Lease::Absent => ((self.absent)(&key), None),
        };
        let reported = lease == recovery::Lease::Lapsed
            && match &claimed.runner {
                Some(runner) => turnpike_store::work::exit_reported(bus, turn, k, runner).await,
                None => false,
            };
        match recovery::judge_attempt(claim, lease, reported) {
            recovery::Attempt::Fine => return Ok(()),
            recovery::Attempt::ExitOnItsWay => {
                debug!(turn_id = %turn, attempt = k, "lease lapsed after the exit was reported; the event settles it");
                return Ok(());
            }
            recovery::Attempt::Lost => {}
        }
        // Leave a marker on the lease key first: a runner that could still write its first lease
        // (it should have stopped its run by its deadline) finds it and stops; one whose lease
        // came back meanwhile loses it at its next renewal. Expires by itself long after any
        // runner's deadline. Defence in depth, not what makes the loss safe (the fence does), so a
        // marker that cannot be written never keeps the attempt from being settled.
        if let Some(runner) = &claimed.runner {
            let marked = turnpike_store::leases::mark_lost(
                bus,
                turn,
                k,
                runner,
                LOST_MARKER_TTL.max(config.lease * 4),
            )
            .await;
            if let Err(e) = marked {
                warn!(turn_id = %turn, attempt = k, error = %e, "could not mark the lost attempt's lease; settling it anyway");
            }
        }
        // Move the fence first, and only if attempt k could still hold it: from here on nothing of
        // the lost attempt can land, so the count below is final. A record read before a later
        // attempt took the fence is stale, and changes nothing.
        let (runner_seq, fenced_at) = match fence::lose(bus, turn, k, &FenceWriter::Service).await?
        {
            Losing::Fenced { runner_seq, at } => (runner_seq, at),
            Losing::Stale { current } => {
                debug!(turn_id = %turn, attempt = k, current, "the fence belongs to a later attempt; this record was stale");
                return Ok(());
            }
        };
        info!(turn_id = %turn, attempt = k, chat_id = %record.chat, "runner lease lapsed: declared the attempt lost");
        // Dated by the server, never by this host's clock: when its lease lapsed, or else when
        // its fence was moved. The retry's due time follows from it, and a coordinator whose clock
        // runs an hour fast must not hold the chat for an hour.
        let lapsed_at = lapsed_at.unwrap_or(fenced_at);
        let replies = fence::landed(bus, &record.chat, turn, k, runner_seq).await?;
        let event = Event::Exited {
            attempt: k,
            report: ExitReport::runner_lost(
                format!(
                    "runner lease lapsed (no heartbeat for over {})",
                    humantime::format_duration(config.lease)
                ),
                replies,
                lapsed_at,
            ),
        };
        // The death is dated when the server let the lease lapse.
        let applied = turns::apply_event_at(bus, turn, &event, lapsed_at).await?;
        if let turns::Applied::Changed { effects, .. } = &applied {
            counters.runner_lost();
            counters.effects(effects);
        }
        outbox::run_owed(bus, applied).await?;
        self.report.runner_lost += 1;
        Ok(())
    }

    /// An attempt owed (queued, or a pending retry): claimed, it is judged as a current attempt;
    /// scheduled or waiting in the queue, it is on its way; nowhere, it is dispatched again (its
    /// dispatcher died between its write and its publish, or a purge lost it).
    async fn check_dispatched(&mut self, record: &TurnRecord) -> Result<(), ApplyError> {
        let bus = self.bus;
        let turn = &record.turn;
        let k = record.attempt;
        // Claimed: a runner has it, and it may have died before reporting it started. Its lease
        // tells, as for a running attempt.
        let claimed =
            turnpike_store::claims::claim(bus, turn, k).await?.claim != recovery::Claim::None;
        if claimed {
            self.report.claimed.push((turn.clone(), k));
        }
        let way = if claimed {
            turnpike_store::work::OnItsWay {
                scheduled: false,
                queued: false,
            }
        } else {
            turnpike_store::work::on_its_way(bus, turn, k, record.next_attempt_due.is_some())
                .await?
        };
        let (scheduled, queued) = (way.scheduled, way.queued);
        match recovery::judge_retry(claimed, scheduled, queued) {
            recovery::Retry::CheckAttempt => return self.check_attempt_alive(record).await,
            recovery::Retry::OnItsWay => {
                let waited = now().since(record.updated_at);
                if queued && record.state == TurnState::Queued && waited > QUEUED_LONG {
                    self.report.queued_long += 1;
                    self.report
                        .queued_long_attempts
                        .push((turn.clone(), k, waited));
                }
                return Ok(());
            }
            recovery::Retry::Reschedule => {}
        }
        // Owed and nowhere. Attempt 1 goes under its dedup id (a publish that raced this read is
        // not doubled); a retry for its recorded due time.
        warn!(turn_id = %turn, attempt = k, due = ?record.next_attempt_due, "owed attempt was not dispatched; dispatching it");
        outbox::execute(
            bus,
            record,
            &Effect::DispatchAttempt {
                attempt: k,
                not_before: record.next_attempt_due,
            },
        )
        .await?;
        self.report.rescheduled += 1;
        Ok(())
    }
}

fn age(created: impl Into<SystemTime>) -> Duration {
    SystemTime::now()
        .duration_since(created.into())
        .unwrap_or_default()
}

/// Sweep now, then every `interval`, until cancelled: what `index` says is due.
pub async fn run(
    bus: Bus,
    config: Config,
    counters: std::sync::Arc<Counters>,
    interval: Duration,
    index: follow::Shared,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let mut sweeper = Sweeper::default();
    loop {
        match sweeper.pass_due(&bus, &config, &counters, &index).await {
            // One line per pass, with counts: never one per turn.
            Ok(r) if r.runner_lost + r.rescheduled + r.cleaned > 0 => info!(
                live = r.live,
                looked_at = r.looked_at,
                runner_lost = r.runner_lost,
                rescheduled = r.rescheduled,
                cleaned = r.cleaned,
                queued_long = r.queued_long,
                "sweep settled turns"
            ),
            Ok(r) => debug!(
                live = r.live,
                looked_at = r.looked_at,
                queued_long = r.queued_long,
                "sweep"
            ),
            Err(e) => warn!(error = %e, "sweep failed; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(queued: &[(&str, u32)]) -> SweepReport {
        SweepReport {
            queued_long: queued.len(),
            queued_long_attempts: queued
                .iter()
                .map(|(t, a)| (TurnId::new(*t).expect("id"), *a, QUEUED_LONG * 2))
                .collect(),
            ..SweepReport::default()
        }
    }

    #[test]
    fn an_attempt_queued_too_long_is_warned_of_once_while_it_waits() {
        let counters = Counters::default();
        let mut sweeper = Sweeper::default();
        let counted = |c: &Counters| c.snapshot().queued_long;
        let gone = |_: &TurnId, _: u32| false;
        sweeper.warn_queued_once(&report(&[("t-a", 1), ("t-b", 1)]), &counters, gone);
        assert_eq!(counted(&counters), 2);
        // The same attempts at the next passes: nothing new.
        for _ in 0..3 {
            sweeper.warn_queued_once(&report(&[("t-a", 1), ("t-b", 1)]), &counters, gone);
        }
        assert_eq!(counted(&counters), 2);
        // t-a was taken; t-b's next attempt waits too long: that one is new.
        sweeper.warn_queued_once(&report(&[("t-b", 2)]), &counters, gone);
        assert_eq!(counted(&counters), 3);
        // t-a waits again later (a new condition): warned of again.
        sweeper.warn_queued_once(&report(&[("t-a", 1), ("t-b", 2)]), &counters, gone);
        assert_eq!(counted(&counters), 4);
        // A round looks for queued attempts once in a while: between rounds, one the index
        // still has queued is remembered, and not warned of again when the next round finds it.
        let still = |t: &TurnId, a: u32| t.as_str() == "t-a" && a == 1;
        sweeper.warn_queued_once(&report(&[]), &counters, still);
        sweeper.warn_queued_once(&report(&[("t-a", 1)]), &counters, still);
        assert_eq!(counted(&counters), 4);
    }
}
