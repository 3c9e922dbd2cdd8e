//! Landing what an agent says: its stdout split into protocol lines, bot messages published on
//! the chat's outbound subject only while the turn's fence is this attempt's, status updates,
//! and the agent's own verdict.

use crate::context::RunnerContext;
use crate::events::emit;
use crate::lines::{Line, LineSplitter, MAX_LINE};
use async_nats::jetstream::publish::PublishAck;
use tokio::sync::watch;
use tracing::{debug, warn};
use turnpike_core::exit::StopReason;
use turnpike_core::subjects::{self, msg_id};
use turnpike_core::wire::{
    AgentLine, AgentStatus, Landed, OutboundItem, OutboundKind, RunnerEventKind, WorkItem,
};
use turnpike_core::FORMAT_VERSION;
use turnpike_jetstream::{BusError, Publish};

/// What an attempt's output came to, once its stdout closed.
pub(crate) struct Landing {
    /// Bot messages acknowledged on the outbound stream, and where they are.
    pub landed: Landed,
    /// The agent said more than an attempt may land; the rest was not delivered.
    pub cut: bool,
    /// The agent's own verdict (`{"type":"result"}`), and its error text, bounded.
    pub verdict: Option<AgentStatus>,
    pub verdict_error: Option<String>,
    /// Did the agent write anything to stdout at all?
    pub any_output: bool,
    /// A bot message may have landed without an acknowledgement: settle the count from the
    /// stream before reporting ([`crate::claim::settle_uncertain`]).
    pub uncertain: bool,
}

/// Lands one attempt's output while the turn's fence is the attempt's.
pub(crate) struct Lander<'a> {
    ctx: &'a RunnerContext,
    work: &'a WorkItem,
    fence_subject: String,
    fence_seq: u64,
    splitter: LineSplitter,
    landed: Landed,
    /// Encoded bytes of the landed messages' texts.
    bytes_landed: u64,
    /// The output passed an attempt's limits: nothing more of it lands.
    cut: bool,
    status_seq: u32,
    verdict: Option<AgentStatus>,
    verdict_error: Option<String>,
    any_output: bool,
    fenced: bool,
    /// A bot message was published and never acknowledged: it may have landed or not, so
    /// `landed` may be short (see [`crate::claim::settle_uncertain`]).
    uncertain: bool,
    /// Takes the agent's secrets out of what it says, before anything lands or is logged.
    redactor: crate::secrets::Redactor,
}

impl<'a> Lander<'a> {
    /// A lander for `work`, whose fence this runner holds at `fence_seq`.
    pub(crate) fn new(
        ctx: &'a RunnerContext,
        work: &'a WorkItem,
        fence_seq: u64,
        redactor: crate::secrets::Redactor,
    ) -> Self {
        Lander {
            ctx,
            work,
            fence_subject: subjects::fence(&work.turn),
            fence_seq,
            splitter: LineSplitter::new(MAX_LINE),
            landed: Landed::default(),
            bytes_landed: 0,
            cut: false,
            status_seq: 0,
            verdict: None,
            verdict_error: None,
            any_output: false,
            fenced: false,
            uncertain: false,
            redactor,
        }
    }

    /// A chunk of the agent's stdout: every whole line in it is landed, in order.
    pub(crate) async fn stdout(&mut self, bytes: &[u8], stop: &watch::Sender<Option<StopReason>>) {
        self.any_output = true;
        for line in self.splitter.push(bytes) {
            self.line(line, stop).await;
        }
    }

    /// Stdout closed: land a last line without a newline, and say what it all came to.
    pub(crate) async fn finish(mut self, stop: &watch::Sender<Option<StopReason>>) -> Landing {
        if let Some(line) = self.splitter.finish() {
            self.line(line, stop).await;
        }
        Landing {
            landed: self.landed,
            cut: self.cut,
            verdict: self.verdict,
            verdict_error: self.verdict_error,
            any_output: self.any_output,
            uncertain: self.uncertain,
        }
    }

    async fn line(&mut self, line: Line, stop: &watch::Sender<Option<StopReason>>) {
        let text = match line {
            Line::Text(t) => t,
            Line::Oversize { len, head } => {
                // Cut, not dropped: a huge reply lands cut, a huge error still fails the turn.
                match crate::lines::salvage(&head, len) {
                    Some(salvaged) => {
                        warn!(len, "agent line over 1 MiB; using what its head says");
                        return self.parsed(salvaged, stop).await;
                    }
                    None => {
                        warn!(len, "agent line over 1 MiB, not a protocol line; skipped");
                        return;
                    }
                }
            }
            Line::NotUtf8 { len } => {
                warn!(len, "agent line not UTF-8 skipped");
                return;
            }
        };
        if text.trim().is_empty() {
            return;
        }
        let parsed: AgentLine = match serde_json::from_str(&text) {
            Ok(p) => p,
            Err(e) => {
                let shown: String = self.redactor.redact(&text).chars().take(200).collect();
                debug!(line = %shown, error = %e, "agent stdout (not a protocol line)");
                return;
            }
        };
        self.parsed(parsed, stop).await
    }

    async fn parsed(&mut self, line: AgentLine, stop: &watch::Sender<Option<StopReason>>) {
        let line = match line {
            AgentLine::Message { text } => AgentLine::Message {
                text: self.redactor.redact_owned(text),
            },
            AgentLine::Status { text } => AgentLine::Status {
                text: self.redactor.redact_owned(text),
            },
            AgentLine::Result { status, error } => AgentLine::Result {
                status,
                error: error.map(|e| self.redactor.redact_owned(e)),
            },
        };
        match line {
            AgentLine::Message { text } => self.message(text, stop).await,
            AgentLine::Status { text } => self.status(text).await,
            AgentLine::Result { status, error } => {
                self.verdict = Some(status);
                // Kept in the turn record: bounded.
                self.verdict_error = error.map(|e| {
                    turnpike_core::sizes::cut(&e, turnpike_core::sizes::ERROR_MAX).into_owned()
                });
            }
        }
    }

    async fn message(&mut self, text: String, stop: &watch::Sender<Option<StopReason>>) {
        if self.fenced || self.cut {
            return;
        }
        let text = self.bounded(text);
        let size = turnpike_core::sizes::str_len(&text) as u64;
        let config = &self.ctx.config;
        if self.landed.count >= config.attempt_messages_max
            || self.bytes_landed + size > config.attempt_bytes_max.0
        {
            // What landed stays (the turn counts as replied); the rest is not delivered, and
            // the chat is told so once.
            self.cut = true;
            warn!(
                landed = self.landed.count,
                bytes = self.bytes_landed,
                "the agent said more than an attempt may land; the rest is not delivered"
            );
            self.cut_marker(stop).await;
            return;
        }
        let seq = self.landed.count + 1;
        let item = self.item(OutboundKind::Message, text);
        let id = msg_id::bot_message(&self.work.turn, self.work.attempt, seq);
        let mut retries = crate::retries::Retries::bot_message();
        loop {
            let result = self.publish(&item, &id).await;
            match result {
                Ok(ack) => {
                    // No event per message: the exit report carries the count and where they
                    // are stored (read back for history), and an attempt that dies first is
                    // counted from the stream behind its fence by whoever fences it out.
                    self.landed.push(ack.sequence);
                    self.bytes_landed += size;
                    return;
                }
                Err(BusError::Fenced { .. }) => return self.fenced_out(stop).await,
                Err(e) if !e.is_transient() => {
                    // Refused for good (NATS will never store it): not landed, and not
                    // uncertain either.
                    warn!(error = %e, "bot message refused for good; not landed");
                    return;
                }
                Err(e) => match retries.after_failure() {
                    Some(wait) => {
                        warn!(error = %e, "bot message not acknowledged; retrying with the same dedup id");
                        tokio::time::sleep(wait).await;
                    }
                    None => {
                        // Not acknowledged is not refused: the server may have stored it. The
                        // count is settled from the stream at exit, after the fence moves.
                        warn!(error = %e, "bot message not acknowledged after every try; whether it landed is settled at exit");
                        self.uncertain = true;
                        return;
                    }
                },
            }
        }
    }

    /// The fence moved: nothing more of this attempt can land; stop the run.
    async fn fenced_out(&mut self, stop: &watch::Sender<Option<StopReason>>) {
        self.fenced = true;
        let why = crate::stop::fence_moved(&self.ctx.bus, &self.work.turn, self.fence_seq).await;
        warn!(
            ?why,
            "the fence moved: the bot message was refused; stopping the run"
        );
        crate::stop::request(stop, why);
    }

    /// The one notice that this attempt's output was cut at its limits, under its fence.
    async fn cut_marker(&mut self, stop: &watch::Sender<Option<StopReason>>) {
        let config = &self.ctx.config;
        let text = turnpike_core::texts::output_cut_notice(
            config.attempt_messages_max,
            config.attempt_bytes_max.0,
        );
        let item = self.item(OutboundKind::Notice, text);
        let id = msg_id::output_cut(&self.work.turn, self.work.attempt);
        match self.publish(&item, &id).await {
            Ok(_) => {}
            Err(BusError::Fenced { .. }) => self.fenced_out(stop).await,
            // The marker is courtesy: what landed is what counts.
            Err(e) => warn!(error = %e, "the cut marker was not published"),
        }
    }

    /// An outbound item of this attempt: a bot message, or its live status (one per turn).
    fn item(&self, kind: OutboundKind, text: String) -> OutboundItem {
        OutboundItem {
            v: FORMAT_VERSION,
            kind,
            chat: self.work.chat.clone(),
            turn: self.work.turn.clone(),
            attempt: self.work.attempt,
            text,
            status_id: (kind == OutboundKind::Status).then(|| subjects::status_id(&self.work.turn)),
            r#final: false,
        }
    }

    /// Publish on the chat's outbound subject, only while the turn's fence is this attempt's
    /// (`BusError::Fenced` when it moved), deduplicated by `id`.
    async fn publish(&self, item: &OutboundItem, id: &str) -> Result<PublishAck, BusError> {
        let bus = &self.ctx.bus;
        Publish::new(bus.codec, subjects::chat_out(&self.work.chat), item)?
            .msg_id(id)
            .header(subjects::HDR_TURN, self.work.turn.as_str())
            .header(subjects::HDR_ATTEMPT, &self.work.attempt.to_string())
            .header(subjects::HDR_KIND, item.kind.as_str())
            .expect_last_on(&self.fence_subject, self.fence_seq)
            .send(&bus.js)
            .await
    }

    /// Text cut to `message_max_bytes` encoded, with a marker: a long reply is shown cut, never
    /// dropped.
    fn bounded(&self, text: String) -> String {
        let max = usize::try_from(self.ctx.config.message_max_bytes.0).unwrap_or(usize::MAX);
        match turnpike_core::sizes::cut(&text, max) {
            std::borrow::Cow::Borrowed(_) => text,
            std::borrow::Cow::Owned(cut) => {
                warn!(
                    len = text.len(),
                    max, "agent message over the limit; landing it cut"
                );
                cut
            }
        }
    }

    async fn status(&mut self, text: String) {
        // Bounded like the messages: past the limit, progress is no longer published.
        if self.status_seq >= self.ctx.config.attempt_messages_max {
            return;
        }
        let text = self.bounded(text);
        self.status_seq += 1;
        let item = self.item(OutboundKind::Status, text.clone());
        let id = msg_id::status(&self.work.turn, self.work.attempt, self.status_seq);
        let published = self.publish(&item, &id).await;
        if let Err(e) = published {
            debug!(error = %e, "status update not published");
        }
        emit(
            self.ctx,
            self.work,
            &format!("progress.{}", self.status_seq),
            RunnerEventKind::Progress { text },
        )
        .await;
    }
}
