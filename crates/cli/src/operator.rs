//! Operator commands: `turns` and `chats` here; `runners`, `status` and `watch` in `cluster`.
//! Human tables by default, `--json` for scripts. Reads go straight to the KV buckets and
//! streams; actions go to the coordinators' `turnpike.ops.*` service, so they are applied with
//! the same rules as everything else.

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use serde::Serialize;
use std::process::ExitCode;
use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::wire::{ErroredQuery, LivePage, LiveQuery, LiveTurn, OpsReply, OpsRequest};
use turnpike_core::{subjects, ChatId, TurnId, TurnRecord};
use turnpike_jetstream::now;
use turnpike_store::turns;
use turnpike_store::{views, Bus};

pub mod cluster;

#[derive(Subcommand)]
pub enum TurnsCmd {
    /// List turns, newest first: those not yet ended (from the coordinators' read model), or
    /// every stored turn with --all.
    Ls {
        #[arg(long, value_parser = parse_state)]
        state: Option<TurnState>,
        /// One chat's turns only (reads that chat's record and its turns').
        #[arg(long)]
        chat: Option<String>,
        /// Every stored turn, ended ones included (reads the whole bucket).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Everything about one turn: every attempt, its runner, times, exit, messages landed.
    Show { turn: String },
    /// Kill a turn (its running attempt, or its pending retry).
    Kill {
        turn: String,
        #[arg(long, default_value_t = default_operator())]
        by: String,
    },
    /// Run an ended turn again, as a new turn linked to it.
    Rerun {
        turn: String,
        #[arg(long, default_value_t = default_operator())]
        by: String,
    },
}

#[derive(Subcommand)]
pub enum ChatsCmd {
    /// Chats flagged errored (a turn gave up, or the agent could not start), most recently
    /// flagged first.
    Errored {
        #[command(flatten)]
        page: PageArgs,
    },
    /// Clear a chat's errored flag.
    Clear {
        chat: String,
        #[arg(long, default_value_t = default_operator())]
        by: String,
    },
    /// The resource profile a chat runs with; with a profile, move the chat to it (its attempts
    /// dispatched from now on run with it). `--default` moves it back to the default.
    Profile {
        chat: String,
        profile: Option<String>,
        #[arg(long, conflicts_with = "profile")]
        default: bool,
        #[arg(long, default_value_t = default_operator())]
        by: String,
    },
    /// A chat's workspace: which version it has; `--download FILE` writes it as a tar file
    /// (`-`: stdout; `--previous`: the version before), `--reset` forgets it (the chat's next
    /// turn starts empty) and deletes its versions.
    Workspace {
        chat: String,
        #[arg(long, conflicts_with = "reset")]
        download: Option<std::path::PathBuf>,
        #[arg(long, requires = "download")]
        previous: bool,
        #[arg(long)]
        reset: bool,
        #[arg(long, default_value_t = default_operator())]
        by: String,
    },
}

/// Which part of a long list to show.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct PageArgs {
    /// Show at most this many.
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Skip this many first (the next page of 50 is --offset 50).
    #[arg(long, default_value_t = 0)]
    offset: usize,
}

/// What one request asks for at most: the coordinators answer up to 500 a page.
const PER_REQUEST: usize = 500;

/// Up to `page.limit` items from `page.offset`, fetched `PER_REQUEST` at a time by `fetch(offset,
/// limit)` (which answers the total that match and its items); the total and the items.
async fn gather<T, F, Fut>(page: PageArgs, mut fetch: F) -> Result<(usize, Vec<T>)>
where
    F: FnMut(usize, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(usize, Vec<T>), turnpike_jetstream::BusError>>,
{
    let mut items = Vec::new();
    loop {
        let want = (page.limit - items.len()).min(PER_REQUEST);
        let (total, got) = fetch(page.offset + items.len(), want).await?;
        let more = !got.is_empty();
        items.extend(got);
        if !more || items.len() >= page.limit || page.offset + items.len() >= total {
            return Ok((total, items));
        }
    }
}

/// A page as JSON (`{"v", "total", <what>: [...]}`) or as a table, with a line on stderr saying
/// which part of how many it shows when it is not all.
#[allow(clippy::too_many_arguments)]
fn print_page<T: Serialize>(
    json: bool,
    what: &str,
    total: usize,
    page: PageArgs,
    items: &[T],
    headers: &[&str],
    row: impl Fn(&T) -> Vec<String>,
) -> Result<ExitCode> {
    if json {
        print_json(&serde_json::json!({
            "v": turnpike_core::FORMAT_VERSION,
            "total": total,
            what: items,
        }))?;
    } else {
        let rows: Vec<Vec<String>> = items.iter().map(row).collect();
        table(headers, &rows);
        if items.len() < total {
            let first = (page.offset + 1).min(total);
            let last = page.offset + items.len();
            eprintln!(
                "{first}–{last} of {total} {what}, newest first (--offset {last} for the next; --limit for more)"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn parse_state(s: &str) -> Result<TurnState, turnpike_core::record::UnknownTurnState> {
    s.parse()
}

fn default_operator() -> String {
    std::env::var("USER").unwrap_or_else(|_| "operator".into())
}

/// Columns padded to their widest cell.
fn table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        println!("{}", parts.join("  ").trim_end());
    };
    line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r.clone());
    }
}

/// A list, as JSON or as a table of `headers` with one `row` per item (none: left out).
fn print_list<T: Serialize>(
    json: bool,
    items: &[T],
    headers: &[&str],
    row: impl Fn(&T) -> Option<Vec<String>>,
) -> Result<ExitCode> {
    if json {
        print_json(&items)?;
    } else {
        let rows: Vec<Vec<String>> = items.iter().filter_map(row).collect();
        table(headers, &rows);
    }
    Ok(ExitCode::SUCCESS)
}

fn print_json<T: Serialize>(value: &T) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn age(t: turnpike_core::Timestamp) -> String {
    let d = now().since(t);
    let secs = d.as_secs();
    if secs < 120 {
        format!("{secs}s ago")
    } else if secs < 7200 {
        format!("{}m ago", secs / 60)
    } else {
        format!("{}h ago", secs / 3600)
    }
}

pub async fn turns_cmd(bus: &Bus, cmd: TurnsCmd, json: bool) -> Result<ExitCode> {
    match cmd {
        TurnsCmd::Ls {
            state,
            chat,
            all,
            page,
        } => {
            let chat = chat.map(ChatId::new).transpose().context("chat id")?;
            let query = |offset, limit| LiveQuery {
                v: turnpike_core::FORMAT_VERSION,
                state,
                since: None,
                offset,
                limit,
            };
            let (total, turns) = if all {
                // Every stored record, summarised and paged here.
                let mut records = views::records(bus, &views::all_ids(bus).await?).await?;
                records.retain(|r| chat.as_ref().is_none_or(|c| *c == r.chat));
                let summaries: Vec<LiveTurn> = records.iter().map(LiveTurn::of).collect();
                let p = LivePage::of(summaries.iter(), &query(page.offset, page.limit));
                (p.total, p.turns)
            } else {
                gather(page, |offset, limit| {
                    let (q, chat) = (query(offset, limit), chat.clone());
                    async move {
                        let p = match &chat {
                            Some(c) => views::chat_live_page(bus, c, &q).await?,
                            None => views::live_page(bus, &q).await?,
                        };
                        Ok((p.total, p.turns))
                    }
                })
                .await?
            };
            let headers = ["TURN", "CHAT", "STATE", "ATTEMPT", "RUNNER", "CREATED"];
            print_page(json, "turns", total, page, &turns, &headers, |t| {
                vec![
                    t.turn.to_string(),
                    t.chat.to_string(),
                    t.state.to_string(),
                    format!("{}/{}", t.attempt, t.max_attempts),
                    t.runner.as_ref().map_or("-".into(), ToString::to_string),
                    age(t.created_at),
                ]
            })
        }
        TurnsCmd::Show { turn } => {
            let id = TurnId::new(turn.as_str()).context("turn id")?;
            let Some(v) = turns::load(bus, &id).await? else {
                bail!("no turn {turn} (see `turnpike turns ls --all`)");
            };
            if json {
                print_json(&v.record)?;
            } else {
                show(&v.record);
            }
            Ok(ExitCode::SUCCESS)
        }
        TurnsCmd::Kill { turn, by } => {
            let turn = TurnId::new(turn).context("turn id")?;
            action(bus, subjects::OPS_KILL, &OpsRequest::turn(by, turn), json).await
        }
        TurnsCmd::Rerun { turn, by } => {
            let turn = TurnId::new(turn).context("turn id")?;
            action(bus, subjects::OPS_RERUN, &OpsRequest::turn(by, turn), json).await
        }
    }
}

fn show(r: &TurnRecord) {
    println!("turn      {}", r.turn);
    println!("chat      {}", r.chat);
    println!("state     {}", r.state);
    println!(
        "attempts  {} of {} (MAX_TURN_RETRY={} when created)",
        r.attempt, r.max_attempts, r.max_turn_retry
    );
    println!("created   {}", r.created_at);
    println!("message   {}", r.message.text);
    if let Some(o) = &r.outcome {
        println!("outcome   {} at {}", o.reason, o.at);
    }
    if let Some(n) = &r.notice {
        println!("notice    {}", n.text);
    }
    if let Some(k) = &r.kill {
        println!("killed by {} at {}", k.by, k.at);
    }
    if let Some(of) = &r.rerun_of {
        println!("rerun of  {of}");
    }
    if let Some(due) = r.next_attempt_due {
        println!("next due  {due}");
    }
    println!();
    let rows: Vec<Vec<String>> = r
        .attempts
        .iter()
        .map(|a| {
            let exit = a.exit.as_ref();
            vec![
                a.n.to_string(),
                a.runner
                    .as_ref()
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "-".into()),
                a.published_at
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                a.started_at
                    .map(|t| t.to_string())
                    .unwrap_or_else(|| "-".into()),
                exit.map(|e| e.ended_at.to_string())
                    .unwrap_or_else(|| "-".into()),
                exit.map(|e| e.class.to_string())
                    .unwrap_or_else(|| "-".into()),
                exit.and_then(|e| e.started.as_ref()?.profile.as_ref())
                    .map(|p| format!("{} ({})", p.name, turnpike_config::ByteSize(p.memory_limit)))
                    .unwrap_or_else(|| "-".into()),
                a.messages_landed.to_string(),
                if a.preamble.is_some() { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    table(
        &[
            "#",
            "RUNNER",
            "PUBLISHED",
            "STARTED",
            "ENDED",
            "EXIT",
            "PROFILE",
            "LANDED",
            "PREAMBLE",
        ],
        &rows,
    );
    for a in &r.attempts {
        if let Some(err) = a.exit.as_ref().and_then(|e| e.error.as_ref()) {
            println!("attempt {}: {err}", a.n);
        }
    }
}

async fn action(bus: &Bus, subject: &str, req: &OpsRequest, json: bool) -> Result<ExitCode> {
    // One id for this command: each try below is the same request, so a reply lost to a
    // time-out and tried again never makes a second re-run.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let req = req
        .clone()
        .with_id(format!("cli-{}-{stamp}", std::process::id()));
    let body = bytes::Bytes::from(req.to_json());
    const TRIES: u32 = 3;
    let mut reply = None;
    for tries in 1..=TRIES {
        match tokio::time::timeout(
            Duration::from_secs(10),
            bus.client.request(subject.to_owned(), body.clone()),
        )
        .await
        {
            Ok(Ok(m)) => {
                reply = Some(m);
                break;
            }
            Ok(Err(e)) if tries == TRIES => anyhow::bail!(
                "no coordinator answered {subject}: {e} — is a coordinator running?"
            ),
            Err(_) if tries == TRIES => anyhow::bail!(
                "no coordinator answered {subject} within {TRIES} tries of 10 s — is a coordinator running?"
            ),
            Ok(Err(_)) | Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    let reply = reply.context("no answer")?;
    let answer: OpsReply = serde_json::from_slice(&reply.payload)
        .with_context(|| format!("the coordinator's answer to {subject} is not an ops reply"))?;
    if json {
        print_json(&answer)?;
    } else {
        println!("{}", answer.message);
    }
    Ok(if answer.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

pub async fn chats_cmd(
    bus: &Bus,
    config: &turnpike_config::Config,
    cmd: ChatsCmd,
    json: bool,
) -> Result<ExitCode> {
    match cmd {
        ChatsCmd::Errored { page } => {
            let (total, chats) = gather(page, |offset, limit| async move {
                let q = ErroredQuery {
                    v: turnpike_core::FORMAT_VERSION,
                    since: None,
                    offset,
                    limit,
                };
                let p = views::errored_page(bus, &q).await?;
                Ok((p.total, p.chats))
            })
            .await?;
            let headers = ["CHAT", "TURN", "AT", "REASON"];
            print_page(json, "chats", total, page, &chats, &headers, |c| {
                vec![
                    c.chat.to_string(),
                    c.error.turn.to_string(),
                    c.error.at.to_string(),
                    c.error.reason.clone(),
                ]
            })
        }
        ChatsCmd::Clear { chat, by } => {
            let chat = ChatId::new(chat).context("chat id")?;
            action(bus, subjects::OPS_CLEAR, &OpsRequest::chat(by, chat), json).await
        }
        ChatsCmd::Profile {
            chat,
            profile,
            default,
            by,
        } => {
            let chat = ChatId::new(chat).context("chat id")?;
            if profile.is_some() || default {
                let req = OpsRequest::profile(by, chat, profile);
                return action(bus, subjects::OPS_PROFILE, &req, json).await;
            }
            let moved = turnpike_store::profiles::of_chat(bus, &chat).await?;
            let name = moved.clone().unwrap_or(config.default_profile.clone());
            let limits = config.profile(Some(&name));
            if json {
                print_json(&serde_json::json!({
                    "chat": chat,
                    "profile": name,
                    "moved": moved.is_some(),
                    "memory_limit": limits.as_ref().map(|p| p.memory_limit.0),
                    "run_timeout_ms": limits.as_ref().map(|p| p.run_timeout.as_millis() as u64),
                }))?;
            } else {
                let how = if moved.is_some() {
                    ""
                } else {
                    " (the default)"
                };
                match limits {
                    Some(p) => println!(
                        "{chat}: profile {name}{how}: memory {}, {} CPUs, time limit {}, image {}",
                        p.memory_limit,
                        p.cpus,
                        humantime::format_duration(p.run_timeout),
                        p.agent_image
                    ),
                    None => {
                        println!("{chat}: profile {name}{how} (not defined in this configuration)")
                    }
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ChatsCmd::Workspace {
            chat,
            download,
            previous,
            reset,
            by,
        } => {
            let chat = ChatId::new(chat).context("chat id")?;
            if reset {
                let req = OpsRequest::chat(by, chat);
                return action(bus, subjects::OPS_WORKSPACE_RESET, &req, json).await;
            }
            let ws = turnpike_store::workspaces::of_chat(bus, &chat).await?;
            let Some(to) = download else {
                if json {
                    print_json(&serde_json::json!({ "chat": chat, "workspace": ws }))?;
                } else {
                    match &ws {
                        Some(w) => println!(
                            "{chat}: workspace {} (previous: {})",
                            w.current,
                            w.previous.as_deref().unwrap_or("none")
                        ),
                        None => println!("{chat}: no workspace saved"),
                    }
                }
                return Ok(ExitCode::SUCCESS);
            };
            let object = ws.and_then(|w| {
                if previous {
                    w.previous
                } else {
                    Some(w.current)
                }
            });
            let Some(object) = object else {
                anyhow::bail!("chat {chat} has no such workspace version");
            };
            let bytes =
                turnpike_store::workspaces::get(bus, &object, config.workspaces_store_max_bytes.0)
                    .await?
                    .with_context(|| format!("workspace {object} is gone (expired)"))?;
            if to.as_os_str() == "-" {
                use std::io::Write;
                std::io::stdout().write_all(&bytes)?;
            } else {
                std::fs::write(&to, &bytes).with_context(|| format!("write {}", to.display()))?;
                eprintln!("{object}: {} bytes to {}", bytes.len(), to.display());
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gather` asks in requests of at most `PER_REQUEST` and answers exactly the page asked
    /// for: from the offset, up to the limit, short at the end of the list.
    #[tokio::test]
    async fn gather_pages_through_requests_of_at_most_500() {
        let list: Vec<usize> = (0..1_234).collect();
        for (offset, limit) in [(0, 50), (50, 1_100), (1_200, 100), (2_000, 10), (0, 0)] {
            let asked = std::cell::RefCell::new(Vec::new());
            let (total, items) = gather(PageArgs { limit, offset }, |o, l| {
                asked.borrow_mut().push(l);
                let got: Vec<usize> = list.iter().copied().skip(o).take(l).collect();
                async move { Ok((1_234, got)) }
            })
            .await
            .expect("gathered");
            assert_eq!(total, 1_234);
            let want: Vec<usize> = list.iter().copied().skip(offset).take(limit).collect();
            assert_eq!(items, want, "offset {offset}, limit {limit}");
            assert!(
                asked.borrow().iter().all(|l| *l <= PER_REQUEST),
                "{:?}",
                asked.borrow()
            );
        }
    }
}
