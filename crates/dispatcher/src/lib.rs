//! The dispatcher: each inbound chat message becomes a turn (a KV create, so a replayed message
//! never makes a second one) and its attempt 1 is published to the work stream.

use async_nats::jetstream::AckKind;
use bytes::Bytes;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};
use turnpike_config::Config;
use turnpike_core::lifecycle::{self, NewTurn};
use turnpike_core::wire::InboundMessage;
use turnpike_core::{subjects, ChatId, TurnId};
use turnpike_jetstream::turns::{self, ApplyError};
use turnpike_jetstream::{dead_letter, decode, now, Bus, BusError};

pub struct Dispatcher {
    bus: Bus,
    config: Config,
}

impl Dispatcher {
    pub fn new(bus: Bus, config: Config) -> Self {
        Dispatcher { bus, config }
    }

    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BusError> {
        let consumer = turnpike_jetstream::consume::durable(
            &self.bus.js,
            subjects::STREAM_CHAT_IN,
            subjects::CONSUMER_DISPATCHER,
        )
        .await?;
        info!("dispatcher started");
        // One at a time: per-chat order depends on it.
        turnpike_jetstream::consume::each_message(&consumer, 16, &shutdown, |msg| self.handle(msg))
            .await;
        info!("dispatcher stopped");
        Ok(())
    }

    async fn handle(&self, msg: async_nats::jetstream::Message) {
        let subject_chat = msg
            .subject
            .as_str()
            .strip_prefix("turnpike.chat.in.")
            .map(ChatId::new);
        let inbound: InboundMessage = match decode(msg.headers.as_ref(), &msg.payload) {
            Ok(m) => m,
            Err(e) => {
                return self
                    .refuse(&msg, format!("undecodable inbound message: {e}"))
                    .await
            }
        };
        match subject_chat {
            Some(Ok(c)) if c == inbound.chat => {}
            _ => {
                return self
                    .refuse(
                        &msg,
                        format!(
                            "message for chat {:?} published on {}; publish on {}",
                            inbound.chat.as_str(),
                            msg.subject,
                            subjects::chat_in(&inbound.chat)
                        ),
                    )
                    .await
            }
        }
        if inbound.id.is_empty() {
            return self
                .refuse(&msg, "inbound message has an empty id".into())
                .await;
        }
        let turn = TurnId::for_message(&inbound.chat, &inbound.id);
        let span = tracing::info_span!("turn", turn_id = %turn, chat_id = %inbound.chat);
        async {
            match self.create_turn(turn, inbound).await {
                Ok(()) => {
                    let _ = msg.ack().await;
                }
                Err(ApplyError::Bus(e)) => {
                    warn!(error = %e, "turn not created yet; will retry");
                    let _ = msg
                        .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                        .await;
                }
                Err(e) => self.refuse(&msg, e.to_string()).await,
            }
        }
        .instrument(span)
        .await
    }

    /// Refused input is recorded as a dead letter with the reason, then acknowledged.
    async fn refuse(&self, msg: &async_nats::jetstream::Message, reason: String) {
        dead_letter(
            &self.bus.js,
            "dispatcher",
            &reason,
            msg.subject.as_str(),
            msg.headers.as_ref(),
            msg.payload.clone(),
        )
        .await;
        let _ = msg.ack().await;
    }

    async fn create_turn(&self, turn: TurnId, inbound: InboundMessage) -> Result<(), ApplyError> {
        let (mut record, effects) = lifecycle::create(
            NewTurn {
                turn: turn.clone(),
                message: inbound,
                history: Vec::new(),
                max_turn_retry: self.config.max_turn_retry,
                retry_delay: self.config.retry_delay,
                rerun_of: None,
                created_by: None,
                admit_now: true,
            },
            now(),
        );
        record.outbox = effects;
        // Into the live index first: a turn is never live without being findable by the sweep.
        self.bus
            .live
            .put(turn.as_str(), Bytes::from(record.chat.as_str().to_owned()))
            .await
            .map_err(|e| BusError::kv(format!("index live turn {turn}"), e))?;
        let (current, created) = turns::create(&self.bus, record).await?;
        if created {
            info!(max_attempts = current.record.max_attempts, "turn created");
        } else {
            debug!("replayed message: turn exists");
        }
        turns::run_outbox(&self.bus, current).await?;
        Ok(())
    }
}
