//! Keeps this coordinator's [`DueIndex`] and read model up to date: built from one listing of
//! the live index and one read of each live record, then moved by every change the watches of
//! the live index, the turn records and the claims deliver; the errored chats from a watch of
//! the chat records (each one's current value, then every change). Watches started before the build miss nothing (a
//! record read in the build and changed during it arrives again, and the newer revision wins).
//! A watch that fails, or ends, rebuilds the index from the start; meanwhile the sweep passes
//! over every live turn, as it would with no index.

use crate::due::{DueIndex, Seen, Timing};
use async_nats::jetstream::kv::{self, Operation};
use futures::StreamExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use turnpike_core::record::TurnState;
use turnpike_core::wire::{
    ChatErrorCause, ChatRecord, ErroredChat, ErroredPage, ErroredQuery, LivePage, LiveQuery,
};
use turnpike_core::{ChatId, Timestamp, TurnId, TurnRecord};
use turnpike_jetstream::{decode_kv, BusError};
use turnpike_store::turns::{self, ApplyError};
use turnpike_store::views::{self, Watched};
use turnpike_store::Bus;

/// Records read at once while the index is built.
const PARALLEL_READS: usize = 32;

/// No chat record for this long while their current values arrive: there are no more.
const CHATS_QUIET: Duration = Duration::from_millis(500);

/// The index and whether it is whole (built, its watches running).
#[derive(Debug)]
pub struct Followed {
    /// The index.
    pub index: DueIndex,
    /// Chats flagged errored, as the lists show them.
    pub errored: HashMap<ChatId, ErroredChat>,
    /// Built, and followed since: passes and counts may rest on it.
    pub ready: bool,
    /// Per followed bucket (live, turns, chats), the revision up to which every write is in
    /// the model: what a view waits for, so it shows every write made before it was asked.
    upto: [u64; 3],
}

/// The buckets whose revisions [`Followed`] tracks, in its order.
const TRACKED: [Watched; 3] = [Watched::Live, Watched::Turns, Watched::Chats];

fn tracked(which: Watched) -> Option<usize> {
    TRACKED.iter().position(|w| *w == which)
}

impl Followed {
    fn saw(&mut self, which: Watched, revision: u64) {
        if let Some(i) = tracked(which) {
            self.upto[i] = self.upto[i].max(revision);
        }
    }
}

/// The index, shared by the task that follows the watches and those that read it.
#[derive(Debug, Clone)]
pub struct Shared(Arc<Inner>);

#[derive(Debug)]
struct Inner {
    followed: Mutex<Followed>,
    /// Told of every change followed.
    moved: Notify,
    gate: Option<Arc<StartGate>>,
}

/// A hold on the follower's start, for tests: before each step of it (each watch started, where
/// the buckets stand read, the build) the follower tells `step` and waits for `proceed`, so a
/// test can write between any two steps: a write the model must count, whatever the order of
/// the steps, or views would wait for it in vain.
#[derive(Debug, Default)]
pub struct StartGate {
    /// Told (one permit) before each step.
    pub step: Notify,
    /// The follower waits for one permit before it takes the step.
    pub proceed: Notify,
}

/// Before a step of the start: hold at the gate, if there is one.
async fn hold(shared: &Shared) {
    if let Some(gate) = &shared.0.gate {
        gate.step.notify_one();
        gate.proceed.notified().await;
    }
}

/// How long a view waits for the model to catch up with the writes made before it was asked;
/// past that it answers with what it has.
const CATCH_UP: Duration = Duration::from_secs(1);

impl Shared {
    /// An index not built yet.
    pub fn new(timing: Timing) -> Self {
        Self::build(timing, None)
    }

    /// An index not built yet, whose follower holds at `gate` as it starts (tests).
    pub fn gated(timing: Timing, gate: Arc<StartGate>) -> Self {
        Self::build(timing, Some(gate))
    }

    fn build(timing: Timing, gate: Option<Arc<StartGate>>) -> Self {
        Shared(Arc::new(Inner {
            followed: Mutex::new(Followed {
                index: DueIndex::new(timing),
                errored: HashMap::new(),
                ready: false,
                upto: [0; 3],
            }),
            moved: Notify::new(),
            gate,
        }))
    }

    /// The index, to read or move. A poisoned lock (a panic while it was held) is taken
    /// anyway: the index only ever says when to look, never what to decide.
    pub fn lock(&self) -> MutexGuard<'_, Followed> {
        self.0
            .followed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wait (a second at most) until the model holds every write made to `buckets` before
    /// this call, so that a view shows what its asker has just seen happen (a page re-drawn
    /// because a bucket changed shows that change). `false` if it did not catch up in time.
    pub async fn catch_up(&self, bus: &Bus, buckets: &[Watched]) -> bool {
        if !self.lock().ready {
            // Not built: the view is read from the buckets instead.
            return false;
        }
        let mut wanted = Vec::with_capacity(buckets.len());
        for which in buckets {
            match (tracked(*which), views::revision(bus, *which).await) {
                (Some(i), Ok(revision)) => wanted.push((i, revision)),
                _ => return false,
            }
        }
        let deadline = tokio::time::Instant::now() + CATCH_UP;
        loop {
            let moved = self.0.moved.notified();
            {
                let f = self.lock();
                if f.ready && wanted.iter().all(|(i, r)| f.upto[*i] >= *r) {
                    return true;
                }
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                let upto = self.lock().upto;
                tracing::debug!(?wanted, ?upto, "the read model did not catch up in time");
                return false;
            }
        }
    }

    fn moved(&self) {
        self.0.moved.notify_waiters();
    }

    /// Live turns by state, if the index is whole.
    pub fn count_by_state(&self) -> Option<Vec<(TurnState, u64)>> {
        let f = self.lock();
        f.ready.then(|| f.index.count_by_state())
    }

    /// What the cluster view needs of the read model, if it is whole: the live turns by state,
    /// and when and why each errored chat was flagged.
    pub fn status(&self) -> Option<Status> {
        let f = self.lock();
        f.ready.then(|| Status {
            live: f.index.count_by_state(),
            errored: f
                .errored
                .values()
                .map(|c| (c.error.at, c.error.cause))
                .collect(),
        })
    }

    /// A page of the live turns, if the index is whole.
    pub fn live_page(&self, query: &LiveQuery) -> Option<LivePage> {
        let f = self.lock();
        f.ready.then(|| f.index.live_page(query))
    }

    /// A page of the errored chats, most recently flagged first (then by chat), if the model
    /// is whole.
    pub fn errored_page(&self, query: &ErroredQuery) -> Option<ErroredPage> {
        let f = self.lock();
        if !f.ready {
            return None;
        }
        Some(ErroredPage::of(f.errored.values(), query))
    }
}

/// What the cluster view needs of the read model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// Live turns by state.
    pub live: Vec<(TurnState, u64)>,
    /// When and why each errored chat was flagged.
    pub errored: Vec<(Timestamp, Option<ChatErrorCause>)>,
}

/// Follow the watches into `shared` until `shutdown`.
pub async fn follow(bus: Bus, shared: Shared, shutdown: CancellationToken) {
    loop {
        let followed = follow_once(&bus, &shared, &shutdown).await;
        {
            let mut f = shared.lock();
            f.ready = false;
            f.index.clear();
            f.errored.clear();
            f.upto = [0; 3];
        }
        match followed {
            Ok(()) => return,
            Err(e) => {
                warn!(error = %e, "lost the watches of the live turns; rebuilding the sweep's index")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}

/// Build the index, then follow it; `Ok` only at shutdown.
async fn follow_once(
    bus: &Bus,
    shared: &Shared,
    shutdown: &CancellationToken,
) -> Result<(), BusError> {
    hold(shared).await;
    let mut live = views::watch(bus, Watched::Live).await?;
    hold(shared).await;
    let mut records = views::watch(bus, Watched::Turns).await?;
    hold(shared).await;
    let mut claims = views::watch(bus, Watched::Claims).await?;
    hold(shared).await;
    let mut chats = views::watch_current(bus, Watched::Chats).await?;
    hold(shared).await;
    // Read after the watches started: every write up to here is in what the build reads (or
    // the chats' current values), every later one comes through a watch. (Read before them, a
    // write in between would be in the model but never counted: views would wait for it.)
    let mut baseline = [0; 3];
    for (i, which) in TRACKED.iter().enumerate() {
        baseline[i] = views::revision(bus, *which).await?;
    }
    hold(shared).await;
    let started = Instant::now();
    // The chats' current values first. An empty bucket sends none: a moment's quiet ends it
    // (at worst the errored count lags for a moment; nothing is decided on it).
    while let Ok(entry) = tokio::time::timeout(CHATS_QUIET, chats.next()).await {
        let entry = next(entry, "chats")?;
        let current = entry.seen_current;
        on_chat(shared, entry);
        if current {
            break;
        }
    }
    let built = build(bus, shared).await?;
    {
        let mut f = shared.lock();
        for (i, which) in TRACKED.iter().enumerate() {
            f.saw(*which, baseline[i]);
        }
        f.ready = true;
    }
    shared.moved();
    info!(live = built, took = ?started.elapsed(), "sweep index built");
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            e = live.next() => on_live(bus, shared, next(e, "live turns")?).await,
            e = records.next() => on_record(shared, next(e, "turn records")?),
            e = claims.next() => on_claim(shared, next(e, "claims")?),
            e = chats.next() => on_chat(shared, next(e, "chats")?),
        }
    }
}

fn next(
    entry: Option<Result<kv::Entry, kv::WatcherError>>,
    what: &str,
) -> Result<kv::Entry, BusError> {
    match entry {
        Some(Ok(entry)) => Ok(entry),
        Some(Err(e)) => Err(BusError::kv(format!("watch {what}"), e)),
        None => Err(BusError::kv(
            format!("watch {what}"),
            std::io::Error::other("the watch ended"),
        )),
    }
}

/// List the live turns and read each one's record once. How many are live.
async fn build(bus: &Bus, shared: &Shared) -> Result<usize, BusError> {
    let now = Instant::now();
    let mut ids = Vec::new();
    for key in turnpike_store::live::keys(bus).await? {
        match TurnId::new(key.as_str()) {
            Ok(turn) => ids.push(turn),
            // A key naming no turn (written by hand, or by a bug): the sweep would drop it.
            Err(_) => {
                let _ = turnpike_store::live::drop_key(bus, &key).await;
            }
        }
    }
    let live = ids.len();
    {
        let mut f = shared.lock();
        for turn in &ids {
            f.index.listed(turn.clone(), now);
        }
    }
    let mut reads = futures::stream::iter(ids)
        .map(|turn| async move { (turns::load(bus, &turn).await, turn) })
        .buffer_unordered(PARALLEL_READS);
    while let Some((read, turn)) = reads.next().await {
        match read {
            Ok(Some(v)) => shared
                .lock()
                .index
                .loaded(turn, Seen::of(&v.record, v.revision), now),
            // No record (yet): listed without one, it is looked at every pass.
            Ok(None) => {}
            Err(ApplyError::Bus(e)) => return Err(e),
            // Unreadable: looked at every pass, where the sweep says what is wrong with it.
            Err(e) => warn!(turn_id = %turn, error = %e, "live turn's record unreadable"),
        }
    }
    Ok(live)
}

async fn on_live(bus: &Bus, shared: &Shared, entry: kv::Entry) {
    let Ok(turn) = TurnId::new(entry.key.as_str()) else {
        shared.lock().saw(Watched::Live, entry.revision);
        let _ = turnpike_store::live::drop_key(bus, &entry.key).await;
        return;
    };
    {
        let mut f = shared.lock();
        match entry.operation {
            Operation::Put => f.index.listed(turn, Instant::now()),
            Operation::Delete | Operation::Purge => f.index.unlisted(&turn),
        }
        f.saw(Watched::Live, entry.revision);
    }
    shared.moved();
}

fn on_record(shared: &Shared, entry: kv::Entry) {
    let seen = TurnId::new(entry.key.as_str()).ok().map(|turn| {
        let record = (entry.operation == Operation::Put && !entry.value.is_empty())
            .then(|| decode_kv::<TurnRecord>(&entry.value).ok())
            .flatten();
        (turn, record)
    });
    {
        let mut f = shared.lock();
        match seen {
            Some((turn, Some(record))) => {
                f.index
                    .record(turn, Seen::of(&record, entry.revision), Instant::now())
            }
            // Deleted, or not decodable: as if unseen, so it is looked at every pass (the
            // sweep reports what is wrong with it).
            Some((turn, None)) => f.index.forgotten(&turn),
            None => {}
        }
        f.saw(Watched::Turns, entry.revision);
    }
    shared.moved();
}

fn on_claim(shared: &Shared, entry: kv::Entry) {
    if entry.operation != Operation::Put {
        return;
    }
    // `<turn>.<attempt>`: ids never hold a dot.
    let Some((turn, attempt)) = entry.key.rsplit_once('.') else {
        return;
    };
    if let (Ok(turn), Ok(attempt)) = (TurnId::new(turn), attempt.parse::<u32>()) {
        shared.lock().index.claimed(turn, attempt, Instant::now());
    }
}

fn on_chat(shared: &Shared, entry: kv::Entry) {
    let chat = ChatId::new(entry.key.as_str()).ok();
    let flag = (entry.operation == Operation::Put)
        .then(|| decode_kv::<ChatRecord>(&entry.value).ok())
        .flatten()
        .and_then(|c| ErroredChat::of(&c));
    {
        let mut f = shared.lock();
        match (chat, flag) {
            (Some(chat), Some(flag)) => {
                f.errored.insert(chat, flag);
            }
            (Some(chat), None) => {
                f.errored.remove(&chat);
            }
            (None, _) => {}
        }
        f.saw(Watched::Chats, entry.revision);
    }
    shared.moved();
}
