//! Pulling from a durable consumer until shutdown, the same way for every role.

use crate::BusError;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::Message;
use futures::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};
use turnpike_core::backoff::Backoff;

/// Open the durable consumer `name` of `stream`.
pub async fn durable(
    js: &async_nats::jetstream::Context,
    stream: &str,
    name: &str,
) -> Result<PullConsumer, BusError> {
    js.get_stream(stream)
        .await
        .map_err(|e| BusError::kv(format!("open stream {stream}"), e))?
        .get_consumer(name)
        .await
        .map_err(|e| BusError::kv(format!("open consumer {stream}/{name}"), e))
}

/// `durable` for long-running roles: the topology's consumers are made after its buckets, so a
/// role that found the buckets may still be early (a cluster starting beside its `turnpike
/// setup`). Wait, as `Bus::connect_patiently` does, rather than exit; `None` once `shutdown`.
pub async fn durable_patiently(
    js: &async_nats::jetstream::Context,
    stream: &str,
    name: &str,
    shutdown: &CancellationToken,
) -> Option<PullConsumer> {
    let mut waits = Backoff::doubling(Duration::from_millis(250), Duration::from_secs(5));
    loop {
        match durable(js, stream, name).await {
            Ok(consumer) => return Some(consumer),
            Err(e) => {
                let wait = waits.wait();
                warn!(error = %e, retry_in = ?wait, "consumer not ready");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

/// Hand every message to `on_message` (awaited in turn: it may spawn) until `shutdown`.
/// A server restart shows up as stream errors (missed heartbeats) before the stream resumes, and
/// a broken pull is re-opened, so neither ends the loop.
pub async fn each_message<F, Fut>(
    consumer: &PullConsumer,
    batch: usize,
    shutdown: &CancellationToken,
    mut on_message: F,
) where
    F: FnMut(Message) -> Fut,
    Fut: Future<Output = ()>,
{
    'outer: while !shutdown.is_cancelled() {
        let messages = consumer
            .stream()
            .max_messages_per_batch(batch)
            .heartbeat(Duration::from_secs(5))
            .messages()
            .await;
        let mut messages = match messages {
            Ok(m) => m,
            Err(e) => {
                warn!(error = %e, "cannot pull; retrying");
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => break 'outer,
                m = messages.next() => m,
            };
            match next {
                None => break,
                Some(Err(e)) => debug!(error = %e, "pull hiccup"),
                Some(Ok(msg)) => on_message(msg).await,
            }
        }
    }
}

/// Hand messages to `on_message` with a slot each, never more than `slots` allows at once, until
/// `shutdown`: each fetch asks for exactly as many messages as there are free slots, so work
/// this node cannot start stays in the stream for other nodes. `on_message` owns the permit and
/// frees the slot by dropping it (it may spawn). A message beyond the free slots (a redelivery
/// in the same batch) is handed back at once.
pub async fn each_with_slot<F>(
    consumer: &PullConsumer,
    slots: Arc<Semaphore>,
    shutdown: &CancellationToken,
    mut on_message: F,
) where
    F: FnMut(Message, OwnedSemaphorePermit),
{
    'pull: loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break 'pull,
            p = slots.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break 'pull },
        };
        // This slot plus any others free now.
        let free = 1 + slots.available_permits();
        let batch = consumer
            .fetch()
            .max_messages(free)
            .expires(Duration::from_secs(5))
            .messages()
            .await;
        let mut batch = match batch {
            Ok(b) => b,
            Err(e) => {
                warn!(error = %e, "fetching failed; retrying");
                drop(permit);
                tokio::select! {
                    _ = shutdown.cancelled() => break 'pull,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        let mut permit = Some(permit);
        loop {
            let next = tokio::select! {
                _ = shutdown.cancelled() => None,
                m = batch.next() => m,
            };
            let Some(item) = next else { break };
            let msg = match item {
                Ok(m) => m,
                Err(e) => {
                    warn!(error = %e, "fetch error");
                    continue;
                }
            };
            let p = match permit.take() {
                Some(p) => p,
                None => match slots.clone().try_acquire_owned() {
                    Ok(p) => p,
                    Err(_) => {
                        let _ = msg
                            .ack_with(async_nats::jetstream::AckKind::Nak(None))
                            .await;
                        continue;
                    }
                },
            };
            on_message(msg, p);
        }
        if shutdown.is_cancelled() {
            break 'pull;
        }
    }
}
