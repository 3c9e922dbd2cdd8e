//! Pulling from a durable consumer until shutdown, the same way for every role.

use crate::BusError;
use async_nats::jetstream::consumer::PullConsumer;
use async_nats::jetstream::Message;
use futures::StreamExt;
use std::future::Future;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

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
