//! The exact words a user sees. Changing any of these changes the product contract.

/// Sent once when every attempt died without a bot message. `attempts` is the number actually made.
pub fn give_up_notice(attempts: u32) -> String {
    let noun = if attempts == 1 { "attempt" } else { "attempts" };
    format!("⚠ Agent couldn't complete this request after {attempts} {noun}.")
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

#[cfg(test)]
mod tests {
    use super::*;

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
