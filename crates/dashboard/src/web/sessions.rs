//! Sessions ended before their time. A logout puts the session's nonce in the
//! `turnpike_sessions` bucket, with a TTL until the session would have expired anyway; every
//! dashboard process watches the bucket and refuses those sessions from then on (the cookie
//! alone would still verify: sessions are signed, not stored).

use super::State;
use crate::auth::Session;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use turnpike_core::backoff::Backoff;
use turnpike_jetstream::now;

/// End `s` here at once, and (through the bucket) on every dashboard.
pub(crate) async fn revoke(state: &State, s: &Session) {
    state.note_revoked(s.nonce.clone(), s.expires_ms);
    let left = Duration::from_millis(s.expires_ms.saturating_sub(now().millis()));
    let put = turnpike_store::sessions::revoke(
        &state.bus,
        &s.nonce,
        s.expires_ms,
        left.max(Duration::from_secs(1)),
    )
    .await;
    if let Err(e) = put {
        tracing::warn!(error = %e, "a logout could not be shared with other dashboards; it holds on this one");
    }
}

/// Follow the bucket until `shutdown`: every ended session (those ended before this process
/// started too) is noted. Reopened, backing off, when the watch fails.
pub(crate) async fn follow(state: Arc<State>, shutdown: CancellationToken) {
    let reopen = || Backoff::doubling(Duration::from_millis(200), Duration::from_secs(5));
    let mut waits = reopen();
    while !shutdown.is_cancelled() {
        match turnpike_store::sessions::watch_revoked(&state.bus).await {
            Ok(mut entries) => {
                waits = reopen();
                loop {
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        e = entries.next() => match e {
                            Some(Ok(e)) => {
                                if let Some(expires) = turnpike_store::sessions::expires_ms(&e) {
                                    state.note_revoked(e.key, expires);
                                }
                            }
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "dashboard lost its sessions watch; reopening");
                                break;
                            }
                            None => break,
                        }
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "dashboard cannot watch ended sessions; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(waits.wait()) => {}
        }
    }
}
