//! One attempt on this runner: claim it, fence it, run it, land its messages, report its exit.

use crate::backend::{Output, RunSpec};
use crate::classify::{classify, StopReason};
use crate::lines::{Line, LineSplitter, MAX_LINE};
use crate::Inner;
use async_nats::jetstream::kv::CreateErrorKind;
use async_nats::jetstream::AckKind;
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn, Instrument};
use turnpike_core::subjects::{self, msg_id};
use turnpike_core::wire::{
    AgentLine, AgentStatus, AttemptStart, ClaimHolder, ClaimRecord, ExitReport, OutboundItem,
    OutboundKind, RunnerEvent, RunnerEventKind, WorkItem,
};
use turnpike_core::{Timestamp, FORMAT_VERSION};
use turnpike_jetstream::{dead_letter, decode, now, BusError, Publish};
use turnpike_store::fence::Taken;

/// Take one work message from the runners' consumer and see it through.
pub(crate) async fn handle(inner: Arc<Inner>, msg: async_nats::jetstream::Message) {
    let work: WorkItem = match decode(msg.headers.as_ref(), &msg.payload) {
        Ok(w) => w,
        Err(e) => {
            dead_letter(
                &inner.bus.js,
                "runner",
                &format!("undecodable work item: {e}"),
                msg.subject.as_str(),
                msg.headers.as_ref(),
                msg.payload.clone(),
            )
            .await;
            let _ = msg.ack_with(AckKind::Term).await;
            return;
        }
    };
    let span = tracing::info_span!("attempt", turn_id = %work.turn, attempt = work.attempt,
        chat_id = %work.chat, runner_id = %inner.id);
    run(inner, msg, work).instrument(span).await
}

async fn run(inner: Arc<Inner>, msg: async_nats::jetstream::Message, work: WorkItem) {
    let bus = &inner.bus;
    let published_at = msg
        .info()
        .map(|i| Timestamp::from_system_time(SystemTime::from(i.published)))
        .unwrap_or_else(|_| now());

    // Listen for kills before claiming: a kill sent at any moment after the claim reaches us.
    // The fence catches any kill this subscription misses (it is plain NATS).
    let kills = bus.client.subscribe(subjects::kill(&work.turn)).await.ok();

    // The lease first, then the claim: so a claimed attempt without a live lease can only have
    // lost it to the server's TTL, and the sweep needs no clock to tell a dead runner.
    let key = subjects::claim_key(&work.turn, work.attempt);
    let lease_seq = match crate::lease::take(&inner, &key).await {
        Ok(crate::lease::Taken::Ours(seq)) => seq,
        Ok(crate::lease::Taken::Held) => {
            // Another runner holds the attempt: if it claimed it, this delivery is a duplicate;
            // if it has not yet, it may still fail to, so the item comes back.
            match turnpike_store::claims::holder(&inner.bus, &work.turn, work.attempt).await {
                Ok(Some(_)) => {
                    info!("attempt already claimed; dropping this delivery");
                    let _ = msg.double_ack().await;
                }
                _ => {
                    debug!("another runner is taking this attempt; leaving this delivery");
                    let _ = msg
                        .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                        .await;
                }
            }
            return;
        }
        Err(e) => {
            warn!(error = %e, "cannot take the lease; will be redelivered");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return;
        }
    };

    // Claim: exactly one runner runs an attempt, however often its work item is delivered.
    let claim = ClaimRecord {
        v: FORMAT_VERSION,
        turn: work.turn.clone(),
        attempt: work.attempt,
        holder: ClaimHolder::Runner {
            runner: inner.id.clone(),
        },
        at: now(),
    };
    let claim_bytes = match bus.codec.encode(&claim) {
        Ok(b) => Bytes::from(b),
        Err(e) => {
            warn!(error = %e, "cannot encode claim");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return;
        }
    };
    match bus
        .claims
        .create(subjects::claim_key(&work.turn, work.attempt), claim_bytes)
        .await
    {
        Ok(_) => {}
        Err(e) if e.kind() == CreateErrorKind::AlreadyExists => {
            info!("attempt already claimed (or cancelled); dropping this delivery");
            // The lease we took is not the claimant's: give it back, so it cannot hide the
            // claimant's death from the sweep.
            let _ = bus
                .leases
                .purge_expect_revision(&key, Some(lease_seq))
                .await;
            let _ = msg.double_ack().await;
            return;
        }
        Err(e) => {
            warn!(error = %e, "cannot claim; will be redelivered");
            let _ = msg
                .ack_with(AckKind::Nak(Some(Duration::from_secs(1))))
                .await;
            return;
        }
    }

    // The lease covers the attempt from before its claim until its exit is reported: while it lives
    // (renewed every heartbeat), the attempt is ours and alive. A lease that lapses is never
    // renewed again, and stops the run.
    let (stop_tx, stop_rx) = watch::channel::<Option<StopReason>>(None);
    let stop_tx = Arc::new(stop_tx);
    let (fence_tx, fence_rx) = watch::channel::<Option<u64>>(None);
    let lease = crate::lease::keep_alive(
        inner.clone(),
        work.turn.clone(),
        work.attempt,
        stop_tx.clone(),
        fence_rx,
        lease_seq,
    );
    let fenced = run_fenced(
        &inner,
        &msg,
        &work,
        published_at,
        kills,
        stop_tx,
        stop_rx,
        fence_tx,
    )
    .await;
    if let Some(mut report) = fenced {
        report.started = Some(AttemptStart {
            runner: inner.id.clone(),
            published_at,
        });
        report_exit(&inner, &work, report).await;
    }
    lease.abort();
}

/// Take the fence and, if it is ours, run the attempt; returns its exit report (`None`: what it
/// landed could not be settled; the sweep will).
#[allow(clippy::too_many_arguments)]
async fn run_fenced(
    inner: &Arc<Inner>,
    msg: &async_nats::jetstream::Message,
    work: &WorkItem,
    published_at: Timestamp,
    kills: Option<async_nats::Subscriber>,
    stop_tx: Arc<watch::Sender<Option<StopReason>>>,
    stop_rx: watch::Receiver<Option<StopReason>>,
    fence_tx: watch::Sender<Option<u64>>,
) -> Option<ExitReport> {
    use turnpike_core::wire::ExitClass;
    // Fence: from here on, this attempt's bot messages land only while the turn's fence is ours.
    // Taken by compare-and-set, so a kill or a loss decided before this point is never overrun.
    let taken = turnpike_store::fence::take(&inner.bus, &work.turn, work.attempt, &inner.id).await;
    // The claim makes any redelivery harmless from here on, whatever happens next.
    if let Err(e) = msg.double_ack().await {
        debug!(error = %e, "ack of the work item failed; the claim keeps it ours");
    }
    let fence_seq = match taken {
        Ok(Taken::Ours(seq)) => seq,
        Ok(Taken::Killed) => {
            info!("the turn was killed before the attempt started; not running it");
            return Some(ExitReport::without_output(
                ExitClass::OperatorKilled,
                "killed by an operator before it started",
                now(),
            ));
        }
        Ok(Taken::Lost) => {
            info!("the attempt was declared lost before it started; not running it");
            return Some(ExitReport::without_output(
                ExitClass::RunnerLost,
                "declared lost before it started",
                now(),
            ));
        }
        Err(e) => {
            // Without the fence nothing can land safely. Report a death so the coordinator
            // decides (a retry, if the budget allows).
            warn!(error = %e, "cannot take the attempt fence");
            return Some(ExitReport::without_output(
                ExitClass::EngineError,
                format!("cannot take the fence: {e}"),
                now(),
            ));
        }
    };
    fence_tx.send_replace(Some(fence_seq));
    let fence_subject = subjects::fence(&work.turn);

    // Kept until the run is over: the backend reads the files from it.
    let spool = match crate::attachments::fetch(&inner.bus, &inner.config, work).await {
        Ok(s) => s,
        Err(crate::attachments::AttachmentError::Refused(e)) => {
            warn!(error = %e, "attachments refused");
            return Some(ExitReport::without_output(
                ExitClass::CouldNotStart,
                e,
                now(),
            ));
        }
        Err(crate::attachments::AttachmentError::Unavailable(e)) => {
            warn!(error = %e, "attachments unavailable; the attempt dies and may be retried");
            return Some(ExitReport::without_output(ExitClass::EngineError, e, now()));
        }
    };

    let spec = RunSpec {
        work: work.clone(),
        attachments: spool.files.clone(),
        memory_limit: inner.config.memory_limit.0,
        stop_grace: inner.config.stop_grace,
    };
    let (out_tx, mut out_rx) = mpsc::channel::<Output>(64);

    // Operator kills (subscribed before the claim), the time limit and a hard stop of the runner.
    let causes = crate::stop::Causes::watch(inner, work, kills, &stop_tx);

    let backend_inner = inner.clone();
    let backend_spec = spec.clone();
    let run = tokio::spawn(async move {
        backend_inner
            .backend
            .run(&backend_spec, out_tx, stop_rx)
            .await
    });

    let mut lander = Lander {
        inner: inner.as_ref(),
        work,
        fence_subject,
        fence_seq,
        landed: 0,
        replies: Vec::new(),
        status_seq: 0,
        verdict: None,
        verdict_error: None,
        any_output: false,
        fenced: false,
        uncertain: false,
    };
    let mut splitter = LineSplitter::new(MAX_LINE);
    while let Some(chunk) = out_rx.recv().await {
        match chunk {
            // Only now is the turn running: the agent has started.
            Output::Started => {
                emit(
                    inner,
                    work,
                    "started",
                    RunnerEventKind::Started { published_at },
                )
                .await;
                info!("attempt started");
            }
            Output::Stdout(bytes) => {
                lander.any_output = true;
                for line in splitter.push(&bytes) {
                    lander.line(line, &stop_tx).await;
                }
            }
            Output::Stderr(bytes) => {
                for line in String::from_utf8_lossy(&bytes).lines() {
                    debug!(stderr = line, "agent");
                }
            }
        }
    }
    if let Some(line) = splitter.finish() {
        lander.line(line, &stop_tx).await;
    }
    let raw = match run.await {
        Ok(raw) => raw,
        Err(e) => crate::classify::RawExit {
            engine_error: Some(format!("backend task failed: {e}")),
            ..Default::default()
        },
    };
    drop(causes);

    let class = classify(&raw, lander.verdict, lander.any_output);
    // Record who stopped the run, when the runner did.
    let stopped = raw
        .stopped_by
        .map(|why| format!("stopped by the runner: {why:?}"));
    let error = raw
        .start_error
        .clone()
        .or(raw.engine_error.clone())
        .or(stopped)
        .or(lander.verdict_error.clone());
    info!(?class, exit_code = ?raw.exit_code, signal = ?raw.signal, landed = lander.landed, "attempt ended");
    let uncertain = lander.uncertain;
    let mut report = ExitReport {
        class,
        exit_code: raw.exit_code,
        signal: raw.signal,
        error,
        messages_landed: lander.landed,
        replies: lander.replies,
        ended_at: now(),
        started: None,
    };
    if uncertain {
        settle_uncertain(inner, work, &mut report).await?;
    }
    Some(report)
}

/// A publish whose outcome is unknown may still land: fence the attempt out first (nothing of it
/// can land after that), then count what landed, as the sweep does for a lost attempt. Without
/// this a reply that landed unacknowledged was reported as none, and the turn retried after a
/// reply (found by the model checker: `Bugs::trust_uncertain_count`). `None` when the count
/// cannot be settled: no report then; the lease lapses and the sweep counts.
async fn settle_uncertain(inner: &Inner, work: &WorkItem, report: &mut ExitReport) -> Option<()> {
    match fence_out_and_count(inner, &work.chat, &work.turn, work.attempt).await {
        Settled::Landed(replies) => {
            report.messages_landed = replies.len() as u32;
            report.replies = replies;
            Some(())
        }
        // A later attempt holds the fence: this report changes nothing.
        Settled::Superseded => Some(()),
        Settled::Unknown => None,
    }
}

/// What fencing one of this runner's attempts out found.
enum Settled {
    /// Fenced out; these replies of it landed (stream sequences), and no more can.
    Landed(Vec<u64>),
    /// A later attempt holds the fence already.
    Superseded,
    /// The fence or the count failed; the coordinator's lease sweep will settle the attempt.
    Unknown,
}

/// Move the turn's fence past `attempt` (only if it could still hold it), then count what of it
/// landed: after the move the count is final. The same order as the sweep's for a lost attempt.
async fn fence_out_and_count(
    inner: &Inner,
    chat: &turnpike_core::ChatId,
    turn: &turnpike_core::TurnId,
    attempt: u32,
) -> Settled {
    use turnpike_store::fence::{self, Losing};
    match fence::lose(&inner.bus, turn, attempt).await {
        Ok(Losing::Fenced { runner_seq }) => {
            match fence::landed(&inner.bus, chat, turn, attempt, runner_seq).await {
                Ok(replies) => Settled::Landed(replies),
                Err(e) => {
                    warn!(turn_id = %turn, attempt, error = %e, "could not count what the attempt landed; the lease sweep will settle it");
                    Settled::Unknown
                }
            }
        }
        Ok(Losing::Stale { current }) => {
            debug!(turn_id = %turn, attempt, current, "a later attempt holds the fence");
            Settled::Superseded
        }
        Err(e) => {
            warn!(turn_id = %turn, attempt, error = %e, "could not fence the attempt out; the lease sweep will settle it");
            Settled::Unknown
        }
    }
}

/// Longest agent error kept in an exit report (and so in the turn record).
const MAX_ERROR: usize = 4096;

struct Lander<'a> {
    inner: &'a Inner,
    work: &'a WorkItem,
    fence_subject: String,
    fence_seq: u64,
    landed: u32,
    /// Outbound stream sequences of the landed messages, in order.
    replies: Vec<u64>,
    status_seq: u32,
    verdict: Option<AgentStatus>,
    verdict_error: Option<String>,
    any_output: bool,
    fenced: bool,
    /// A bot message was published and never acknowledged: it may have landed or not, so
    /// `landed` may be short (see [`settle_uncertain`]).
    uncertain: bool,
}

impl Lander<'_> {
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
                let shown: String = text.chars().take(200).collect();
                debug!(line = %shown, error = %e, "agent stdout (not a protocol line)");
                return;
            }
        };
        self.parsed(parsed, stop).await
    }

    async fn parsed(&mut self, line: AgentLine, stop: &watch::Sender<Option<StopReason>>) {
        match line {
            AgentLine::Message { text } => self.message(text, stop).await,
            AgentLine::Status { text } => self.status(text).await,
            AgentLine::Result { status, error } => {
                self.verdict = Some(status);
                // Kept in the turn record: bounded.
                self.verdict_error =
                    error.map(|e| turnpike_core::texts::truncate(&e, MAX_ERROR).into_owned());
            }
        }
    }

    async fn message(&mut self, text: String, stop: &watch::Sender<Option<StopReason>>) {
        if self.fenced {
            return;
        }
        let text = self.bounded(text);
        let seq = self.landed + 1;
        let item = OutboundItem {
            v: FORMAT_VERSION,
            kind: OutboundKind::Message,
            chat: self.work.chat.clone(),
            turn: self.work.turn.clone(),
            attempt: self.work.attempt,
            text,
            status_id: None,
            r#final: false,
        };
        let bus = &self.inner.bus;
        let subject = subjects::chat_out(&self.work.chat);
        let mut retries = crate::retries::Retries::bot_message();
        loop {
            let publish = Publish::new(bus.codec, subject.clone(), &item).map(|p| {
                p.msg_id(&msg_id::bot_message(
                    &self.work.turn,
                    self.work.attempt,
                    seq,
                ))
                .header(subjects::HDR_TURN, self.work.turn.as_str())
                .header(subjects::HDR_ATTEMPT, &self.work.attempt.to_string())
                .header(subjects::HDR_KIND, "message")
                .expect_last_on(&self.fence_subject, self.fence_seq)
            });
            let result = match publish {
                Ok(p) => p.send(&bus.js).await,
                Err(e) => Err(e),
            };
            match result {
                Ok(ack) => {
                    self.landed = seq;
                    self.replies.push(ack.sequence);
                    emit(
                        self.inner,
                        self.work,
                        &format!("landed.{seq}"),
                        RunnerEventKind::MessageLanded {
                            seq,
                            // Where it is stored, so the coordinator reads it back by sequence.
                            stream_seq: Some(ack.sequence),
                        },
                    )
                    .await;
                    return;
                }
                Err(BusError::Fenced { .. }) => {
                    self.fenced = true;
                    let why =
                        crate::stop::fence_moved(self.inner, &self.work.turn, self.fence_seq).await;
                    warn!(
                        ?why,
                        "the fence moved: the bot message was refused; stopping the run"
                    );
                    crate::stop::request(stop, why);
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

    /// Text cut to `message_max_bytes`, with a marker: a long reply is shown cut, never dropped.
    fn bounded(&self, text: String) -> String {
        let max = self.inner.config.message_max_bytes.0 as usize;
        match turnpike_core::texts::truncate(&text, max) {
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
        let text = self.bounded(text);
        self.status_seq += 1;
        let bus = &self.inner.bus;
        let item = OutboundItem {
            v: FORMAT_VERSION,
            kind: OutboundKind::Status,
            chat: self.work.chat.clone(),
            turn: self.work.turn.clone(),
            attempt: self.work.attempt,
            text: text.clone(),
            status_id: Some(subjects::status_id(&self.work.turn)),
            r#final: false,
        };
        let published = match Publish::new(bus.codec, subjects::chat_out(&self.work.chat), &item) {
            Ok(p) => {
                p.msg_id(&msg_id::status(
                    &self.work.turn,
                    self.work.attempt,
                    self.status_seq,
                ))
                .header(subjects::HDR_TURN, self.work.turn.as_str())
                .header(subjects::HDR_KIND, "status")
                .expect_last_on(&self.fence_subject, self.fence_seq)
                .send(&bus.js)
                .await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = published {
            debug!(error = %e, "status update not published");
        }
        emit(
            self.inner,
            self.work,
            &format!("progress.{}", self.status_seq),
            RunnerEventKind::Progress { text },
        )
        .await;
    }
}

/// What a runner event is about.
#[derive(Clone, Copy)]
pub(crate) struct WorkItemRef<'a> {
    turn: &'a turnpike_core::TurnId,
    chat: &'a turnpike_core::ChatId,
    attempt: u32,
}

/// Publish a runner event, retried (same dedup id) so a blip does not lose it.
pub(crate) async fn emit(inner: &Inner, work: &WorkItem, what: &str, kind: RunnerEventKind) {
    let about = WorkItemRef {
        turn: &work.turn,
        chat: &work.chat,
        attempt: work.attempt,
    };
    emit_for(inner, about, what, kind).await
}

async fn emit_for(inner: &Inner, work: WorkItemRef<'_>, what: &str, kind: RunnerEventKind) {
    let event = RunnerEvent {
        v: FORMAT_VERSION,
        turn: work.turn.clone(),
        chat: work.chat.clone(),
        attempt: work.attempt,
        runner: inner.id.clone(),
        at: now(),
        kind,
    };
    let id = msg_id::event(work.turn, work.attempt, what);
    let mut retries = crate::retries::Retries::event();
    loop {
        let publish = Publish::new(inner.bus.codec, subjects::events(work.turn), &event).map(|p| {
            p.msg_id(&id)
                .header(subjects::HDR_TURN, work.turn.as_str())
                .header(subjects::HDR_ATTEMPT, &work.attempt.to_string())
        });
        let result = match publish {
            Ok(p) => p.send(&inner.bus.js).await.map(|_| ()),
            Err(e) => Err(e),
        };
        let Err(e) = result else { return };
        match retries.after_failure() {
            Some(wait) => {
                warn!(error = %e, event = what, "runner event not acknowledged; retrying");
                tokio::time::sleep(wait).await;
            }
            None => {
                warn!(
                    event = what,
                    "runner event lost after every try; the lease sweep will settle the attempt"
                );
                return;
            }
        }
    }
}

/// Report an attempt found as a leftover container after a restart: runner lost. Like the
/// coordinator's sweep, it first fences the attempt out (unless a later attempt holds the fence
/// already) and then counts what of it landed, so a reply that landed is never followed by a retry.
pub(crate) async fn report_orphan(
    inner: &Inner,
    turn: turnpike_core::TurnId,
    chat: turnpike_core::ChatId,
    attempt: u32,
) {
    let Settled::Landed(replies) = fence_out_and_count(inner, &chat, &turn, attempt).await else {
        return;
    };
    let work_like = WorkItemRef {
        turn: &turn,
        chat: &chat,
        attempt,
    };
    let report =
        ExitReport::runner_lost("the runner restarted while the attempt ran", replies, now());
    emit_for(
        inner,
        work_like,
        "exited",
        RunnerEventKind::Exited { report },
    )
    .await;
}

async fn report_exit(inner: &Inner, work: &WorkItem, report: ExitReport) {
    emit(inner, work, "exited", RunnerEventKind::Exited { report }).await;
}
