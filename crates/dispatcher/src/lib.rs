//! The dispatcher: each inbound chat message becomes a turn (a KV create, so a replayed message
//! never makes a second one) and its attempt 1 is published to the work stream.

use async_nats::jetstream::{AckKind, Message};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn, Instrument};
use turnpike_config::Config;
use turnpike_core::backoff::Backoff;
use turnpike_core::lifecycle::{self, NewTurn};
use turnpike_core::wire::InboundMessage;
use turnpike_core::{subjects, ChatId, TurnId};
use turnpike_jetstream::{dead_letter, decode, now, BusError};
use turnpike_store::admission;
use turnpike_store::outbox;
use turnpike_store::turns::{self, ApplyError};
use turnpike_store::Bus;

pub struct Dispatcher {
    bus: Bus,
    config: Config,
    counters: Arc<Counters>,
}

/// What this dispatcher did since it started (its `/metrics` on `metrics_listen`).
#[derive(Debug, Default)]
pub struct Counters {
    pub turns_created: std::sync::atomic::AtomicU64,
    pub messages_refused: std::sync::atomic::AtomicU64,
}

impl Counters {
    /// The Prometheus text exposition.
    pub fn render(&self) -> Result<String, std::fmt::Error> {
        use prometheus_client::metrics::counter::Counter;
        let mut registry = prometheus_client::registry::Registry::with_prefix("turnpike");
        for (name, help, n) in [
            (
                "turns_created",
                "Inbound messages that became turns",
                &self.turns_created,
            ),
            (
                "messages_refused",
                "Inbound messages refused (dead letter and notice)",
                &self.messages_refused,
            ),
        ] {
            let c = Counter::<u64>::default();
            c.inc_by(n.load(std::sync::atomic::Ordering::Relaxed));
            registry.register(name, help, c);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// Tries of a transient failure in place, in the chat's lane, before the message is NAK'd.
const IN_PLACE_TRIES: u32 = 8;

/// How long a chat's lane waits for its next message before it closes. Short: a lane is a task
/// and a queue, and ten thousand chats that each said one thing must not keep ten thousand of
/// them. Order does not rest on lanes staying open (a chat's record says which of its messages
/// were taken, and a later one waits for every earlier one: `chats::inbound_in_order`), so closing one
/// costs only the spawn of the next.
const LANE_IDLE: Duration = Duration::from_secs(2);

/// Handle one chat's messages in order until it has been idle for a while (or shutdown closes
/// the sender). Whatever arrived while closing is still handled, never dropped.
async fn lane(dispatcher: Arc<Dispatcher>, mut rx: mpsc::UnboundedReceiver<Message>) {
    loop {
        match tokio::time::timeout(LANE_IDLE, rx.recv()).await {
            Ok(Some(msg)) => dispatcher.handle(msg).await,
            Ok(None) => return,
            Err(_) => break,
        }
    }
    rx.close();
    while let Ok(msg) = rx.try_recv() {
        dispatcher.handle(msg).await;
    }
}

impl Dispatcher {
    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    pub fn new(bus: Bus, config: Config) -> Self {
        Dispatcher {
            bus,
            config,
            counters: Arc::default(),
        }
    }

    pub async fn run(self, shutdown: CancellationToken) -> Result<(), BusError> {
        let Some(consumer) = turnpike_jetstream::consume::durable_patiently(
            &self.bus.js,
            subjects::STREAM_CHAT_IN,
            subjects::CONSUMER_DISPATCHER,
            &shutdown,
        )
        .await
        else {
            return Ok(());
        };
        info!("dispatcher started");
        // One lane per chat: a chat's messages are handled one at a time, in stream order (per-chat
        // order depends on it); different chats go in parallel. Unacked messages are bounded by
        // the consumer's max_ack_pending.
        let me = Arc::new(self);
        let lanes_done = TaskTracker::new();
        let mut lanes: HashMap<String, mpsc::UnboundedSender<Message>> = HashMap::new();
        // Closed lanes leave their senders in the map until a sweep of it: one whenever the map
        // has doubled since the last, so its size stays within twice the lanes open then.
        let mut prune_at: usize = 64;
        turnpike_jetstream::consume::each_message(&consumer, 64, &shutdown, |msg| {
            let key = msg.subject.to_string();
            let leftover = match lanes.get(&key) {
                Some(tx) => tx.send(msg).err().map(|e| e.0),
                None => Some(msg),
            };
            if let Some(msg) = leftover {
                // No lane, or it went idle and closed: open one.
                let (tx, rx) = mpsc::unbounded_channel();
                let _ = tx.send(msg);
                lanes.insert(key, tx);
                lanes_done.spawn(lane(me.clone(), rx));
            }
            if lanes.len() >= prune_at {
                lanes.retain(|_, tx| !tx.is_closed());
                prune_at = (lanes.len() * 2).max(64);
            }
            std::future::ready(())
        })
        .await;
        drop(lanes);
        lanes_done.close();
        lanes_done.wait().await;
        info!("dispatcher stopped");
        Ok(())
    }

    async fn handle(&self, msg: Message) {
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
        let turn = TurnId::for_message(&inbound.chat, &inbound.id);
        let seq = msg.info().map(|i| i.stream_sequence).ok();
        let span = tracing::info_span!("turn", turn_id = %turn, chat_id = %inbound.chat);
        async {
            // Per-chat order: an earlier message of this chat that is not taken yet (a
            // dispatcher died holding it) goes first; this one comes back for later.
            let mut chat_read = None;
            if let Some(seq) = seq {
                match turnpike_store::chats::inbound_in_order(&self.bus, &inbound.chat, seq).await {
                    Ok((true, snapshot)) => chat_read = Some(snapshot),
                    Ok((false, _)) => {
                        debug!(
                            seq,
                            "an earlier message of this chat is not taken yet; waiting for it"
                        );
                        let _ = msg
                            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                            .await;
                        return;
                    }
                    Err(e) => {
                        warn!(error = %e, "cannot check the chat's order; will retry");
                        let _ = msg
                            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                            .await;
                        return;
                    }
                }
            }
            // A transient failure is retried here, in the chat's lane, rather than NAK'd: the
            // lane would move on to the chat's next message and break its order.
            let mut waits = Backoff::doubling(Duration::from_millis(250), Duration::from_secs(5));
            for tries in 1..=IN_PLACE_TRIES {
                // The order check's read of the chat serves the first try's join.
                let chat_read = chat_read.take();
                match self
                    .create_turn(turn.clone(), inbound.clone(), seq, chat_read)
                    .await
                {
                    Ok(()) => {
                        let _ = msg.ack().await;
                        return;
                    }
                    Err(e) if e.is_transient() && tries < IN_PLACE_TRIES => {
                        warn!(error = %e, tries, "turn not created yet; retrying");
                        let _ = msg.ack_with(AckKind::Progress).await;
                        tokio::time::sleep(waits.wait()).await;
                    }
                    Err(e) if e.is_transient() => {
                        warn!(error = %e, "turn not created yet; leaving it to redelivery");
                        let _ = msg
                            .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                            .await;
                        return;
                    }
                    // No retry can change it: the message is refused (with a notice), or its
                    // turn, if it exists, ends; never an endless retry.
                    Err(e) => return self.give_up(&msg, &turn, &inbound, e).await,
                }
            }
        }
        .instrument(span)
        .await
    }

    /// The dispatcher's one way to refuse input: counted taken in its chat first (so the chat's
    /// later messages go; if that fails it comes back and is refused again), then a dead letter
    /// with the reason, counted, never redelivered.
    async fn refuse(&self, msg: &Message, reason: String) {
        let chat = msg
            .subject
            .as_str()
            .strip_prefix("turnpike.chat.in.")
            .and_then(|c| ChatId::new(c).ok());
        if let (Some(chat), Ok(info)) = (chat, msg.info()) {
            if let Err(e) =
                turnpike_store::chats::inbound_taken(&self.bus, &chat, info.stream_sequence).await
            {
                warn!(error = %e, reason = %turnpike_core::sizes::quote(&reason), "to be refused, but not yet counted taken; will be redone");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                return;
            }
        }
        turnpike_jetstream::refuse(
            &self.bus.js,
            "dispatcher",
            msg,
            &reason,
            &self.counters.messages_refused,
        )
        .await;
    }

    /// A message whose turn could not be created, or went on, for a reason no retry changes:
    /// its turn, if it exists, is ended (failed, the plain notice, the chat flagged); otherwise
    /// the message is refused with a notice. Either way it is counted taken, so the chat's later
    /// messages go, dead-lettered, and never redelivered.
    async fn give_up(
        &self,
        msg: &Message,
        turn: &TurnId,
        inbound: &InboundMessage,
        error: ApplyError,
    ) {
        let reason = error.to_string();
        let ended = match turns::load(&self.bus, turn).await {
            Ok(Some(_)) => outbox::abandon(&self.bus, turn, &reason).await.map(|_| ()),
            Ok(None) => match self.notify_refused(turn, inbound, &reason).await {
                Ok(()) => admission::withdraw(&self.bus, &self.new_record(turn, inbound)).await,
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        match ended {
            Err(e) if e.is_transient() => {
                warn!(error = %e, "could not end the turn or refuse its message yet; will retry");
                let _ = msg
                    .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                    .await;
                return;
            }
            // Not even that can be stored: the dead letter below is what is left.
            Err(e) => tracing::error!(error = %e, "could not end the turn or send its notice"),
            Ok(()) => {}
        }
        self.refuse(msg, reason).await
    }

    async fn create_turn(
        &self,
        turn: TurnId,
        inbound: InboundMessage,
        seq: Option<u64>,
        chat_read: Option<turnpike_store::chats::Snapshot>,
    ) -> Result<(), ApplyError> {
        let refused = match inbound.check(&self.config.inbound_limits()) {
            Err(why) => Some(why.to_string()),
            Ok(()) => self.check_attachments(&inbound).await?,
        };
        // A full queue refuses the message before it becomes a turn (the join checks it again).
        let refused = refused.or_else(|| {
            let waiting = chat_read
                .as_ref()
                .and_then(|s| s.record())
                .and_then(|c| c.ok())
                .map_or(0, |c| c.waiting.len());
            (waiting >= self.config.chat_queue_max).then(|| {
                turnpike_core::wire::Refusal::QueueFull {
                    waiting,
                    max: self.config.chat_queue_max,
                }
                .to_string()
            })
        });
        if let Some(reason) = refused {
            self.reply_error(&turn, &inbound, &reason).await?;
            if let Some(seq) = seq {
                turnpike_store::chats::inbound_taken(&self.bus, &inbound.chat, seq).await?;
            }
            return Ok(());
        }
        // Created waiting; it starts when it is its chat's turn (at once if the chat is idle),
        // with the chat's history as it is then.
        let record = self.new_record(&turn, &inbound);
        let (current, created) =
            admission::create_in_chat(&self.bus, record, seq, chat_read).await?;
        if created {
            info!(max_attempts = current.record.max_attempts, "turn created");
            self.counters
                .turns_created
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        } else {
            debug!("replayed message: turn exists");
        }
        Ok(())
    }

    /// The record a message's turn is created with: waiting for its chat.
    fn new_record(&self, turn: &TurnId, inbound: &InboundMessage) -> turnpike_core::TurnRecord {
        lifecycle::create(
            NewTurn {
                turn: turn.clone(),
                message: inbound.clone(),
                history: Vec::new(),
                max_turn_retry: self.config.max_turn_retry,
                retry_delay: self.config.retry_delay,
                rerun_of: None,
                created_by: None,
                admit_now: false,
            },
            now(),
        )
        .0
    }

    /// Every attachment must exist in the object store and fit the size limits (the message
    /// itself was checked by `InboundMessage::check`): `Ok(Some(reason))` refuses it. An object
    /// store that does not answer is an error (the message is retried), never a refusal.
    async fn check_attachments(
        &self,
        inbound: &InboundMessage,
    ) -> Result<Option<String>, BusError> {
        use turnpike_core::sizes::quote;
        use turnpike_store::attachments::ObjectError;
        let c = &self.config;
        let max = c.attachment_max_bytes;
        let mut total = 0u64;
        for a in &inbound.attachments {
            match turnpike_store::attachments::info(&self.bus, &a.object).await {
                Ok(info) if info.size as u64 > max.0 => {
                    return Ok(Some(format!(
                        "attachment {} is {} bytes; the limit is {max}",
                        quote(&a.name),
                        info.size
                    )))
                }
                Ok(info) => total += info.size as u64,
                Err(ObjectError::Missing(_)) => {
                    return Ok(Some(format!(
                        "attachment {} (object {}) is not in the object store {}",
                        quote(&a.name),
                        quote(&a.object),
                        subjects::OBJECTS_ATTACHMENTS
                    )))
                }
                Err(ObjectError::Bus(e)) => return Err(e),
            }
        }
        if total > c.attachments_max_total_bytes.0 {
            return Ok(Some(format!(
                "the attachments add up to {total} bytes; the limit is {}",
                c.attachments_max_total_bytes
            )));
        }
        Ok(None)
    }

    /// Refuse a message with a clear notice on the chat's outbound subject, and a dead letter.
    async fn reply_error(
        &self,
        turn: &TurnId,
        inbound: &InboundMessage,
        reason: &str,
    ) -> Result<(), ApplyError> {
        self.counters
            .messages_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.notify_refused(turn, inbound, reason).await?;
        let payload = self.bus.codec.encode(inbound).map_err(BusError::from)?;
        dead_letter(
            &self.bus.js,
            "dispatcher",
            reason,
            &subjects::chat_in(&inbound.chat),
            None,
            bytes::Bytes::from(payload),
        )
        .await;
        Ok(())
    }

    /// The refusal notice, on the chat's outbound subject (once per turn id: its dedup id is
    /// the turn's notice's).
    async fn notify_refused(
        &self,
        turn: &TurnId,
        inbound: &InboundMessage,
        reason: &str,
    ) -> Result<(), ApplyError> {
        warn!(reason = %turnpike_core::sizes::quote(reason), "message refused");
        let item = turnpike_core::wire::OutboundItem {
            v: turnpike_core::FORMAT_VERSION,
            kind: turnpike_core::wire::OutboundKind::Notice,
            chat: inbound.chat.clone(),
            turn: turn.clone(),
            attempt: 0,
            text: turnpike_core::texts::refusal_notice(reason),
            status_id: None,
            r#final: false,
        };
        turnpike_jetstream::Publish::new(self.bus.codec, subjects::chat_out(&inbound.chat), &item)?
            .msg_id(&subjects::msg_id::notice(turn))
            .header(subjects::HDR_TURN, turn.as_str())
            .header(subjects::HDR_KIND, "notice")
            .send(&self.bus.js)
            .await?;
        Ok(())
    }
}
