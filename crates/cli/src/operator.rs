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
use turnpike_core::wire::{OpsReply, OpsRequest};
use turnpike_core::{subjects, ChatId, TurnId, TurnRecord};
use turnpike_jetstream::now;
use turnpike_store::turns;
use turnpike_store::{views, Bus};

pub mod cluster;

#[derive(Subcommand)]
pub enum TurnsCmd {
    /// List turns: those not yet ended, or every stored turn with --all.
    Ls {
        #[arg(long, value_parser = parse_state)]
        state: Option<TurnState>,
        #[arg(long)]
        chat: Option<String>,
        /// Every stored turn, ended ones included (reads the whole bucket).
        #[arg(long)]
        all: bool,
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
    /// Chats flagged errored (a turn gave up, or the agent could not start).
    Errored,
    /// Clear a chat's errored flag.
    Clear {
        chat: String,
        #[arg(long, default_value_t = default_operator())]
        by: String,
    },
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
        TurnsCmd::Ls { state, chat, all } => {
            let ids = if all {
                views::all_ids(bus).await?
            } else {
                views::live_ids(bus).await?
            };
            let mut records = views::records(bus, &ids).await?;
            records.retain(|r| {
                state.is_none_or(|s| s == r.state)
                    && chat.as_deref().is_none_or(|c| c == r.chat.as_str())
            });
            records.sort_by_key(|r| r.created_at);
            let headers = ["TURN", "CHAT", "STATE", "ATTEMPT", "UPDATED"];
            print_list(json, &records, &headers, |r| {
                Some(vec![
                    r.turn.to_string(),
                    r.chat.to_string(),
                    r.state.to_string(),
                    format!("{}/{}", r.attempt, r.max_attempts),
                    age(r.updated_at),
                ])
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

pub async fn chats_cmd(bus: &Bus, cmd: ChatsCmd, json: bool) -> Result<ExitCode> {
    match cmd {
        ChatsCmd::Errored => {
            let flagged = views::errored_chats(bus).await?;
            print_list(json, &flagged, &["CHAT", "TURN", "AT", "REASON"], |c| {
                c.errored.as_ref().map(|e| {
                    vec![
                        c.chat.to_string(),
                        e.turn.to_string(),
                        e.at.to_string(),
                        e.reason.clone(),
                    ]
                })
            })
        }
        ChatsCmd::Clear { chat, by } => {
            let chat = ChatId::new(chat).context("chat id")?;
            action(bus, subjects::OPS_CLEAR, &OpsRequest::chat(by, chat), json).await
        }
    }
}
