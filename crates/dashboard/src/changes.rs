//! One KV watch per shown bucket for the whole dashboard process, fanned out to every open page
//! (server-sent events). A watch that ends (NATS restarted, a leader moved) is opened again; the
//! pages then re-draw once, since changes may have been missed meanwhile.
//!
//! Chat output (`out`, keyed by chat) is heard on a plain subscription: a running turn's replies
//! change no record until its attempt ends, and a missed one is caught by the pages' own
//! periodic re-draw.

use futures::StreamExt;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use turnpike_core::subjects;
use turnpike_jetstream::Bus;

/// One change: the bucket's short name (what pages watch) and the key.
#[derive(Debug, Clone)]
pub struct Change {
    pub bucket: &'static str,
    pub key: String,
}

/// Short names, as pages list them in `data-watch`; `hello` means "re-draw, you may have missed
/// something".
pub const HELLO: &str = "hello";

pub fn spawn(bus: Bus, shutdown: CancellationToken) -> broadcast::Sender<Change> {
    let (tx, _) = broadcast::channel(1024);
    for (name, store) in [
        ("turns", bus.turns.clone()),
        ("live", bus.live.clone()),
        ("chats", bus.chats.clone()),
        ("runners", bus.runners.clone()),
    ] {
        let (tx, shutdown) = (tx.clone(), shutdown.clone());
        let bucket = match name {
            "turns" => subjects::BUCKET_TURNS,
            "live" => subjects::BUCKET_LIVE,
            "chats" => subjects::BUCKET_CHATS,
            _ => subjects::BUCKET_RUNNERS,
        };
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            while !shutdown.is_cancelled() {
                match store.watch_all().await {
                    Ok(mut watch) => {
                        backoff = Duration::from_millis(200);
                        let _ = tx.send(Change {
                            bucket: HELLO,
                            key: String::new(),
                        });
                        loop {
                            tokio::select! {
                                _ = shutdown.cancelled() => return,
                                e = watch.next() => match e {
                                    Some(Ok(e)) => { let _ = tx.send(Change { bucket: name, key: e.key }); }
                                    Some(Err(e)) => { tracing::warn!(bucket, error = %e, "dashboard watch failed; reopening"); break; }
                                    None => break,
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(bucket, error = %e, "dashboard cannot watch; retrying")
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        });
    }
    tokio::spawn(hear_output(bus, tx.clone(), shutdown));
    tx
}

/// Tell pages a chat's output grew (a reply landed, a status, a notice). The client subscribes
/// again by itself after a reconnect.
async fn hear_output(bus: Bus, tx: broadcast::Sender<Change>, shutdown: CancellationToken) {
    let mut backoff = Duration::from_millis(200);
    while !shutdown.is_cancelled() {
        match bus.client.subscribe(subjects::CHAT_OUT_ALL).await {
            Ok(mut sub) => loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    m = sub.next() => match m {
                        Some(m) => {
                            let chat = m.subject.strip_prefix(subjects::CHAT_OUT_ALL.trim_end_matches('>')).unwrap_or_default().to_owned();
                            let _ = tx.send(Change { bucket: "out", key: chat });
                        }
                        None => break,
                    }
                }
            },
            Err(e) => tracing::warn!(error = %e, "dashboard cannot hear chat output; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}
