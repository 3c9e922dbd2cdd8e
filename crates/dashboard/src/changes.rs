//! One KV watch per shown bucket for the whole dashboard process, fanned out to every open page
//! (server-sent events). A watch that ends (NATS restarted, a leader moved) is opened again; the
//! pages then re-draw once, since changes may have been missed meanwhile.

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
    tx
}
