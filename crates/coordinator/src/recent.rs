//! The turn records this coordinator last wrote, so that a turn's next event is applied at that
//! revision without reading the record first. Decides nothing: a stale entry only fails its
//! compare-and-set (the record is then read, as after any conflict), and a decision not to write
//! is always made on a record read from the bucket (`turns::apply_events_from`). A turn's events
//! are applied here one batch at a time (`batches`), so each batch finds the last one's revision.

use std::collections::HashMap;
use std::sync::Mutex;
use turnpike_core::{TurnId, TurnRecord};
use turnpike_store::turns::Versioned;

/// What the cache may hold, by the records' estimated size: a record carries its message and the
/// chat's history, so a count alone would not bound memory.
const BUDGET_BYTES: usize = 16 << 20;

/// A record larger than this is not kept (it would crowd out dozens of ordinary ones).
const LARGEST: usize = BUDGET_BYTES / 64;

#[derive(Default)]
pub(crate) struct Recent {
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    records: HashMap<TurnId, (Versioned, usize)>,
    bytes: usize,
}

/// The bytes a record takes, roughly: its texts and a fixed overhead for the rest.
fn estimate(record: &TurnRecord) -> usize {
    1024 + record.message.text.len() + record.history.iter().map(|h| h.text.len()).sum::<usize>()
}

impl Recent {
    /// The record as this coordinator last wrote it, if it still keeps it.
    pub(crate) fn get(&self, turn: &TurnId) -> Option<Versioned> {
        let entries = self.inner.lock().ok()?;
        entries.records.get(turn).map(|(v, _)| v.clone())
    }

    /// Keep `current` (a record just written or read) unless a newer revision is kept already;
    /// an ended turn gets no more events worth a saved read.
    pub(crate) fn remember(&self, current: Versioned) {
        let Ok(mut entries) = self.inner.lock() else {
            return;
        };
        let turn = current.record.turn.clone();
        if entries
            .records
            .get(&turn)
            .is_some_and(|(kept, _)| kept.revision > current.revision)
        {
            return;
        }
        entries.remove(&turn);
        let finished = current.record.state.is_terminal();
        let size = estimate(&current.record);
        if finished || size > LARGEST {
            return;
        }
        if entries.bytes + size > BUDGET_BYTES {
            // Dropping everything is cheap and rare: each dropped turn costs one read later.
            entries.records.clear();
            entries.bytes = 0;
        }
        entries.bytes += size;
        entries.records.insert(turn, (current, size));
    }

    /// Forget a turn (after a failure: its next event reads the record).
    pub(crate) fn forget(&self, turn: &TurnId) {
        if let Ok(mut entries) = self.inner.lock() {
            entries.remove(turn);
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.inner.lock().map(|e| e.bytes).unwrap_or(0)
    }
}

impl Entries {
    fn remove(&mut self, turn: &TurnId) {
        if let Some((_, size)) = self.records.remove(turn) {
            self.bytes -= size;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use turnpike_core::lifecycle::{self, NewTurn};
    use turnpike_core::wire::InboundMessage;
    use turnpike_core::{ChatId, Timestamp};

    fn versioned(id: &str, revision: u64, text_len: usize) -> Versioned {
        let chat = ChatId::new("chat").expect("chat id");
        let message = InboundMessage::new(chat, id, "x".repeat(text_len), None);
        let (record, _) = lifecycle::create(
            NewTurn {
                turn: message.turn(),
                message,
                history: Vec::new(),
                max_turn_retry: 3,
                retry_delay: std::time::Duration::from_secs(10),
                rerun_of: None,
                created_by: None,
                admit_now: true,
            },
            Timestamp::from_millis(1),
        );
        Versioned { record, revision }
    }

    #[test]
    fn keeps_the_newest_revision_of_a_turn() {
        let recent = Recent::default();
        let v5 = versioned("m1", 5, 10);
        let turn = v5.record.turn.clone();
        recent.remember(v5.clone());
        recent.remember(versioned("m1", 3, 10));
        assert_eq!(recent.get(&turn).map(|v| v.revision), Some(5));
        recent.remember(versioned("m1", 7, 10));
        assert_eq!(recent.get(&turn).map(|v| v.revision), Some(7));
        assert_eq!(recent.bytes(), estimate(&v5.record));
        recent.forget(&turn);
        assert!(recent.get(&turn).is_none());
        assert_eq!(recent.bytes(), 0);
    }

    #[test]
    fn an_ended_turn_is_dropped() {
        let recent = Recent::default();
        let mut ended = versioned("m1", 5, 10);
        let turn = ended.record.turn.clone();
        recent.remember(ended.clone());
        ended.record.state = turnpike_core::TurnState::Done;
        ended.revision = 6;
        recent.remember(ended);
        assert!(recent.get(&turn).is_none());
        assert_eq!(recent.bytes(), 0);
    }

    #[test]
    fn memory_stays_within_the_budget() {
        let recent = Recent::default();
        let big = versioned("big", 1, LARGEST + 1);
        recent.remember(big.clone());
        assert!(recent.get(&big.record.turn).is_none(), "too large to keep");
        for i in 0..200 {
            recent.remember(versioned(&format!("m{i}"), 1, LARGEST - 2048));
            assert!(recent.bytes() <= BUDGET_BYTES);
        }
        assert!(recent.get(&versioned("m199", 1, 0).record.turn).is_some());
    }
}
