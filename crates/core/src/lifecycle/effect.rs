//! How a turn's outbox keeps what is still owed of the [`Effect`]s the state machine decided
//! (the effects are data stored in the record, so they are defined beside it).

use crate::record::{Effect, TurnRecord};

impl Effect {
    /// Does `record` prove this effect carried out, or moot? Only an attempt that began proves
    /// its dispatch (its runner took the work item), or the turn's end makes it moot; only an
    /// attempt that exited makes its kill moot. Such effects leave the outbox with the next write of the record, so carrying out an
    /// outbox costs no write of its own; an ended turn's effects stay, and its removal from the
    /// live index is what says they were carried out.
    pub fn carried_out(&self, record: &TurnRecord) -> bool {
        let attempt = |n: u32| record.attempts.iter().find(|a| a.n == n);
        match self {
            // An ended turn runs no attempt: a dispatch still owed is moot (its attempt is
            // cancelled, or was never due).
            Effect::DispatchAttempt { .. } if record.state.is_terminal() => true,
            Effect::DispatchAttempt { attempt: n, .. } => attempt(*n)
                .is_some_and(|a| a.runner.is_some() || a.messages_landed > 0 || a.exit.is_some()),
            Effect::ForwardKill { attempt: n } => attempt(*n).is_some_and(|a| a.exit.is_some()),
            Effect::Notify { .. }
            | Effect::FlagChatErrored { .. }
            | Effect::SaveWorkspace { .. }
            | Effect::CancelAttempt { .. }
            | Effect::Ended { .. } => false,
        }
    }
}

/// The outbox to store with `record` (the result of an apply): what is still owed of the
/// outbox it had, then `effects`.
pub fn next_outbox(record: &TurnRecord, effects: &[Effect]) -> Vec<Effect> {
    let mut outbox: Vec<Effect> = record
        .outbox
        .iter()
        .filter(|e| !e.carried_out(record))
        .cloned()
        .collect();
    outbox.extend(effects.iter().cloned());
    outbox
}
