//! One KV watch per shown bucket for the whole dashboard process, fanned out to every open page
//! (server-sent events). A watch that ends (NATS restarted, a leader moved) is opened again; the
//! pages then re-draw once, since changes may have been missed meanwhile.
//!
//! Chat output (`out`, keyed by chat) is heard on a plain subscription: a running turn's replies
//! change no record until its attempt ends, and a missed one is caught by the pages' own
//! periodic re-draw.

use futures::{Stream, StreamExt};
use std::future::Future;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use turnpike_core::backoff::Backoff;
use turnpike_core::subjects;
use turnpike_store::views::{self, Watched};
use turnpike_store::Bus;

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
    for (name, which) in [
        ("turns", Watched::Turns),
        ("live", Watched::Live),
        ("chats", Watched::Chats),
        ("runners", Watched::Runners),
    ] {
        let bus = bus.clone();
        let open = move || {
            let bus = bus.clone();
            async move {
                let watch = views::watch(&bus, which).await?;
                Ok::<_, turnpike_jetstream::BusError>(watch.map(move |e| {
                    e.map(|e| Change {
                        bucket: name,
                        key: e.key,
                    })
                    .map_err(|e| e.to_string())
                }))
            }
        };
        tokio::spawn(follow(name, tx.clone(), shutdown.clone(), open));
    }
    // Tell pages a chat's output grew (a reply landed, a status, a notice).
    let client = bus.client.clone();
    let open = move || {
        let client = client.clone();
        async move {
            let sub = client.subscribe(subjects::CHAT_OUT_ALL).await?;
            let prefix = subjects::CHAT_OUT_ALL.trim_end_matches('>');
            Ok::<_, async_nats::SubscribeError>(sub.map(move |m| {
                Ok(Change {
                    bucket: "out",
                    key: m
                        .subject
                        .strip_prefix(prefix)
                        .unwrap_or_default()
                        .to_owned(),
                })
            }))
        }
    };
    tokio::spawn(follow("out", tx.clone(), shutdown, open));
    tx
}

/// Forward the changes of the stream `open` makes until shutdown, opening it again (backing off
/// up to 5 s) when it fails or ends. Each opening first says [`HELLO`]: changes may have been
/// missed while it was closed.
async fn follow<S, E, F, Fut>(
    what: &'static str,
    tx: broadcast::Sender<Change>,
    shutdown: CancellationToken,
    mut open: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<S, E>>,
    S: Stream<Item = Result<Change, String>>,
    E: std::fmt::Display,
{
    let reopen = || Backoff::doubling(Duration::from_millis(200), Duration::from_secs(5));
    let mut waits = reopen();
    while !shutdown.is_cancelled() {
        match open().await {
            Ok(changes) => {
                waits = reopen();
                let _ = tx.send(Change {
                    bucket: HELLO,
                    key: String::new(),
                });
                let mut changes = std::pin::pin!(changes);
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        c = changes.next() => match c {
                            Some(Ok(c)) => { let _ = tx.send(c); }
                            Some(Err(e)) => { tracing::warn!(what, error = %e, "dashboard lost its watch; reopening"); break; }
                            None => break,
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(what, error = %e, "dashboard cannot watch; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(waits.wait()) => {}
        }
    }
}
