//! The exact words a user sees. Changing any of these changes the product contract.

/// Sent once when every attempt died without a bot message. `attempts` is the number actually made.
pub fn give_up_notice(attempts: u32) -> String {
    format!(
        "⚠ Agent couldn't complete this request after {}.",
        count(attempts.into(), "attempt", "attempts")
    )
}

/// `n` and its noun in the right number: "1 attempt", "3 attempts", "0 attempts".
pub fn count(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Sent when a turn failed and was not retried (agent-reported failure, could not start, or a death
/// after a bot message already landed).
pub const PLAIN_FAILURE_NOTICE: &str =
    "Failed: agent error on that message. Try rephrasing or send a different message.";

/// Sent when a clean run produced no bot message at all.
pub const SILENT_TURN_NOTICE: &str = "⚠ I couldn't produce a reply to that — please re-send.";

/// Prepended (with a newline after it) to the prompt of attempt `attempt` ≥ 2 of `of`.
pub fn retry_preamble(attempt: u32, of: u32) -> String {
    format!(
        "<system-note>This is retry attempt {attempt} of {of}. The previous attempt was killed before completing. Be conservative with resource usage.</system-note>"
    )
}

/// The prompt an attempt's agent sees: the message text, behind the retry preamble from attempt 2 on.
pub fn prompt_for_attempt(text: &str, attempt: u32, of: u32) -> String {
    if attempt >= 2 {
        format!("{}\n{text}", retry_preamble(attempt, of))
    } else {
        text.to_owned()
    }
}

/// `text` cut to at most `max` bytes (at a character boundary), with a marker saying how long it
/// was; unchanged if it fits. Oversize replies, errors and history entries are cut, never dropped.
pub fn truncate(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if text.len() <= max {
        return std::borrow::Cow::Borrowed(text);
    }
    let marker = format!(" … [cut: {} bytes in all]", text.len());
    let mut end = max.saturating_sub(marker.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    std::borrow::Cow::Owned(format!("{}{marker}", &text[..end]))
}

/// The history entry that stands for entries left out to keep a chat's history in its budget.
pub fn history_cut_note(dropped: u64) -> String {
    let verb = if dropped == 1 { "was" } else { "were" };
    let dropped = count(dropped, "earlier message", "earlier messages");
    format!("[{dropped} of this chat {verb} left out to keep the history within its size limit]")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_agree_in_number() {
        assert_eq!(count(1, "attempt", "attempts"), "1 attempt");
        assert_eq!(count(0, "attempt", "attempts"), "0 attempts");
        assert_eq!(count(3, "attempt", "attempts"), "3 attempts");
        assert_eq!(
            give_up_notice(1),
            "⚠ Agent couldn't complete this request after 1 attempt."
        );
        assert!(history_cut_note(1).starts_with("[1 earlier message of this chat was left out"));
        assert!(history_cut_note(2).starts_with("[2 earlier messages of this chat were left out"));
    }

    #[test]
    fn truncation_keeps_a_prefix_and_says_how_long_the_text_was() {
        assert_eq!(truncate("short", 10), "short");
        let long = "é".repeat(1000); // 2000 bytes
        let cut = truncate(&long, 100);
        assert!(cut.len() <= 100, "{}", cut.len());
        assert!(cut.ends_with(" … [cut: 2000 bytes in all]"), "{cut}");
        assert!(cut.starts_with("éé"));
        // A bound smaller than the marker still yields the marker alone, never a panic.
        assert_eq!(truncate(&long, 3), " … [cut: 2000 bytes in all]");
    }

    #[test]
    fn exact_texts() {
        assert_eq!(
            give_up_notice(3),
            "⚠ Agent couldn't complete this request after 3 attempts."
        );
        assert_eq!(
            give_up_notice(1),
            "⚠ Agent couldn't complete this request after 1 attempt."
        );
        assert_eq!(
            retry_preamble(2, 3),
            "<system-note>This is retry attempt 2 of 3. The previous attempt was killed before completing. Be conservative with resource usage.</system-note>"
        );
        assert_eq!(prompt_for_attempt("hi", 1, 3), "hi");
        assert_eq!(
            prompt_for_attempt("hi", 3, 5),
            format!("{}\nhi", retry_preamble(3, 5))
        );
    }
}
