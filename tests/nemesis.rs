//! The randomized nemesis (issue 34): the fault suite's cluster (3 NATS nodes R3, 2
//! coordinators, a dispatcher, 3 Docker runners) under a workload of many chats sending a mix of
//! turns, while a seeded schedule of overlapping faults kills, pauses, cuts off and stops its
//! containers. Then the cluster heals, every turn must end, and the checker judges the whole
//! history (`nemesis/check.rs`), turn by turn, from the chat output, the records and the engine's
//! container events.
//!
//! `TURNPIKE_NEMESIS_SECS` (default 300) is how long faults are struck; `TURNPIKE_NEMESIS_SEED`
//! picks the schedule and the workload (default: a fixed seed, so CI runs one known schedule; the
//! long run takes a new one and prints it); `TURNPIKE_NEMESIS_CHATS` (default 12) how many chats
//! send at once. A violation prints the turn, the seed and the faults
//! around it; the same seed strikes the same faults at the same offsets again.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use turnpike_core::{subjects, TurnId, TurnRecord};
use turnpike_store::turns;
use turnpike_tests::cluster::*;
use turnpike_tests::init_logs;

#[path = "nemesis/check.rs"]
mod check;
#[path = "nemesis/schedule.rs"]
mod schedule;

use check::{AgentLife, History, Script, Sent};
use schedule::{Fault, Kind};

/// The seed CI runs: any fixed one; a seed that found a bug becomes a case of its own.
const CI_SEED: u64 = 34;
/// Chats sending at once, unless `TURNPIKE_NEMESIS_CHATS` says otherwise.
const CHATS: u64 = 12;
/// Unended turns a chat may have before it waits: enough to queue behind a running turn.
const CHAT_BACKLOG: usize = 2;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// The workload's mix: every script the issue names, replies most often.
fn draw_script(rng: &mut StdRng) -> (Script, String) {
    match rng.random_range(0..100) {
        0..=24 => (
            Script::Reply,
            format!("reply:r{}", rng.random_range(0..1000)),
        ),
        25..=39 => (
            Script::Slow,
            format!("sleep:{:.1}", rng.random_range(0.5..4.0)),
        ),
        40..=44 => (Script::Long, "big-reply:60000".into()),
        45..=51 => (Script::Attachment, "attachments".into()),
        52..=65 => (Script::DieThenReply, "die-until:2".into()),
        66..=72 => (Script::AlwaysDie, "die-until:99".into()),
        73..=80 => (Script::PartialThenDie, "crash-after-reply".into()),
        81..=88 => (Script::AgentFailure, "fail".into()),
        _ => (Script::HangThenKill, "hang".into()),
    }
}

async fn load(c: &Cluster, turn: &TurnId) -> Option<TurnRecord> {
    turns::load(&c.bus, turn)
        .await
        .ok()
        .flatten()
        .map(|v| v.record)
}

/// Ask for a kill until a coordinator took it, or the turn ended anyway (bounded).
async fn kill_when_asked(c: &Cluster, turn: &TurnId) {
    let deadline = Instant::now() + Duration::from_secs(240);
    let req = turnpike_core::wire::OpsRequest::turn("nemesis", turn.clone());
    while Instant::now() < deadline {
        let asked = tokio::time::timeout(
            Duration::from_secs(5),
            c.bus.client.request(
                subjects::OPS_KILL.to_owned(),
                bytes::Bytes::from(req.to_json()),
            ),
        )
        .await;
        if let Ok(Ok(reply)) = asked {
            let reply: Option<turnpike_core::wire::OpsReply> =
                serde_json::from_slice(&reply.payload).ok();
            if reply.is_some_and(|r| r.ok) {
                return;
            }
        }
        if load(c, turn).await.is_some_and(|r| r.state.is_terminal()) {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// One chat of the workload: send, wait a little, send again, until `until`; never more than
/// `CHAT_BACKLOG` of its turns unended at once.
async fn chat(
    c: Arc<Cluster>,
    chat: String,
    seed: u64,
    until: Instant,
    sent: Arc<Mutex<Vec<Sent>>>,
    kills: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut mine: Vec<TurnId> = Vec::new();
    let mut index = 0;
    while Instant::now() < until {
        let mut open = 0;
        for t in &mine {
            if !load(&c, t).await.is_some_and(|r| r.state.is_terminal()) {
                open += 1;
            }
        }
        if open >= CHAT_BACKLOG {
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let (script, text) = draw_script(&mut rng);
        let id = format!("{chat}-m{index}");
        let attachments = if script == Script::Attachment {
            vec![turnpike_core::wire::Attachment {
                name: "blob.bin".into(),
                // A chat may list only its own uploads (`<chat>/...`).
                object: format!("{chat}/blob.bin"),
            }]
        } else {
            vec![]
        };
        let chat_id = turnpike_core::ChatId::new(&chat).expect("chat id");
        let msg = turnpike_core::wire::InboundMessage {
            attachments,
            ..turnpike_core::wire::InboundMessage::new(chat_id, &id, &text, Some("nemesis".into()))
        };
        // Acknowledged or not at all: a node may be down; the same id each time.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut acked = false;
        while Instant::now() < deadline {
            if turnpike_jetstream::publish_inbound(&c.bus.js, c.bus.codec, &msg)
                .await
                .is_ok()
            {
                acked = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(acked, "inbound {id} not acknowledged within 60 s");
        let turn = msg.turn();
        sent.lock().expect("sent").push(Sent {
            chat: chat.clone(),
            index,
            turn: turn.clone(),
            script,
        });
        if script == Script::HangThenKill {
            let c = c.clone();
            let after = Duration::from_secs_f64(rng.random_range(1.0..6.0));
            let turn = turn.clone();
            kills.lock().expect("kills").push(tokio::spawn(async move {
                tokio::time::sleep(after).await;
                kill_when_asked(&c, &turn).await;
            }));
        }
        mine.push(turn);
        index += 1;
        tokio::time::sleep(Duration::from_secs_f64(rng.random_range(0.2..3.0))).await;
    }
}

/// Strike one fault and undo it; returns when it is undone.
async fn strike(c: &Cluster, f: &Fault) {
    let t = f.target.as_str();
    match f.kind {
        Kind::Kill => c.kill(t).await,
        Kind::Pause => c.pause(t).await,
        Kind::Partition => c.disconnect(t).await,
        Kind::Stop => c.stop(t, Duration::from_secs(10)).await,
    }
    tokio::time::sleep(f.hold).await;
    match f.kind {
        Kind::Kill | Kind::Stop => c.start_container(t).await,
        Kind::Pause => c.unpause(t).await,
        Kind::Partition => c.connect(t).await,
    }
}

/// The agent containers of this cluster's runners, from the engine's start and die events,
/// heard live from before the first turn (the engine keeps only its last few hundred events for
/// a later `since` query) until `done`.
fn watch_agents(
    c: &Cluster,
    done: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<Vec<AgentLife>> {
    use futures::StreamExt;
    let docker = c.docker.clone();
    let prefix = format!("tpf{}-", c.id);
    tokio::spawn(async move {
        let label = turnpike_runner::backend::LABEL_RUNNER;
        let filters: HashMap<&str, Vec<&str>> = HashMap::from([
            ("type", vec!["container"]),
            ("event", vec!["start", "die"]),
            ("label", vec![label]),
        ]);
        let options = bollard::query_parameters::EventsOptionsBuilder::default()
            .filters(&filters)
            .build();
        let mut lives: HashMap<String, AgentLife> = HashMap::new();
        let mut events = docker.events(Some(options));
        loop {
            let e = tokio::select! {
                _ = done.cancelled() => break,
                e = events.next() => e,
            };
            let Some(e) = e else {
                panic!("the engine's event stream ended");
            };
            let e = e.expect("the engine's events");
            let Some(actor) = e.actor else { continue };
            let attrs = actor.attributes.unwrap_or_default();
            if !attrs.get(label).is_some_and(|r| r.starts_with(&prefix)) {
                continue;
            }
            let id = actor.id.unwrap_or_default();
            let at = e.time_nano.unwrap_or_default() / 1_000_000;
            match e.action.as_deref() {
                Some("start") => {
                    let turn = attrs
                        .get(turnpike_runner::backend::LABEL_TURN)
                        .cloned()
                        .unwrap_or_default();
                    let attempt = attrs
                        .get(turnpike_runner::backend::LABEL_ATTEMPT)
                        .and_then(|a| a.parse().ok())
                        .unwrap_or(0);
                    lives.insert(
                        id,
                        AgentLife {
                            turn,
                            attempt,
                            started: at,
                            died: None,
                        },
                    );
                }
                Some("die") => {
                    if let Some(l) = lives.get_mut(&id) {
                        l.died = Some(at);
                    }
                }
                _ => {}
            }
        }
        lives.into_values().collect()
    })
}

// Not in `tests/run.sh` yet: its first runs found two agents of one turn alive together
// (issue 34). Run it with `--run-ignored only` (docs/contributing.md).
#[tokio::test]
#[ignore = "minutes long; run on its own (docs/contributing.md)"]
async fn nemesis() {
    init_logs();
    let secs = env_u64("TURNPIKE_NEMESIS_SECS").unwrap_or(300);
    let seed = env_u64("TURNPIKE_NEMESIS_SEED").unwrap_or(CI_SEED);
    let chats = env_u64("TURNPIKE_NEMESIS_CHATS").unwrap_or(CHATS);
    let length = Duration::from_secs(secs);
    let opts = ClusterOpts::default();
    let shape = schedule::Shape {
        nats: 3,
        coordinators: opts.coordinators,
        runners: opts.runners,
        lease: opts.lease,
        retry_delay: opts.retry_delay,
    };
    let plan = schedule::plan(seed, length, &shape);
    eprintln!(
        "nemesis: seed {seed}, {secs} s, {} faults:\n{}",
        plan.len(),
        plan.iter()
            .map(|f| f.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    );
    let c = Arc::new(Cluster::start(opts.clone()).await);
    for k in 0..chats {
        let mut blob: &[u8] = &vec![0x5a; 256 << 10];
        turnpike_store::attachments::put(
            &c.bus,
            format!("nm{seed}-{k}/blob.bin").as_str(),
            &mut blob,
        )
        .await
        .expect("upload a chat's attachment");
    }

    let agents_done = tokio_util::sync::CancellationToken::new();
    let agents = watch_agents(&c, agents_done.clone());
    let began = SystemTime::now();
    let start = Instant::now();
    let until = start + length;
    let sent = Arc::new(Mutex::new(Vec::new()));
    let kills = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for k in 0..chats {
        tasks.push(tokio::spawn(chat(
            c.clone(),
            format!("nm{seed}-{k}"),
            seed.wrapping_mul(1_000_003).wrapping_add(k),
            until,
            sent.clone(),
            kills.clone(),
        )));
    }
    // The plan lets a fault start on a target the instant the last one there ends (seed 13459:
    // a pause at 12.3 s on a runner whose last pause ended at 12.3 s, struck before the unpause
    // went through); a restart can also take longer than planned. Faults on one target, and on
    // the NATS nodes together, wait for the one before to be undone.
    let mut busy: HashMap<String, Arc<tokio::sync::Mutex<()>>> = HashMap::new();
    let mut strikes = Vec::new();
    for f in plan.clone() {
        let c = c.clone();
        let group = if f.target.starts_with("nats-") {
            "nats".to_owned()
        } else {
            f.target.clone()
        };
        let busy = busy.entry(group).or_default().clone();
        strikes.push(tokio::spawn(async move {
            tokio::time::sleep_until((start + f.at).into()).await;
            let _undone_before = busy.lock().await;
            strike(&c, &f).await;
        }));
    }
    for t in strikes.into_iter().chain(tasks) {
        t.await.expect("a nemesis task");
    }
    let healed = start.elapsed();
    let pending: Vec<_> = std::mem::take(&mut *kills.lock().expect("kills"));
    for k in pending {
        k.await.expect("a kill task");
    }
    let sent: Vec<Sent> = std::mem::take(&mut *sent.lock().expect("sent"));
    let ids: Vec<TurnId> = sent.iter().map(|s| s.turn.clone()).collect();

    // Liveness: once healed, every turn ends within a bound.
    let settle = Duration::from_secs(240);
    let records = wait_all_ended(&c.bus, &ids, settle).await;
    let mut listed = Vec::new();
    for t in &ids {
        if matches!(turnpike_store::live::is_listed(&c.bus, t).await, Ok(true)) {
            listed.push(t.clone());
        }
    }
    let history = History {
        records: ids
            .iter()
            .zip(records)
            .filter_map(|(t, r)| r.map(|r| (t.clone(), r)))
            .collect(),
        sent,
        listed,
        output: turnpike_tests::outbound(&c.bus.js, subjects::CHAT_OUT_ALL).await,
        agents: {
            agents_done.cancel();
            agents.await.expect("the agents' watch")
        },
    };
    let violations = check::check(&history);

    let mut by_kind: HashMap<String, usize> = HashMap::new();
    for f in &plan {
        let k = match f.pause {
            Some(p) => format!("pause {p:?}"),
            None => format!("{:?}", f.kind).to_lowercase(),
        };
        *by_kind.entry(k).or_default() += 1;
    }
    let mut kinds: Vec<_> = by_kind.into_iter().collect();
    kinds.sort();
    let kinds = kinds
        .iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    let mut states: HashMap<String, usize> = HashMap::new();
    for r in history.records.values() {
        *states.entry(r.state.to_string()).or_default() += 1;
    }
    let mut states: Vec<_> = states.into_iter().collect();
    states.sort();
    let retried = history
        .records
        .values()
        .filter(|r| r.attempts.len() > 1)
        .count();
    let tally = Tally {
        case: format!("nemesis, seed {seed}"),
        turns: history.sent.len(),
        lost: violations
            .iter()
            .filter(|v| v.what.starts_with("never") || v.what.starts_with("still live"))
            .count(),
        duplicated: 0,
        wrong: violations.len(),
        problems: Vec::new(),
        note: format!(
            "{secs} s of faults ({kinds}); healed at {:.0} s; ends {states:?}; {retried} retried; {} agents",
            healed.as_secs_f64(),
            history.agents.len()
        ),
    };
    if !violations.is_empty() {
        let t0 = unix_ms(began);
        for v in &violations {
            let around = history
                .records
                .get(&v.turn)
                .map(|r| r.created_at.millis() as i64 - t0)
                .unwrap_or(0);
            let near: Vec<String> = plan
                .iter()
                .filter(|f| {
                    let (a, b) = (f.at.as_millis() as i64, f.until().as_millis() as i64);
                    a <= around + 60_000 && b >= around - 10_000
                })
                .map(|f| format!("    {f}"))
                .collect();
            let rel = |ms: i64| format!("{:.1} s", (ms - t0) as f64 / 1000.0);
            let attempts: Vec<String> = history
                .records
                .get(&v.turn)
                .map(|r| {
                    r.attempts
                        .iter()
                        .map(|a| {
                            format!(
                                "    attempt {} on {:?}: due {:?}, published {:?}, started {:?}, exit {:?} (code {:?}, signal {:?}, error {:?}), {} landed",
                                a.n,
                                a.runner.as_ref().map(|r| r.to_string()),
                                a.due_at.map(|t| rel(t.millis() as i64)),
                                a.published_at.map(|t| rel(t.millis() as i64)),
                                a.started_at.map(|t| rel(t.millis() as i64)),
                                a.exit.as_ref().map(|x| x.class),
                                a.exit.as_ref().and_then(|x| x.exit_code),
                                a.exit.as_ref().and_then(|x| x.signal),
                                a.exit
                                    .as_ref()
                                    .and_then(|x| x.error.as_deref())
                                    .map(|e| e.chars().take(300).collect::<String>()),
                                a.messages_landed
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let lives: Vec<String> = history
                .agents
                .iter()
                .filter(|l| l.turn == v.turn.as_str())
                .map(|l| {
                    format!(
                        "    agent of attempt {}: started {}, died {}",
                        l.attempt,
                        rel(l.started),
                        l.died.map(rel).unwrap_or_else(|| "never".into())
                    )
                })
                .collect();
            eprintln!(
                "VIOLATION (seed {seed}) {v}\n  turn created at {:.1} s\n{}\n{}\n  faults around it:\n{}",
                around as f64 / 1000.0,
                attempts.join("\n"),
                lives.join("\n"),
                near.join("\n")
            );
        }
    }
    Tally {
        problems: violations.iter().map(|v| v.to_string()).collect(),
        ..tally
    }
    .report();
}
