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
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use turnpike_core::record::TurnState;
use turnpike_core::wire::{ChatErrorCause, ChatRecord};
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
    /// Chats flagged errored: when, and why.
    pub errored: HashMap<ChatId, (Timestamp, Option<ChatErrorCause>)>,
    /// Built, and followed since: passes and counts may rest on it.
    pub ready: bool,
}

/// The index, shared by the task that follows the watches and those that read it.
#[derive(Debug, Clone)]
pub struct Shared(Arc<Mutex<Followed>>);

impl Shared {
    /// An index not built yet.
    pub fn new(timing: Timing) -> Self {
        Shared(Arc::new(Mutex::new(Followed {
            index: DueIndex::new(timing),
            errored: HashMap::new(),
            ready: false,
        })))
    }

    /// The index, to read or move. A poisoned lock (a panic while it was held) is taken
    /// anyway: the index only ever says when to look, never what to decide.
    pub fn lock(&self) -> MutexGuard<'_, Followed> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
            errored: f.errored.values().copied().collect(),
        })
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
    let mut live = views::watch(bus, Watched::Live).await?;
    let mut records = views::watch(bus, Watched::Turns).await?;
    let mut claims = views::watch(bus, Watched::Claims).await?;
    let mut chats = views::watch_current(bus, Watched::Chats).await?;
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
    shared.lock().ready = true;
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
        let _ = turnpike_store::live::drop_key(bus, &entry.key).await;
        return;
    };
    let mut f = shared.lock();
    match entry.operation {
        Operation::Put => f.index.listed(turn, Instant::now()),
        Operation::Delete | Operation::Purge => f.index.unlisted(&turn),
    }
}

fn on_record(shared: &Shared, entry: kv::Entry) {
    let Ok(turn) = TurnId::new(entry.key.as_str()) else {
        return;
    };
    if entry.operation != Operation::Put || entry.value.is_empty() {
        shared.lock().index.forgotten(&turn);
        return;
    }
    match decode_kv::<TurnRecord>(&entry.value) {
        Ok(record) => {
            shared
                .lock()
                .index
                .record(turn, Seen::of(&record, entry.revision), Instant::now())
        }
        // Not decodable: as if unseen, so it is looked at every pass (the sweep reports it).
        Err(_) => shared.lock().index.forgotten(&turn),
    }
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
    let Ok(chat) = ChatId::new(entry.key.as_str()) else {
        return;
    };
    let flag = (entry.operation == Operation::Put)
        .then(|| decode_kv::<ChatRecord>(&entry.value).ok())
        .flatten()
        .and_then(|c| c.errored)
        .map(|e| (e.at, e.cause));
    let mut f = shared.lock();
    match flag {
        Some(flag) => f.errored.insert(chat, flag),
        None => f.errored.remove(&chat),
    };
}
