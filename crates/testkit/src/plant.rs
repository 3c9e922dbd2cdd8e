//! Live turns planted as the dispatcher makes them, for tests and benchmarks that need many
//! without sending each through the pipeline.

use std::time::Duration;
use turnpike_core::lifecycle::{self, NewTurn};
use turnpike_core::wire::InboundMessage;
use turnpike_core::{ChatId, TurnId};
use turnpike_store::turns::ApplyError;
use turnpike_store::{admission, outbox, Bus};

/// Message `id` of `chat`, the `seq`-th of its chat, as the dispatcher creates its turn: listed
/// as live, recorded, joined to its chat, admitted if the chat has no live turn, and its effects
/// carried out (an admitted turn's work item published).
pub async fn turn(bus: &Bus, chat: &ChatId, id: &str, seq: u64) -> Result<TurnId, ApplyError> {
    let message = InboundMessage::new(chat.clone(), id.to_owned(), "a question", None);
    let (record, _) = lifecycle::create(
        NewTurn {
            turn: TurnId::for_message(chat, id),
            message,
            history: vec![],
            max_turn_retry: 3,
            retry_delay: Duration::from_secs(10),
            rerun_of: None,
            created_by: None,
            admit_now: false,
        },
        turnpike_jetstream::now(),
    );
    let turn = record.turn.clone();
    let (created, _) = admission::create_in_chat(bus, record, Some(seq), None).await?;
    outbox::run_outbox(bus, created).await?;
    Ok(turn)
}
