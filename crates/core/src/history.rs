//! A chat's conversation history, bounded in entries and in bytes. Pure: the chat record's
//! `history` and `history_dropped` go in, the new ones come out.
//!
//! The byte budget counts *encoded* bytes ([`entry_len`]: an entry as JSON or MessagePack
//! writes it, whichever is larger), so a history of control characters or quotes, which JSON
//! escapes to several bytes each, is held to the same size as any other. Every entry is cut to
//! the budget, and the oldest entries are dropped first until the whole fits, so no chat can
//! grow its record, or the work items made from it, past what NATS carries (a chat of long
//! replies used to wedge at about 18 turns). When entries were dropped, the history starts with
//! a [`Role::Note`] entry that says how many.

use crate::sizes;
use crate::texts;
use crate::wire::{HistoryEntry, Role};

/// How much history a chat keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Entries (user and bot messages), the note not counted.
    pub entries: usize,
    /// Encoded bytes of the entries ([`entry_len`] each), the note not counted.
    pub bytes: usize,
}

/// What an entry adds to a history besides its text's encoded bytes: `{"role":"user","text":}`
/// and a comma in JSON (more than MessagePack's map, keys and role).
pub const ENTRY_OVERHEAD: usize = 24;

/// The encoded bytes an entry takes in a history.
pub fn entry_len(e: &HistoryEntry) -> usize {
    ENTRY_OVERHEAD + sizes::str_len(&e.text)
}

/// Append a finished turn's entries and cut to the budget. `dropped` counts entries left out so
/// far (over the chat's life) and is raised by what this call leaves out.
pub fn append(
    history: &mut Vec<HistoryEntry>,
    dropped: &mut u64,
    new: impl IntoIterator<Item = HistoryEntry>,
    budget: Budget,
) {
    history.retain(|e| e.role != Role::Note);
    let text_max = budget.bytes.saturating_sub(ENTRY_OVERHEAD);
    history.extend(new.into_iter().map(|mut e| {
        if let std::borrow::Cow::Owned(cut) = sizes::cut(&e.text, text_max) {
            e.text = cut;
        }
        e
    }));
    let mut bytes: usize = history.iter().map(entry_len).sum();
    let mut cut = 0;
    while cut < history.len() && (history.len() - cut > budget.entries || bytes > budget.bytes) {
        bytes -= entry_len(&history[cut]);
        cut += 1;
    }
    history.drain(..cut);
    *dropped += cut as u64;
    if *dropped > 0 {
        history.insert(
            0,
            HistoryEntry {
                role: Role::Note,
                text: texts::history_cut_note(*dropped),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn e(role: Role, text: &str) -> HistoryEntry {
        HistoryEntry {
            role,
            text: text.to_owned(),
        }
    }

    #[test]
    fn within_budget_nothing_is_dropped_and_no_note_is_added() {
        let mut h = vec![e(Role::User, "a")];
        let mut dropped = 0;
        let budget = Budget {
            entries: 10,
            bytes: 100,
        };
        append(&mut h, &mut dropped, [e(Role::Bot, "b")], budget);
        assert_eq!(
            entry_len(&h[0]),
            ENTRY_OVERHEAD + 6,
            "\"a\" in MessagePack's five-byte header"
        );
        assert_eq!(h, vec![e(Role::User, "a"), e(Role::Bot, "b")]);
        assert_eq!(dropped, 0);
    }

    #[test]
    fn the_oldest_go_first_and_the_note_counts_every_one_ever_dropped() {
        let mut h = Vec::new();
        let mut dropped = 0;
        let budget = Budget {
            entries: 3,
            bytes: 1000,
        };
        append(
            &mut h,
            &mut dropped,
            [e(Role::User, "1"), e(Role::Bot, "2")],
            budget,
        );
        append(
            &mut h,
            &mut dropped,
            [e(Role::User, "3"), e(Role::Bot, "4")],
            budget,
        );
        assert_eq!(dropped, 1);
        assert_eq!(h[0], e(Role::Note, &texts::history_cut_note(1)));
        assert_eq!(
            &h[1..],
            &[e(Role::Bot, "2"), e(Role::User, "3"), e(Role::Bot, "4")]
        );
        append(
            &mut h,
            &mut dropped,
            [e(Role::User, "5"), e(Role::Bot, "6")],
            budget,
        );
        assert_eq!(dropped, 3);
        assert_eq!(h[0], e(Role::Note, &texts::history_cut_note(3)));
        assert_eq!(h.len(), 4, "one note, three entries: {h:?}");
    }

    #[test]
    fn bytes_bound_the_history_and_an_entry_larger_than_the_budget_is_cut() {
        let mut h = Vec::new();
        let mut dropped = 0;
        let budget = Budget {
            entries: 50,
            bytes: 1000,
        };
        for _ in 0..20 {
            append(
                &mut h,
                &mut dropped,
                [e(Role::Bot, &"x".repeat(300))],
                budget,
            );
        }
        let bytes: usize = h
            .iter()
            .filter(|e| e.role != Role::Note)
            .map(entry_len)
            .sum();
        assert!(bytes <= 1000, "{bytes}");
        assert_eq!(h.len(), 4, "note + three 300-byte entries (329 encoded)");
        append(
            &mut h,
            &mut dropped,
            [e(Role::Bot, &"y".repeat(5000))],
            budget,
        );
        assert_eq!(h.len(), 2, "note + the one cut entry: {h:?}");
        assert!(entry_len(&h[1]) <= 1000 && h[1].text.ends_with("[cut: 5000 bytes in all]"));
    }

    proptest! {
        /// Whatever turns a chat has, its history stays within budget and keeps the newest
        /// entries in order.
        #[test]
        fn history_always_fits_its_budget(
            turns in prop::collection::vec(prop::collection::vec((0usize..3000, 0usize..3), 0..4), 1..40),
            entries in 1usize..20,
            bytes in 100usize..5000,
        ) {
            let budget = Budget { entries, bytes };
            let mut h = Vec::new();
            let mut dropped = 0u64;
            let mut all = Vec::new();
            for (t, lens) in turns.iter().enumerate() {
                // Letters, quotes (two bytes each in JSON) and control characters (six).
                let new: Vec<_> = lens.iter().enumerate()
                    .map(|(i, (n, kind))| {
                        let fill = ["z", "\"", "\u{1}"][*kind];
                        e(Role::Bot, &format!("{t}.{i}:{}", fill.repeat(*n)))
                    })
                    .collect();
                all.extend(new.clone());
                append(&mut h, &mut dropped, new, budget);
                let kept: Vec<_> = h.iter().filter(|e| e.role != Role::Note).collect();
                prop_assert!(kept.len() <= entries);
                prop_assert!(kept.iter().map(|e| entry_len(e)).sum::<usize>() <= bytes);
                // What a work item or record carries: within the budget, the note included.
                let encoded = sizes::encoded_len(&h);
                prop_assert!(encoded <= bytes + sizes::HISTORY_NOTE_MAX + 2, "{} > {}", encoded, bytes);
                prop_assert_eq!(kept.len() as u64 + dropped, all.len() as u64);
                prop_assert_eq!(h.first().is_some_and(|e| e.role == Role::Note), dropped > 0);
                // The kept ones are the newest, in order, each whole or a cut of its original.
                for (k, orig) in kept.iter().zip(&all[all.len() - kept.len()..]) {
                    let kept_part = k.text.split(" … [cut: ").next().unwrap_or("");
                    prop_assert!(orig.text.starts_with(kept_part), "{:?} from {:?}", k.text, orig.text);
                    prop_assert!(k.text == orig.text || k.text.ends_with(" bytes in all]"));
                }
            }
        }
    }
}
