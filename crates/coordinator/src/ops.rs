//! Operator actions, served by every coordinator through the NATS service API (service
//! `turnpike-coordinator`, queue group `q`, so one coordinator answers each request):
//! `turnpike.ops.kill`, `turnpike.ops.clear`, `turnpike.ops.rerun`, `turnpike.ops.stats`.
//! Every action is recorded with who and when in the turn or chat record.

use crate::counters::Counters;
use async_nats::service::ServiceExt;
use bytes::Bytes;
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};
use turnpike_config::Config;
use turnpike_core::lifecycle::{self, Event, NewTurn, Unchanged};
use turnpike_core::subjects;
use turnpike_core::wire::{
    ErroredQuery, LiveQuery, OperatorAction, OpsReply, OpsRequest, OpsStats,
};
use turnpike_core::{TurnId, FORMAT_VERSION};
use turnpike_jetstream::{decode, now, BusError};
use turnpike_store::admission;
use turnpike_store::outbox;
use turnpike_store::turns::{self, Applied, ApplyError};
use turnpike_store::views::Watched;
use turnpike_store::Bus;

fn reply(
    ok: bool,
    message: impl Into<String>,
    turn: Option<&TurnId>,
    state: Option<String>,
) -> OpsReply {
    OpsReply {
        v: FORMAT_VERSION,
        ok,
        message: message.into(),
        turn: turn.cloned(),
        state,
    }
}

pub async fn serve(
    bus: Bus,
    config: Config,
    counters: Arc<Counters>,
    index: crate::follow::Shared,
    shutdown: CancellationToken,
) -> Result<(), BusError> {
    let c = counters.clone();
    let service = bus
        .client
        .service_builder()
        .description("Turnpike coordinator: operator actions and counters")
        // Lets `turnpike healthcheck coordinator` find this process's own instance.
        .metadata(std::collections::HashMap::from([(
            "host".to_owned(),
            turnpike_jetstream::host_name(),
        )]))
        .stats_handler(move |_endpoint, _stats| {
            serde_json::to_value(c.snapshot()).unwrap_or_default()
        })
        .start(subjects::OPS_SERVICE, env!("CARGO_PKG_VERSION"))
        .await
        .map_err(|e| BusError::kv("start the ops service", e))?;
    let mut endpoints = Vec::new();
    for subject in [
        subjects::OPS_KILL,
        subjects::OPS_CLEAR,
        subjects::OPS_PROFILE,
        subjects::OPS_WORKSPACE_RESET,
        subjects::OPS_RERUN,
        subjects::OPS_STATS,
        subjects::OPS_STATUS,
        subjects::OPS_LIVE,
        subjects::OPS_ERRORED,
    ] {
        let ep = service
            .endpoint_builder()
            .name(subject.rsplit('.').next().unwrap_or(subject))
            .add(subject)
            .await
            .map_err(|e| BusError::kv(format!("add endpoint {subject}"), e))?;
        endpoints.push((subject, ep));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (subject, mut ep) in endpoints {
        let (bus, config, counters, index, token) = (
            bus.clone(),
            config.clone(),
            counters.clone(),
            index.clone(),
            shutdown.clone(),
        );
        tasks.spawn(async move {
            loop {
                let req = tokio::select! {
                    _ = token.cancelled() => break,
                    r = ep.next() => match r { Some(r) => r, None => break },
                };
                // A view shows every write made before it was asked (a page re-drawn because
                // a bucket changed shows that change).
                let read = match subject {
                    subjects::OPS_STATS | subjects::OPS_LIVE => {
                        &[Watched::Live, Watched::Turns][..]
                    }
                    subjects::OPS_STATUS => &[Watched::Live, Watched::Turns, Watched::Chats][..],
                    subjects::OPS_ERRORED => &[Watched::Chats][..],
                    _ => &[][..],
                };
                if !read.is_empty() {
                    index.catch_up(&bus, read).await;
                }
                let body = match subject {
                    subjects::OPS_STATS => {
                        serde_json::to_vec(&stats(&bus, &counters, &index).await)
                    }
                    subjects::OPS_STATUS => match status(&bus, &index).await {
                        Ok(cluster) => serde_json::to_vec(&cluster),
                        Err(e) => Ok(error_body(&e.to_string())),
                    },
                    subjects::OPS_LIVE | subjects::OPS_ERRORED => {
                        Ok(page(subject, &index, &req.message))
                    }
                    _ => {
                        let answer = match decode::<OpsRequest>(
                            req.message.headers.as_ref(),
                            &req.message.payload,
                        ) {
                            Ok(r) => handle(&bus, &config, &counters, subject, r).await,
                            Err(e) => reply(
                                false,
                                format!(
                                    "bad request: {}",
                                    turnpike_core::sizes::quote(&e.to_string())
                                ),
                                None,
                                None,
                            ),
                        };
                        serde_json::to_vec(&answer)
                    }
                };
                let body = body.unwrap_or_else(|e| error_body(&e.to_string()));
                if let Err(e) = req.respond(Ok(Bytes::from(body))).await {
                    warn!(error = %e, "could not answer an operator request");
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let _ = service.stop().await;
    Ok(())
}

async fn handle(
    bus: &Bus,
    config: &Config,
    counters: &Counters,
    subject: &str,
    r: OpsRequest,
) -> OpsReply {
    if let Err(why) = r.check() {
        return reply(false, format!("bad request: {why}"), r.turn.as_ref(), None);
    }
    let action = OperatorAction {
        by: r.by.clone(),
        at: now(),
    };
    let result = match (subject, &r.turn, &r.chat) {
        (subjects::OPS_KILL, Some(turn), _) => kill(bus, counters, turn, action).await,
        (subjects::OPS_RERUN, Some(turn), _) => {
            rerun(bus, config, turn, action, r.id.as_deref()).await
        }
        (subjects::OPS_CLEAR, _, Some(chat)) => clear(bus, chat, action).await,
        (subjects::OPS_CLEAR, _, None) => Ok(reply(false, "clear needs a chat", None, None)),
        (subjects::OPS_PROFILE, _, Some(chat)) => {
            move_chat(bus, config, chat, r.profile.as_deref(), &action).await
        }
        (subjects::OPS_PROFILE, _, None) => {
            Ok(reply(false, "a profile move needs a chat", None, None))
        }
        (subjects::OPS_WORKSPACE_RESET, _, Some(chat)) => reset_workspace(bus, chat, &action).await,
        (subjects::OPS_WORKSPACE_RESET, _, None) => {
            Ok(reply(false, "a workspace reset needs a chat", None, None))
        }
        _ => Ok(reply(false, "this request needs a turn", None, None)),
    };
    result.unwrap_or_else(|e| match e {
        ApplyError::UnknownTurn(t) => reply(false, format!("no turn {t}"), Some(&t), None),
        e => reply(false, e.to_string(), r.turn.as_ref(), None),
    })
}

/// Forget `chat`'s workspace and delete its versions.
async fn reset_workspace(
    bus: &Bus,
    chat: &turnpike_core::ChatId,
    action: &OperatorAction,
) -> Result<OpsReply, ApplyError> {
    let removed = turnpike_store::workspaces::reset(bus, chat).await?;
    info!(chat_id = %chat, by = %action.by, versions = removed.len(), "chat workspace reset");
    Ok(reply(
        true,
        format!(
            "chat {chat}'s workspace reset ({} version(s) deleted): its next turn starts empty",
            removed.len()
        ),
        None,
        None,
    ))
}

/// Move `chat` to `profile` (none: back to the default): its attempts dispatched from now on
/// run with it, a retry already scheduled with the one it had.
async fn move_chat(
    bus: &Bus,
    config: &Config,
    chat: &turnpike_core::ChatId,
    profile: Option<&str>,
    action: &OperatorAction,
) -> Result<OpsReply, ApplyError> {
    let Some(resolved) = config.profile(profile) else {
        return Ok(reply(
            false,
            format!(
                "no profile {:?}; defined: {}",
                profile.unwrap_or_default(),
                config.profile_names().join(", ")
            ),
            None,
            None,
        ));
    };
    turnpike_store::profiles::set(bus, chat, profile).await?;
    info!(chat_id = %chat, by = %action.by, profile = %resolved.name, "chat moved to a profile");
    Ok(reply(
        true,
        format!(
            "chat {chat} runs with profile {} from its next attempt (memory {}, time limit {})",
            resolved.name,
            resolved.memory_limit,
            humantime::format_duration(resolved.run_timeout)
        ),
        None,
        None,
    ))
}

async fn kill(
    bus: &Bus,
    counters: &Counters,
    turn: &TurnId,
    action: OperatorAction,
) -> Result<OpsReply, ApplyError> {
    info!(turn_id = %turn, by = %action.by, "operator kill");
    let applied = turns::apply_event(bus, turn, &Event::KillRequested { action }).await?;
    let out = match &applied {
        Applied::Changed { current, effects } => {
            counters.effects(effects);
            let r = &current.record;
            let msg = if r.state.is_terminal() {
                "killed".to_owned()
            } else {
                format!("kill sent to the runner of attempt {}", r.attempt)
            };
            reply(true, msg, Some(turn), Some(r.state.to_string()))
        }
        Applied::Unchanged(Unchanged::AlreadyEnded { state }, _) => reply(
            false,
            format!("already ended ({state})"),
            Some(turn),
            Some(state.to_string()),
        ),
        Applied::Unchanged(_, current) => reply(
            true,
            "kill already requested",
            Some(turn),
            Some(current.record.state.to_string()),
        ),
    };
    outbox::run_owed(bus, applied).await?;
    Ok(out)
}

/// A re-run is a new turn linked by `rerun_of`, so every turn keeps exactly one terminal state.
/// The `n`-th re-run of a turn has a derived id; a request with an id (`request`) that made one
/// already is answered with that one again: a second click makes no second turn.
async fn rerun(
    bus: &Bus,
    config: &Config,
    turn: &TurnId,
    action: OperatorAction,
    request: Option<&str>,
) -> Result<OpsReply, ApplyError> {
    let original = turns::load(bus, turn)
        .await?
        .ok_or_else(|| ApplyError::UnknownTurn(turn.clone()))?
        .record;
    if !original.state.is_terminal() {
        return Ok(reply(
            false,
            format!(
                "turn is still {}; kill it first or wait for it to end",
                original.state
            ),
            Some(turn),
            Some(original.state.to_string()),
        ));
    }
    for n in 1..=1000 {
        let id = TurnId::for_rerun(turn, n);
        let (mut record, _) = lifecycle::create(
            NewTurn {
                turn: id.clone(),
                message: original.message.clone(),
                history: original.history.clone(),
                max_turn_retry: config.max_turn_retry,
                retry_delay: config.retry_delay,
                rerun_of: Some(turn.clone()),
                created_by: Some(action.clone()),
                admit_now: false,
            },
            now(),
        );
        record.rerun_request = request.map(str::to_owned);
        // Takes its place in the chat's order like any new message.
        let (existing, created) = admission::create_in_chat(bus, record, None, None).await?;
        if !created {
            if request.is_some() && existing.record.rerun_request.as_deref() == request {
                return Ok(reply(
                    true,
                    format!("re-run as turn {id} (this request made it already)"),
                    Some(&id),
                    Some(existing.record.state.to_string()),
                ));
            }
            continue;
        }
        info!(turn_id = %turn, rerun = %id, by = %action.by, "operator re-run");
        return Ok(reply(
            true,
            format!("re-run as turn {id}"),
            Some(&id),
            Some("queued".into()),
        ));
    }
    Ok(reply(
        false,
        "too many re-runs of this turn",
        Some(turn),
        None,
    ))
}

async fn clear(
    bus: &Bus,
    chat: &turnpike_core::ChatId,
    action: OperatorAction,
) -> Result<OpsReply, ApplyError> {
    let cleared = turnpike_store::chats::update(bus, chat, |c| {
        let cleared = turnpike_core::chat::clear_errored(c, action.clone());
        (cleared, cleared)
    })
    .await?;
    Ok(if cleared {
        info!(chat_id = %chat, by = %action.by, "errored flag cleared");
        reply(true, format!("chat {chat} cleared"), None, None)
    } else {
        reply(false, format!("chat {chat} is not flagged"), None, None)
    })
}

/// Most an answer's page holds, whatever is asked: an answer stays far below NATS's message
/// size.
const PAGE_LIMIT: usize = 500;

/// A page of the live turns or the errored chats from the read model; an answer saying why not
/// (a bad query, or the model not built yet: the asker reads the buckets instead).
fn page(subject: &str, index: &crate::follow::Shared, msg: &async_nats::Message) -> Vec<u8> {
    let headers = msg.headers.as_ref();
    let answer = match subject {
        subjects::OPS_LIVE => decode::<LiveQuery>(headers, &msg.payload).map(|mut q| {
            q.limit = q.limit.min(PAGE_LIMIT);
            index.live_page(&q).map(|p| serde_json::to_vec(&p))
        }),
        _ => decode::<ErroredQuery>(headers, &msg.payload).map(|mut q| {
            q.limit = q.limit.min(PAGE_LIMIT);
            index.errored_page(&q).map(|p| serde_json::to_vec(&p))
        }),
    };
    match answer {
        Ok(Some(Ok(body))) => body,
        Ok(Some(Err(e))) => error_body(&e.to_string()),
        Ok(None) => error_body("this coordinator's read model is not built yet"),
        Err(e) => error_body(&format!(
            "bad query: {}",
            turnpike_core::sizes::quote(&e.to_string())
        )),
    }
}

/// An answer saying what went wrong (what a cluster view asked of the coordinators does not
/// decode as, so it is read from the buckets instead).
fn error_body(message: &str) -> Vec<u8> {
    serde_json::json!({ "ok": false, "message": message })
        .to_string()
        .into_bytes()
}

/// The cluster at a glance, from the read model this coordinator keeps (the runners and the
/// queue read now, one request each); read from the buckets until the model is built.
async fn status(
    bus: &Bus,
    index: &crate::follow::Shared,
) -> Result<turnpike_store::views::Cluster, BusError> {
    let at = now();
    match index.status() {
        Some(s) => turnpike_store::views::assemble(bus, at, s.live, s.errored.into_iter()).await,
        None => turnpike_store::views::read_cluster(bus, at).await,
    }
}

/// The counters, and the live turns by state: from the index kept by watches once it is built
/// (no read at all), read from the bucket before.
async fn stats(bus: &Bus, counters: &Counters, index: &crate::follow::Shared) -> OpsStats {
    let counted = match index.count_by_state() {
        Some(counted) => Ok(counted),
        None => turnpike_store::views::live_turns(bus)
            .await
            .map(|records| turnpike_store::views::count_by_state(&records)),
    };
    let live = match counted {
        Ok(counted) => counted
            .into_iter()
            .map(|(s, n)| (s.as_str().to_owned(), n))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "live turns not counted for ops stats");
            BTreeMap::new()
        }
    };
    OpsStats {
        v: FORMAT_VERSION,
        counters: counters.snapshot(),
        live,
    }
}
