//! Sending a message and following its turn live: what `turnpike send` and the demo print.

use anyhow::{Context, Result};
use futures::StreamExt;
use std::io::Write;
use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::wire::{Attachment, ChatRecord, InboundMessage, OutboundItem, OutboundKind};
use turnpike_core::{subjects, ChatId, TurnId, TurnRecord};
use turnpike_jetstream::{decode, decode_kv};
use turnpike_store::{views, Bus};

/// How a followed turn ended, as an exit code for scripts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowOutcome {
    /// Done with a reply: exit 0.
    Answered,
    /// Done without a reply (silent-turn notice): exit 3.
    Silent,
    /// Failed (plain notice): exit 1.
    Failed,
    /// Gave up after every attempt died: exit 4.
    GaveUp,
    /// Killed by an operator: exit 5.
    Killed,
    /// Still not ended when following stopped: exit 6.
    StillRunning,
}

impl FollowOutcome {
    pub fn exit_code(self) -> std::process::ExitCode {
        std::process::ExitCode::from(match self {
            FollowOutcome::Answered => 0,
            FollowOutcome::Failed => 1,
            FollowOutcome::Silent => 3,
            FollowOutcome::GaveUp => 4,
            FollowOutcome::Killed => 5,
            FollowOutcome::StillRunning => 6,
        })
    }

    fn of(record: &TurnRecord) -> FollowOutcome {
        match record.state {
            TurnState::Done if record.any_landed() => FollowOutcome::Answered,
            TurnState::Done => FollowOutcome::Silent,
            TurnState::Failed => FollowOutcome::Failed,
            TurnState::GaveUp => FollowOutcome::GaveUp,
            TurnState::Killed => FollowOutcome::Killed,
            _ => FollowOutcome::StillRunning,
        }
    }
}

/// Where follow lines go (stdout for the CLI; the demo indents them).
pub struct Printer {
    out: Box<dyn Write + Send>,
    indent: &'static str,
}

impl Printer {
    pub fn stdout() -> Self {
        Printer {
            out: Box::new(std::io::stdout()),
            indent: "",
        }
    }

    pub fn indented(indent: &'static str) -> Self {
        Printer {
            out: Box::new(std::io::stdout()),
            indent,
        }
    }

    pub fn line(&mut self, text: &str) {
        // A closed stdout (piped into `head`) is not worth failing over.
        let _ = writeln!(self.out, "{}{text}", self.indent);
        let _ = self.out.flush();
    }
}

/// Upload files to the object store as `<chat>/<message id>/<file name>`.
/// `turnpike send`: upload the attachments, send the message, and follow the turn to its end.
pub async fn send_command(
    config: &turnpike_config::Config,
    chat: String,
    id: Option<String>,
    timeout: std::time::Duration,
    attach: &[std::path::PathBuf],
    text: &str,
) -> anyhow::Result<std::process::ExitCode> {
    use anyhow::Context;
    let chat = turnpike_core::ChatId::new(chat).context("--chat")?;
    let bus = turnpike_store::Bus::connect(config, "turnpike-send").await?;
    let id = id.unwrap_or_else(|| {
        format!(
            "cli-{}-{}",
            turnpike_jetstream::now().millis(),
            std::process::id()
        )
    });
    let attachments = upload(&bus, &chat, &id, attach).await?;
    let outcome = send_and_follow(
        &bus,
        &chat,
        id,
        attachments,
        text,
        timeout,
        &mut Printer::stdout(),
    )
    .await?;
    Ok(outcome.exit_code())
}

pub async fn upload(
    bus: &Bus,
    chat: &ChatId,
    id: &str,
    files: &[std::path::PathBuf],
) -> Result<Vec<Attachment>> {
    let mut out = Vec::new();
    for f in files {
        let name = f
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .with_context(|| format!("{} has no file name", f.display()))?;
        let object = format!("{chat}/{id}/{name}");
        let mut file = tokio::fs::File::open(f)
            .await
            .with_context(|| format!("open {}", f.display()))?;
        turnpike_store::attachments::put(bus, &object, &mut file)
            .await
            .with_context(|| format!("upload {} to the object store", f.display()))?;
        out.push(Attachment { name, object });
    }
    Ok(out)
}

pub async fn send_and_follow(
    bus: &Bus,
    chat: &ChatId,
    id: String,
    attachments: Vec<Attachment>,
    text: &str,
    timeout: Duration,
    printer: &mut Printer,
) -> Result<FollowOutcome> {
    let turn = TurnId::for_message(chat, &id);
    let sub = bus
        .client
        .subscribe(subjects::chat_out(chat))
        .await
        .context("subscribe to the chat's outbound subject")?;
    let watch = views::watch_turn(bus, &turn).await?;
    // The chat record says whether the turn really waits for an earlier one: every new turn is
    // created waiting and joins its chat a moment later.
    let chat_watch = views::watch_chat(bus, chat).await?;
    let message = InboundMessage {
        attachments,
        ..InboundMessage::new(chat.clone(), id.clone(), text, Some("turnpike-cli".into()))
    };
    turnpike_jetstream::publish_inbound(&bus.js, bus.codec, &message)
        .await
        .context("publish the message")?;
    printer.line(&format!("→ sent to {chat} as turn {turn}"));
    let watches = Watches {
        turn: watch,
        chat: chat_watch,
    };
    follow(bus, &turn, sub, watches, timeout, printer).await
}

/// The KV watches a follower reads: the turn's record and its chat's.
pub struct Watches {
    pub turn: async_nats::jetstream::kv::Watch,
    pub chat: async_nats::jetstream::kv::Watch,
}

/// Print a turn's bot messages, progress, notices and attempts until it ends.
pub async fn follow(
    bus: &Bus,
    turn: &TurnId,
    mut sub: async_nats::Subscriber,
    mut watches: Watches,
    timeout: Duration,
    printer: &mut Printer,
) -> Result<FollowOutcome> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut last: Option<(TurnState, u32)> = None;
    let mut outcome = FollowOutcome::StillRunning;
    let mut waiting = WaitNotice::default();
    let mut final_seen = false;
    // The record may exist already (a re-sent id, or a fast turn).
    if let Ok(Some(v)) = turnpike_store::turns::load(bus, turn).await {
        waiting.turn_waits = v.record.state == TurnState::Waiting;
        if let Some(o) = describe(&v.record, &mut last, printer) {
            outcome = o;
        }
    }
    // Ended before we looked (a re-sent id): its final status may be long gone.
    let ended_before = outcome != FollowOutcome::StillRunning;
    while outcome == FollowOutcome::StillRunning {
        waiting.print_once(printer);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => {
                printer.line("… still running; stopped following (see `turnpike turns show`)");
                return Ok(FollowOutcome::StillRunning);
            }
            m = sub.next() => {
                let Some(m) = m else { break };
                final_seen |= print_item(turn, &m, printer);
            }
            e = watches.turn.next() => {
                let Some(Ok(entry)) = e else { continue };
                if let Ok(record) = decode_kv::<TurnRecord>(&entry.value) {
                    waiting.turn_waits = record.state == TurnState::Waiting;
                    if let Some(o) = describe(&record, &mut last, printer) {
                        outcome = o;
                    }
                }
            }
            e = watches.chat.next() => {
                let Some(Ok(entry)) = e else { continue };
                if let Ok(chat) = decode_kv::<ChatRecord>(&entry.value) {
                    waiting.behind = chat
                        .waiting
                        .contains(turn)
                        .then(|| chat.live.clone())
                        .flatten();
                }
            }
        }
    }
    // The terminal record is written before its notice is published, and the turn's final
    // status comes after its notice: print until that status (or a few seconds, if its
    // coordinator died before sending it: the sweep sends it later).
    let drain = if ended_before { 500 } else { 5000 };
    let drain_until = deadline.min(tokio::time::Instant::now() + Duration::from_millis(drain));
    while !final_seen {
        let Ok(Some(m)) = tokio::time::timeout_at(drain_until, sub.next()).await else {
            break;
        };
        final_seen = print_item(turn, &m, printer);
    }
    Ok(outcome)
}

/// "waiting for the chat's earlier turn", said once, and only while the turn's record is waiting
/// and its chat record queues it behind another live turn.
#[derive(Default)]
struct WaitNotice {
    turn_waits: bool,
    behind: Option<TurnId>,
    said: bool,
}

impl WaitNotice {
    fn print_once(&mut self, printer: &mut Printer) {
        if self.said || !self.turn_waits {
            return;
        }
        if let Some(earlier) = &self.behind {
            printer.line(&format!("   waiting for the chat's earlier turn {earlier}"));
            self.said = true;
        }
    }
}

/// "1 attempt", "3 attempts".
pub fn attempts(n: u32) -> String {
    turnpike_core::texts::count(n.into(), "attempt", "attempts")
}

/// Print one outbound item of `turn`; true for its final status (the last one it gets).
fn print_item(turn: &TurnId, m: &async_nats::Message, printer: &mut Printer) -> bool {
    let Ok(item) = decode::<OutboundItem>(m.headers.as_ref(), &m.payload) else {
        return false;
    };
    if &item.turn != turn {
        return false;
    }
    match item.kind {
        OutboundKind::Message => printer.line(&format!("bot: {}", item.text)),
        OutboundKind::Status if item.r#final => return true,
        OutboundKind::Status => printer.line(&format!("   … {}", item.text)),
        OutboundKind::Notice => printer.line(&item.text),
    }
    false
}

/// Print what changed since `last`; `Some` once the turn ended.
fn describe(
    r: &TurnRecord,
    last: &mut Option<(TurnState, u32)>,
    printer: &mut Printer,
) -> Option<FollowOutcome> {
    let now_key = (r.state, r.attempt);
    if *last != Some(now_key) {
        *last = Some(now_key);
        match r.state {
            // Said by `WaitNotice`, and only when an earlier turn holds the chat.
            TurnState::Waiting => {}
            TurnState::Queued => printer.line(&format!(
                "   attempt {} of {} queued",
                r.attempt, r.max_attempts
            )),
            TurnState::Running => {
                let runner = r
                    .current_attempt()
                    .and_then(|a| a.runner.as_ref())
                    .map(|x| x.as_str())
                    .unwrap_or("?");
                printer.line(&format!(
                    "   attempt {} of {} running on {runner}",
                    r.attempt, r.max_attempts
                ));
            }
            TurnState::PendingRetry => {
                let died = r
                    .attempts
                    .iter()
                    .find(|a| a.n + 1 == r.attempt)
                    .and_then(|a| a.exit.as_ref())
                    .map(|e| e.class.to_string())
                    .unwrap_or_else(|| "unknown".into());
                printer.line(&format!(
                    "   attempt {} died ({died}) with no reply; retrying in {} (attempt {} of {})",
                    r.attempt - 1,
                    humantime::format_duration(r.retry_delay),
                    r.attempt,
                    r.max_attempts
                ));
            }
            s => printer.line(&format!("   turn {s} after {}", attempts(r.attempt))),
        }
    }
    r.state.is_terminal().then(|| FollowOutcome::of(r))
}
