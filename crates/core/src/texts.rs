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

/// Sent once, under an attempt's fence, when its agent said more than an attempt may land
/// (`attempt_messages_max` messages or `attempt_bytes_max` bytes): what landed stays, the rest
/// is not delivered, and the turn counts as replied.
pub fn output_cut_notice(messages_max: u32, bytes_max: u64) -> String {
    format!(
        "⚠ The reply was cut here: an agent may send at most {} and {bytes_max} bytes per turn; the rest was not delivered.",
        count(messages_max.into(), "message", "messages")
    )
}

/// Sent when an inbound message is refused before it becomes a turn. `reason` quotes what came
/// from outside only through [`crate::sizes::quote`], so the notice stays small.
pub fn refusal_notice(reason: &str) -> String {
    let notice = format!("Could not take that message: {reason}.");
    crate::sizes::cut(&notice, crate::sizes::REASON_MAX).into_owned()
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
    fn notices_about_limits_say_the_limits() {
        assert_eq!(
            output_cut_notice(1000, 8 << 20),
            "⚠ The reply was cut here: an agent may send at most 1000 messages and 8388608 bytes per turn; the rest was not delivered."
        );
        let long = refusal_notice(&"x".repeat(100_000));
        assert!(crate::sizes::str_len(&long) <= crate::sizes::REASON_MAX);
        assert!(long.starts_with("Could not take that message: xxx"));
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
