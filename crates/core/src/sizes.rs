//! Sizes in *encoded* bytes: what a value takes on the wire, in JSON or MessagePack, whichever is
//! larger. Every budget Turnpike keeps (a message, the history, an agent's error, a quoted name)
//! is counted this way, so that a text of control characters (six bytes each in JSON) or of
//! quotes (two) can never push a record past what NATS carries, and [`Budgets`] says, from the
//! configuration alone, that every payload Turnpike builds fits `max_payload`.
//!
//! Pure: the bounds are checked by property tests over the real encoders
//! (`tests/sizes.rs` drives the whole lifecycle with values at every limit).

use serde::Serialize;
use std::borrow::Cow;

/// NATS's default `max_payload` (1 MiB).
pub const NATS_DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// Bytes kept free in every message for its headers (content type, dedup id, fence and schedule
/// headers, Turnpike's own): what NATS counts against `max_payload` besides the payload.
pub const HEADERS_MAX: usize = 2 * 1024;

/// Bytes of a value from outside (a name, an id, a reason) quoted in a notice, a dead letter's
/// reason or a log line.
pub const QUOTE_MAX: usize = 160;

/// Bounds of the fields of an inbound message that come from outside, in encoded bytes (the
/// text is bounded by `message_max_bytes`, with the whole message).
pub const MESSAGE_ID_MAX: usize = 256;
/// The sender's name, in encoded bytes.
pub const SENDER_MAX: usize = 256;
/// A file name: one path component on every file system Turnpike writes attachments to.
pub const ATTACHMENT_NAME_MAX: usize = 255;
/// An attachment's object name, in encoded bytes.
pub const ATTACHMENT_OBJECT_MAX: usize = 512;
/// An operator's name, as recorded with a kill, a re-run or a clear.
pub const OPERATOR_MAX: usize = 128;
/// An operator request's id (a re-run's, so a second click makes no second turn).
pub const REQUEST_ID_MAX: usize = 128;

/// An attempt's error text (what the agent reported, what the engine said) as kept in an exit
/// report and the turn record.
pub const ERROR_MAX: usize = 4 * 1024;
/// A reason Turnpike writes into a record (why a turn failed for good, why a chat is flagged).
pub const REASON_MAX: usize = 1024;

/// Everything of a turn record but its message, history, attempts and outbox: ids, times,
/// counters, the kill, the outcome, the notice (a check in the tests measures the worst case).
pub const RECORD_FIXED_MAX: usize = 4 * 1024;
/// One attempt in a turn record at its largest: its exit report with an error of [`ERROR_MAX`],
/// its runner, its times, where its replies are, its preamble.
pub const ATTEMPT_MAX: usize = 6 * 1024;
/// One effect in a record's outbox at its largest.
pub const EFFECT_MAX: usize = 2 * 1024;
/// Effects an outbox holds at most: the current attempt's dispatch (an earlier one leaves with
/// the write that shows its attempt began), a kill, the notice, the errored flag, the end
/// (`lifecycle` property tests: never more than six).
pub const OUTBOX_EFFECTS_MAX: usize = 8;
/// A work item or runner event without its message, history or exit report.
pub const ENVELOPE_MAX: usize = 2 * 1024;
/// One turn id in a chat's queue (a 26-character id, quoted, and a comma).
pub const QUEUED_TURN_MAX: usize = 32;
/// Operators' clears a chat record remembers (the newest).
pub const CLEARED_KEPT: usize = 16;
/// Everything of a chat record but its history and queue.
pub const CHAT_FIXED_MAX: usize = 4 * 1024 + CLEARED_KEPT * 256;
/// A history's note ("[N earlier messages … left out …]") with its entry around it.
pub const HISTORY_NOTE_MAX: usize = 160;

/// The bytes serde_json writes for `s`, quotes included: `"` and `\` take two, the control
/// characters below 0x20 two (`\n`, `\t`, …) or six (`\u0001`), everything else as in UTF-8.
pub fn json_str_len(s: &str) -> usize {
    2 + s.bytes().map(json_byte_len).sum::<usize>()
}

fn json_byte_len(b: u8) -> usize {
    match b {
        b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
        0x00..=0x1f => 6,
        _ => 1,
    }
}

/// The bytes `s` takes in either codec, the larger: JSON's escaped form, or MessagePack's raw
/// bytes behind a header of up to five.
pub fn str_len(s: &str) -> usize {
    json_str_len(s).max(s.len() + 5)
}

/// The encoded size of `value`: the larger of its JSON and its MessagePack (named fields) form.
/// A value that cannot be encoded counts as `usize::MAX` (it fits nowhere).
pub fn encoded_len<T: Serialize + ?Sized>(value: &T) -> usize {
    let mut json = Counter(0);
    let mut msgpack = Counter(0);
    let json_ok = serde_json::to_writer(&mut json, value).is_ok();
    let msgpack_ok = rmp_serde::encode::write_named(&mut msgpack, value).is_ok();
    if json_ok && msgpack_ok {
        json.0.max(msgpack.0)
    } else {
        usize::MAX
    }
}

/// A writer that only counts.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `text` cut so that it takes at most `max` encoded bytes ([`str_len`]), at a character
/// boundary, ending with a marker that says how long it was; unchanged if it fits. A bound too
/// small for the marker yields what of the marker fits.
pub fn cut(text: &str, max: usize) -> Cow<'_, str> {
    if str_len(text) <= max {
        return Cow::Borrowed(text);
    }
    let marker = format!(" … [cut: {} bytes in all]", text.len());
    // The marker is plain ASCII and a few non-ASCII bytes: it encodes as itself.
    let room = max.saturating_sub(str_len(&marker));
    let mut used = 0;
    let mut end = 0;
    for (i, c) in text.char_indices() {
        let mut buf = [0u8; 4];
        let w: usize = c.encode_utf8(&mut buf).bytes().map(json_byte_len).sum();
        if used + w > room {
            break;
        }
        used += w;
        end = i + c.len_utf8();
    }
    let mut out = String::with_capacity(end + marker.len());
    out.push_str(&text[..end]);
    out.push_str(&marker);
    // Only if `max` is smaller than the marker itself: shorten the marker, never exceed `max`.
    while str_len(&out) > max && !out.is_empty() {
        out.pop();
    }
    Cow::Owned(out)
}

/// A value from outside, quoted for a notice, a dead letter's reason or a log line: in quotes
/// with Rust's escapes, cut to [`QUOTE_MAX`] bytes with a marker saying how long it was, so no
/// name or id a sender chose can make what quotes it large.
pub fn quote(value: &str) -> String {
    const KEEP: usize = QUOTE_MAX - 40;
    let mut shown = String::new();
    let mut cut_at = None;
    for (i, c) in value.char_indices() {
        let escaped: String = c.escape_debug().collect();
        if shown.len() + escaped.len() > KEEP {
            cut_at = Some(i);
            break;
        }
        shown.push_str(&escaped);
    }
    match cut_at {
        None => format!("\"{shown}\""),
        Some(_) => format!("\"{shown}\"… ({} bytes in all)", value.len()),
    }
}

/// What the configuration allows each growing part of a payload, in encoded bytes, and what
/// that makes of every payload Turnpike builds. [`Budgets::check`] is run on the configuration
/// before anything starts: a configuration whose largest payload would not fit is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// The servers' `max_payload`.
    pub max_payload: usize,
    /// An inbound message, whole (`message_max_bytes`); also one bot message's or status line's
    /// text.
    pub message: usize,
    /// The history given to a turn, entries and structure counted (`history_max_bytes`).
    pub history: usize,
    /// Attempts a turn may get.
    pub attempts: u32,
    /// Turns a chat may have waiting (`chat_queue_max`).
    pub chat_queue: usize,
}

/// A configuration whose largest payload would not fit `max_payload`: which payload, how large
/// it may grow, and the room there is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} may grow to {size} bytes, but max_payload {max_payload} leaves {room} for it")]
pub struct TooLarge {
    /// What it is.
    pub what: &'static str,
    /// How large it may grow.
    pub size: usize,
    /// The server's `max_payload`.
    pub max_payload: usize,
    /// What `max_payload` leaves for it.
    pub room: usize,
}

impl Budgets {
    /// The history's whole encoded size at most: its entries within budget, the note, brackets.
    pub fn history_max(&self) -> usize {
        self.history + HISTORY_NOTE_MAX + 2
    }

    /// A work item, or the input an agent is given, at its largest.
    pub fn work_item_max(&self) -> usize {
        ENVELOPE_MAX + self.message + self.history_max()
    }

    /// A turn record at its largest, at any step of its life.
    pub fn record_max(&self) -> usize {
        let attempts = self.attempts.max(1) as usize;
        RECORD_FIXED_MAX
            + self.message
            + self.history_max()
            + attempts * ATTEMPT_MAX
            + OUTBOX_EFFECTS_MAX * EFFECT_MAX
    }

    /// A chat record at its largest: its history, its queue, its flag and the clears it keeps.
    pub fn chat_record_max(&self) -> usize {
        CHAT_FIXED_MAX + self.history_max() + self.chat_queue * QUEUED_TURN_MAX
    }

    /// A runner event at its largest (an exit report; progress is cut to `message`).
    pub fn event_max(&self) -> usize {
        ENVELOPE_MAX + ATTEMPT_MAX.max(self.message)
    }

    /// An outbound item (a bot message, a status, a notice) at its largest.
    pub fn outbound_max(&self) -> usize {
        ENVELOPE_MAX + self.message
    }

    /// The room a payload has: `max_payload` less the headers.
    pub fn room(&self) -> usize {
        self.max_payload.saturating_sub(HEADERS_MAX)
    }

    /// Does every payload fit? The first that does not is named.
    pub fn check(&self) -> Result<(), TooLarge> {
        let room = self.room();
        for (what, size) in [
            ("the turn record", self.record_max()),
            ("the work item", self.work_item_max()),
            ("the chat record", self.chat_record_max()),
            ("a runner event", self.event_max()),
            ("a chat message", self.outbound_max()),
        ] {
            if size > room {
                return Err(TooLarge {
                    what,
                    size,
                    max_payload: self.max_payload,
                    room,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn json_lengths_follow_serde_json() {
        for s in [
            "",
            "plain",
            "\"quoted\"",
            "back\\slash",
            "\u{1}\u{1f}\n\t\r\u{8}\u{c}",
            "é😀",
            "\u{7f}",
        ] {
            assert_eq!(
                json_str_len(s),
                serde_json::to_vec(s).expect("encodes").len(),
                "{s:?}"
            );
        }
    }

    #[test]
    fn a_cut_text_fits_its_bound_and_says_how_long_it_was() {
        let long = "\u{1}".repeat(60_000);
        let cut = cut(&long, 1000);
        assert!(str_len(&cut) <= 1000, "{}", str_len(&cut));
        assert!(cut.ends_with(" … [cut: 60000 bytes in all]"), "{cut:?}");
        assert!(cut.starts_with('\u{1}'));
        assert_eq!(super::cut("fits", 100), "fits");
        // Smaller than the marker: never over the bound (the empty string aside), never a panic.
        assert!(str_len(&super::cut(&long, 20)) <= 20);
        assert_eq!(super::cut(&long, 0), "");
    }

    #[test]
    fn a_quote_is_small_whatever_it_quotes() {
        assert_eq!(quote("report.pdf"), "\"report.pdf\"");
        let q = quote(&"\"".repeat(300_000));
        assert!(q.len() <= QUOTE_MAX, "{}", q.len());
        assert!(q.ends_with("(300000 bytes in all)"), "{q}");
        let q = quote(&"\u{1}".repeat(1000));
        assert!(q.len() <= QUOTE_MAX, "{}", q.len());
    }

    #[test]
    fn the_defaults_fit_nats_default_max_payload() {
        let b = Budgets {
            max_payload: NATS_DEFAULT_MAX_PAYLOAD,
            message: 64 * 1024,
            history: 256 * 1024,
            attempts: 3,
            chat_queue: 1000,
        };
        assert_eq!(b.check(), Ok(()));
        let too_many = Budgets {
            attempts: 1000,
            ..b
        };
        let err = too_many
            .check()
            .expect_err("a thousand attempts do not fit");
        assert_eq!(err.what, "the turn record");
    }

    fn any_text() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                Just('\u{1}'),
                Just('"'),
                Just('\\'),
                Just('\n'),
                Just('é'),
                Just('😀'),
                any::<char>(),
            ],
            0..400,
        )
        .prop_map(|cs| cs.into_iter().collect())
    }

    proptest! {
        /// Whatever the text, its cut fits the bound in both codecs, and a text that fits is
        /// left alone.
        #[test]
        fn cuts_fit_in_both_codecs(text in any_text(), max in 64usize..600) {
            let cut = cut(&text, max);
            prop_assert!(encoded_len(&*cut) <= max);
            if str_len(&text) <= max {
                prop_assert_eq!(&*cut, text.as_str());
            } else {
                let kept = cut.split(" … [cut: ").next().unwrap_or("");
                prop_assert!(text.starts_with(kept));
            }
        }

        #[test]
        fn str_len_bounds_both_codecs(text in any_text()) {
            prop_assert!(encoded_len(text.as_str()) <= str_len(&text));
        }
    }
}
