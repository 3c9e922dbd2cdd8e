//! HTTP: routes, the login, the checks every request passes (session; on POST also origin and
//! CSRF token), security headers, and the actions as ops requests.

use axum::extract::{Request, State as AxState};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use futures::StreamExt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use turnpike_config::Config;
use turnpike_jetstream::now;
use turnpike_store::Bus;

use crate::auth::{LoginLimiter, Session, SESSION_COOKIE};
use crate::changes::Change;
use crate::html::{self, Ctx, Filter, Page};
use crate::Access;

/// Rows per list page.
pub const PAGE_SIZE: usize = 50;

pub struct State {
    pub bus: Bus,
    pub config: Config,
    access: Access,
    /// The operators as the users file says now (read again when it changes).
    users: std::sync::Mutex<UsersFile>,
    /// Sessions ended by a logout, by nonce, with when they would have expired anyway.
    revoked: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    limiter: LoginLimiter,
    changes: OnceLock<broadcast::Sender<Change>>,
    shutdown: OnceLock<CancellationToken>,
    pub metrics: Arc<crate::metrics::ClusterMetrics>,
}

/// The users file and when it was last looked at.
struct UsersFile {
    users: crate::Users,
    modified: Option<std::time::SystemTime>,
    checked: Option<std::time::Instant>,
}

/// How often the users file is looked at for a change, at most.
const USERS_FILE_CHECK: Duration = Duration::from_secs(1);

impl State {
    pub fn new(bus: Bus, config: Config, access: Access) -> Self {
        let modified = config
            .dashboard_users_file
            .as_ref()
            .and_then(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
        State {
            users: std::sync::Mutex::new(UsersFile {
                users: access.users.clone(),
                modified,
                checked: None,
            }),
            bus,
            config,
            access,
            revoked: std::sync::Mutex::default(),
            limiter: LoginLimiter::default(),
            changes: OnceLock::new(),
            shutdown: OnceLock::new(),
            metrics: Arc::new(crate::metrics::ClusterMetrics::new()),
        }
    }

    /// The operators now: the users file is read again when it has changed (looked at no more
    /// than once a second), so a removed operator's sessions end at once. A file that cannot be
    /// read or parsed keeps the operators as they were, and says so.
    pub fn users(&self) -> crate::Users {
        let mut f = self.users.lock().unwrap_or_else(|p| p.into_inner());
        let due = f.checked.is_none_or(|c| c.elapsed() >= USERS_FILE_CHECK);
        if let (true, Some(path)) = (due, &self.config.dashboard_users_file) {
            f.checked = Some(std::time::Instant::now());
            let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
            if modified != f.modified {
                match crate::Users::load(path) {
                    Ok(users) => {
                        tracing::info!(operators = users.len(), "dashboard users file read again");
                        f.users = users;
                        f.modified = modified;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "users file changed but cannot be read; keeping the operators as they were")
                    }
                }
            }
        }
        f.users.clone()
    }

    /// Has `nonce`'s session been ended by a logout (here, or on any dashboard)?
    fn is_revoked(&self, nonce: &str) -> bool {
        self.revoked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(nonce)
    }

    /// Note a session ended (until it would have expired anyway); forget ended ones long past.
    pub(crate) fn note_revoked(&self, nonce: String, expires_ms: u64) {
        let now = now().millis();
        let mut r = self.revoked.lock().unwrap_or_else(|p| p.into_inner());
        r.retain(|_, exp| *exp > now);
        r.insert(nonce, expires_ms);
    }

    pub fn set_changes(&self, tx: broadcast::Sender<Change>, shutdown: CancellationToken) {
        let _ = self.changes.set(tx);
        let _ = self.shutdown.set(shutdown);
    }
}

pub(super) type Shared = Arc<State>;

use forms::{action, login, login_page, logout};
use views::{chat, errored, live, overview, runners, turn};

pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/", get(overview))
        .route("/errored", get(errored))
        .route("/live", get(live))
        .route("/runners", get(runners))
        .route("/turns/{id}", get(turn))
        .route("/chats/{id}", get(chat))
        .route("/{kind}/{id}/{verb}", post(action))
        .route("/events", get(events))
        .route("/login", get(login_page).post(login))
        .route("/logout", post(logout))
        .route("/healthz", get(healthz))
        .route(
            "/assets/app.js",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
                    html::APP_JS,
                )
            }),
        )
        .route(
            "/assets/style.css",
            get(|| async {
                (
                    [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
                    html::STYLE_CSS,
                )
            }),
        )
        .layer(middleware::from_fn(security_headers))
        .with_state(state)
}

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

async fn security_headers(mut req: Request, next: Next) -> Response {
    // HTTP/2 (over TLS) names the host in the URI, not a Host header: the origin check reads
    // the header, so give it one.
    if !req.headers().contains_key(header::HOST) {
        let authority = req.uri().authority().map(|a| a.as_str().to_owned());
        if let Some(v) = authority.and_then(|a| HeaderValue::from_str(&a).ok()) {
            req.headers_mut().insert(header::HOST, v);
        }
    }
    let mut res = next.run(req).await;
    let h = res.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    res
}

pub(super) fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

/// The operator a request's session cookie proves: signed by the key, not expired, not ended by
/// a logout, and its operator still in the users file with the same password.
pub(super) fn session(state: &State, headers: &HeaderMap) -> Option<Session> {
    let s = state
        .access
        .key
        .verify(cookie(headers, SESSION_COOKIE)?, now().millis())?;
    if state.is_revoked(&s.nonce) {
        return None;
    }
    (state.users().fingerprint(&s.user)? == s.fingerprint).then_some(s)
}

pub(super) fn is_fragment(headers: &HeaderMap) -> bool {
    headers.contains_key("x-turnpike-fragment")
}

/// Not logged in: pages go to the login (and come back), fragments and the event stream get 401.
pub(super) fn to_login(headers: &HeaderMap, path: &str) -> Response {
    if is_fragment(headers) || path == "/events" {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let next = if path.starts_with('/') && !path.starts_with("//") {
        path
    } else {
        "/"
    };
    Redirect::to(&format!("/login?next={}", urlencode(next))).into_response()
}

pub(super) fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A page, whole or (for the live re-draw) only its main part.
/// A page, drawn for this operator (`page` gets their CSRF token and the time).
pub(super) fn render(
    state: &State,
    s: &Session,
    headers: &HeaderMap,
    page: impl FnOnce(&Ctx) -> Page,
) -> Response {
    let csrf = state.access.key.csrf(s);
    let ctx = Ctx {
        user: &s.user,
        csrf: &csrf,
        now: now(),
    };
    let page = page(&ctx);
    if is_fragment(headers) {
        Html(page.body.into_string()).into_response()
    } else {
        Html(html::layout(&ctx, &page).into_string()).into_response()
    }
}

pub(super) fn not_found(state: &State, s: &Session, headers: &HeaderMap, what: &str) -> Response {
    let page = render(state, s, headers, |_| html::not_found(what));
    (StatusCode::NOT_FOUND, page).into_response()
}

pub(super) fn failed(e: impl std::fmt::Display) -> Response {
    tracing::warn!(error = %e, "dashboard read failed");
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("Turnpike cannot read NATS right now: {e}"),
    )
        .into_response()
}

macro_rules! logged_in {
    ($state:expr, $headers:expr, $path:expr) => {
        match session(&$state, &$headers) {
            Some(s) => s,
            None => return to_login(&$headers, $path),
        }
    };
}

mod forms;
pub(crate) mod sessions;
mod views;

pub(super) fn flash(f: &Filter) -> maud::Markup {
    html::flash(f.msg.as_deref(), f.ok.unwrap_or(false))
}

async fn events(AxState(state): AxState<Shared>, headers: HeaderMap) -> Response {
    let _s = logged_in!(state, headers, "/events");
    let (Some(tx), Some(shutdown)) = (state.changes.get(), state.shutdown.get()) else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let rx = tokio_stream_from(tx.subscribe());
    // Never empty data: a browser drops an event without any (the page would miss the
    // "re-draw, you may have missed something" after a reconnect).
    let event = |bucket: &'static str, key: &str| {
        Event::default()
            .event(bucket)
            .data(if key.is_empty() { bucket } else { key })
    };
    let hello = futures::stream::once(async move {
        Ok::<_, std::convert::Infallible>(event(crate::changes::HELLO, ""))
    });
    let changes = rx.map(move |c| Ok(event(c.bucket, &c.key)));
    let shutdown = shutdown.clone();
    let stream = hello
        .chain(changes)
        .take_until(async move { shutdown.cancelled().await });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// A broadcast receiver as a stream; a receiver that fell behind says "hello" (re-draw).
fn tokio_stream_from(rx: broadcast::Receiver<Change>) -> impl futures::Stream<Item = Change> {
    futures::stream::unfold(rx, |mut rx| async move {
        match rx.recv().await {
            Ok(c) => Some((c, rx)),
            Err(broadcast::error::RecvError::Lagged(_)) => Some((
                Change {
                    bucket: crate::changes::HELLO,
                    key: String::new(),
                },
                rx,
            )),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    })
}

/// 200 while connected to NATS, so a container health check sees a dashboard that cannot read.
async fn healthz(AxState(state): AxState<Shared>) -> Response {
    match state.bus.client.connection_state() {
        async_nats::connection::State::Connected => "ok".into_response(),
        other => (StatusCode::SERVICE_UNAVAILABLE, format!("NATS: {other:?}")).into_response(),
    }
}
