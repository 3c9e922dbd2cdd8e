//! The due index: which live turns a sweep pass must look at, so that a pass costs what is due,
//! not what is live. Fed from watches (the live index, turn records, claims) by
//! [`follow`](crate::follow), it keeps a few dozen bytes a turn: its state, attempt, whether it
//! owes effects, its retry's due time, whether its attempt is claimed, and when this coordinator
//! last saw it change. Pure: no IO, every time is given.
//!
//! *When* a turn is looked at is decided here; *what* is decided when it is stays the sweep's
//! ([`turnpike_core::recovery`]):
//! - at every pass: a running or claimed attempt (its lease), an ended turn still listed, a
//!   listed turn whose record was not seen;
//! - once, a pass after it changed: a turn owing an attempt (queued, or a pending retry) or
//!   effects, which its writer may have died before carrying out (a dispatch that never reached
//!   the queue, a retry never scheduled);
//! - a queued first attempt: once per round, all of them together, by one listing of the work
//!   queue (found there: on its way; not found: looked at in full at once);
//! - a pending retry once its due time has passed, a queued retry, a turn owing effects: backing
//!   off from one pass to one round;
//! - a waiting turn owing nothing: never (the turn ahead of it in its chat moves it on).

use std::collections::HashMap;
use std::time::{Duration, Instant};
use turnpike_core::record::TurnState;
use turnpike_core::wire::{LivePage, LiveQuery, LiveTurn};
use turnpike_core::{Timestamp, TurnId, TurnRecord};

/// How often what is due is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Between passes (the heartbeat): turns due at every pass are looked at this often.
    pub pass: Duration,
    /// Between rounds: how often a queued first attempt is looked for in the work queue, and the
    /// longest back-off.
    pub round: Duration,
}

impl Timing {
    /// Rounds every minute at least, for a sweep that passes every `heartbeat`.
    pub fn new(heartbeat: Duration) -> Self {
        Timing {
            pass: heartbeat,
            round: ROUND.max(heartbeat),
        }
    }
}

/// Between two rounds over the queued first attempts, at least.
const ROUND: Duration = Duration::from_secs(60);

/// Between two rounds, per queued first attempt: past 12,000 of them, rounds come further apart
/// than a minute (100,000: every 8 minutes). A queue that long is drained by runners over far
/// longer than that; a work item lost from it (a purge) is dispatched again within a round.
const ROUND_PER_QUEUED: Duration = Duration::from_millis(5);

/// Turns looked at in one pass besides those due at every pass (about a second and a half of
/// reads).
pub const PER_PASS: usize = 2_000;

/// How long a record seen without its listing is kept (the live index's watch may lag the
/// records' watch): far longer than any lag, short enough that nothing piles up.
const UNLISTED_KEPT: Duration = Duration::from_secs(600);

/// What the index keeps of a turn's record: what the sweep needs to know when to look at it,
/// and what the operators' lists show of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// The record's revision in its bucket: an older one never replaces a newer.
    pub revision: u64,
    /// When it last changed, by the server's clock.
    pub updated_at: Timestamp,
    /// Effects a sweep carries out again once the record is stale
    /// ([`turnpike_core::recovery::leftovers`]).
    pub owes: bool,
    /// The turn as the lists show it: state, attempt, a retry's due time among them.
    pub live: LiveTurn,
}

impl Seen {
    /// What the index keeps of `record`, at `revision`.
    pub fn of(record: &TurnRecord, revision: u64) -> Self {
        Seen {
            revision,
            updated_at: record.updated_at,
            owes: turnpike_core::recovery::leftovers(record).next().is_some(),
            live: LiveTurn::of(record),
        }
    }

    fn state(&self) -> TurnState {
        self.live.state
    }

    fn attempt(&self) -> u32 {
        self.live.attempt
    }
}

#[derive(Debug, Clone)]
struct Entry {
    listed: bool,
    seen: Option<Seen>,
    /// The highest attempt found claimed.
    claimed: Option<u32>,
    /// When this coordinator last saw the turn change (its monotonic clock).
    changed: Instant,
    /// Looked at in full since then.
    looked: bool,
    /// For a turn looked at with back-off: not before then, and the back-off after that.
    next: Instant,
    backoff: Duration,
}

impl Entry {
    fn new(now: Instant, pass: Duration) -> Self {
        Entry {
            listed: false,
            seen: None,
            claimed: None,
            changed: now,
            looked: false,
            next: now,
            backoff: pass,
        }
    }

    /// A change: to be looked at once more, and any back-off starts over.
    fn touch(&mut self, now: Instant, pass: Duration) {
        self.changed = now;
        self.looked = false;
        self.next = now;
        self.backoff = pass;
    }
}

/// How a listed turn is looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    EveryPass,
    Once,
    Backoff,
    Round,
    Never,
}

/// A queued first attempt to look for in the work queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedFirst {
    /// The turn.
    pub turn: TurnId,
    /// Its attempt (the first).
    pub attempt: u32,
    /// Since when it is queued, by the server's clock.
    pub since: Timestamp,
}

/// What one pass must look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Due {
    /// Turns to look at in full, one by one.
    pub full: Vec<TurnId>,
    /// Queued first attempts to look for in the work queue (only in a round).
    pub queued: Vec<QueuedFirst>,
}

/// The due index.
#[derive(Debug)]
pub struct DueIndex {
    timing: Timing,
    entries: HashMap<TurnId, Entry>,
    last_round: Option<Instant>,
}

impl DueIndex {
    /// An empty index.
    pub fn new(timing: Timing) -> Self {
        DueIndex {
            timing,
            entries: HashMap::new(),
            last_round: None,
        }
    }

    /// Forget everything (the watches start over).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.last_round = None;
    }

    /// Turns known (listed or seen).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Turns listed as live.
    pub fn live(&self) -> usize {
        self.entries.values().filter(|e| e.listed).count()
    }

    /// Is nothing known?
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn entry(&mut self, turn: TurnId, now: Instant) -> &mut Entry {
        let pass = self.timing.pass;
        self.entries
            .entry(turn)
            .or_insert_with(|| Entry::new(now, pass))
    }

    /// `turn` entered the live index.
    pub fn listed(&mut self, turn: TurnId, now: Instant) {
        let pass = self.timing.pass;
        let e = self.entry(turn, now);
        if !e.listed {
            e.listed = true;
            e.touch(now, pass);
        }
    }

    /// `turn` left the live index: it ended and its effects are carried out.
    pub fn unlisted(&mut self, turn: &TurnId) {
        self.entries.remove(turn);
    }

    /// `turn`'s record changed (as the watch of records tells, or as a pass read it).
    pub fn record(&mut self, turn: TurnId, seen: Seen, now: Instant) {
        self.seen(turn, seen, now, true);
    }

    /// `turn`'s record as read when the index was built: not a change this coordinator saw
    /// happen, so not looked at for it (a turn that needs looking at is due by its state; a
    /// queued one, in the first round).
    pub fn loaded(&mut self, turn: TurnId, seen: Seen, now: Instant) {
        self.seen(turn, seen, now, false);
    }

    fn seen(&mut self, turn: TurnId, seen: Seen, now: Instant, fresh: bool) {
        let pass = self.timing.pass;
        let known = self.entries.get(&turn);
        if known
            .and_then(|e| e.seen.as_ref())
            .is_some_and(|s| s.revision >= seen.revision)
        {
            return;
        }
        // An ended turn not listed is done with: nothing to keep.
        if seen.state().is_terminal() && !known.is_some_and(|e| e.listed) {
            self.entries.remove(&turn);
            return;
        }
        let e = self.entry(turn, now);
        e.seen = Some(seen);
        e.touch(now, pass);
        e.looked = !fresh;
    }

    /// `turn`'s record was deleted.
    pub fn forgotten(&mut self, turn: &TurnId) {
        if let Some(e) = self.entries.get_mut(turn) {
            e.seen = None;
        }
    }

    /// Attempt `attempt` of `turn` was claimed (by a runner, or cancelled): its lease is
    /// watched at every pass until the turn moves on.
    pub fn claimed(&mut self, turn: TurnId, attempt: u32, now: Instant) {
        let e = self.entry(turn, now);
        if e.claimed.is_none_or(|c| c < attempt) {
            e.claimed = Some(attempt);
        }
    }

    /// Is attempt `attempt` of `turn` still the queued one?
    pub fn still_queued(&self, turn: &TurnId, attempt: u32) -> bool {
        self.entries
            .get(turn)
            .and_then(|e| e.seen.as_ref())
            .is_some_and(|s| s.state() == TurnState::Queued && s.attempt() == attempt)
    }

    fn class(&self, e: &Entry, now: Instant, wall: Timestamp) -> Class {
        let Some(seen) = &e.seen else {
            return Class::EveryPass;
        };
        let owed = matches!(seen.state(), TurnState::Queued | TurnState::PendingRetry);
        match seen.state() {
            s if s.is_terminal() => Class::EveryPass,
            TurnState::Running => Class::EveryPass,
            _ if owed && e.claimed.is_some_and(|c| c >= seen.attempt()) => Class::EveryPass,
            // Once, a pass after its change: did its writer carry out what it owes?
            _ if !e.looked && (owed || seen.owes) => {
                if now.saturating_duration_since(e.changed) >= self.timing.pass {
                    Class::Once
                } else {
                    Class::Never
                }
            }
            TurnState::Queued if seen.attempt() == 1 && !seen.owes => Class::Round,
            // Not due yet: the scheduler holds it (a pass after its due time, it has fired).
            TurnState::PendingRetry
                if seen.live.next_attempt_due.is_some_and(|d| {
                    wall.millis() < d.millis().saturating_add(millis(self.timing.pass))
                }) && !seen.owes =>
            {
                Class::Never
            }
            _ if owed || seen.owes => Class::Backoff,
            _ => Class::Never,
        }
    }

    /// What a pass at `now` (and `wall`, the server's clock as this host reads it) must look
    /// at. A round is taken when it is due and there is something queued to look for.
    pub fn due(&mut self, now: Instant, wall: Timestamp) -> Due {
        let mut due = Due::default();
        let mut round = Vec::new();
        let mut waited = Vec::new();
        for (turn, e) in &self.entries {
            if !e.listed {
                continue;
            }
            match self.class(e, now, wall) {
                Class::EveryPass => due.full.push(turn.clone()),
                Class::Once => waited.push((e.changed, turn)),
                Class::Backoff if e.next <= now => waited.push((e.next, turn)),
                Class::Round => round.push((turn, e)),
                Class::Backoff | Class::Never => {}
            }
        }
        // What is due at every pass first (a lease lapses on its own time); of the rest, those
        // due longest, at most a pass's worth: a burst of new turns is looked at over several
        // passes, and never holds up the next lost runner's discovery.
        waited.sort();
        due.full
            .extend(waited.into_iter().take(PER_PASS).map(|(_, t)| t.clone()));
        // A round's listing costs in proportion to the queue: rounds come further apart as it
        // grows, so that their cost per minute stays flat.
        let every = self
            .timing
            .round
            .max(ROUND_PER_QUEUED.saturating_mul(u32::try_from(round.len()).unwrap_or(u32::MAX)));
        let round_due = self
            .last_round
            .is_none_or(|at| now.saturating_duration_since(at) >= every);
        if round_due && !round.is_empty() {
            self.last_round = Some(now);
            due.queued = round
                .into_iter()
                .filter_map(|(turn, e)| {
                    let seen = e.seen.as_ref()?;
                    Some(QueuedFirst {
                        turn: turn.clone(),
                        attempt: seen.attempt(),
                        since: seen.updated_at,
                    })
                })
                .collect();
        }
        // Records whose listing never came within a long while: nothing will look at them.
        self.entries
            .retain(|_, e| e.listed || now.saturating_duration_since(e.changed) < UNLISTED_KEPT);
        // Oldest first is not needed (every due turn is looked at), but a stable order makes a
        // pass cut short resume fairly: sorted by id.
        due.full.sort();
        due
    }

    /// These turns were looked at in full at `now`: each backs off (doubling, up to a round)
    /// before it is looked at again, unless it is due at every pass.
    pub fn looked_at(&mut self, turns: &[TurnId], now: Instant) {
        let round = self.timing.round;
        for turn in turns {
            if let Some(e) = self.entries.get_mut(turn) {
                if !e.looked {
                    // The look after a change: back-off starts from here.
                    e.looked = true;
                    e.next = now + e.backoff;
                    continue;
                }
                e.next = now + e.backoff;
                e.backoff = (e.backoff * 2).min(round);
            }
        }
    }

    /// The round taken could not be carried out (the work queue could not be listed): take one
    /// at the next pass.
    pub fn round_again(&mut self) {
        self.last_round = None;
    }

    /// These turns must be looked at in full soon (a round did not find their attempt in the
    /// queue): each is due as after a change, a pass's worth at a time.
    pub fn look_again(&mut self, turns: &[TurnId], now: Instant) {
        let pass = self.timing.pass;
        for turn in turns {
            if let Some(e) = self.entries.get_mut(turn) {
                e.looked = false;
                e.changed = now.checked_sub(pass).unwrap_or(e.changed);
            }
        }
    }

    /// Live turns by state, in the order of the states' names (turns listed and whose record
    /// was seen: what [`turnpike_store::views::count_by_state`] counts of the live records).
    pub fn count_by_state(&self) -> Vec<(TurnState, u64)> {
        let mut by_state: std::collections::BTreeMap<&'static str, (TurnState, u64)> =
            std::collections::BTreeMap::new();
        for seen in self.seen_live() {
            by_state
                .entry(seen.state().as_str())
                .or_insert((seen.state(), 0))
                .1 += 1;
        }
        by_state.into_values().collect()
    }

    /// The live turns whose record was seen.
    fn seen_live(&self) -> impl Iterator<Item = &Seen> {
        self.entries
            .values()
            .filter(|e| e.listed)
            .filter_map(|e| e.seen.as_ref())
    }

    /// One page of the live turns that match `query`, newest first (then by id).
    pub fn live_page(&self, query: &LiveQuery) -> LivePage {
        LivePage::of(self.seen_live().map(|s| &s.live), query)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests;
