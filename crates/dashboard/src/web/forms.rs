//! Every POST: the login, the logout and the actions, each checked (session, origin, CSRF).

use super::{session, urlencode, Shared, State};
use crate::auth::SESSION_COOKIE;
use crate::auth::{LoginRefused, Session};
use crate::html::{self};
use axum::extract::{ConnectInfo, Form, Path, Query, State as AxState};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{Html, IntoResponse, Redirect, Response};
use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;
use turnpike_core::wire::{OpsReply, OpsRequest};
use turnpike_core::{subjects, ChatId, TurnId};
use turnpike_jetstream::now;

#[derive(Deserialize)]
pub(super) struct ActionForm {
    #[serde(default)]
    csrf: String,
    /// The id drawn with the form: sent again (a second click, the browser's resubmission), it
    /// is the same request.
    #[serde(default)]
    request: Option<String>,
    /// A profile to move a chat to (`/chats/<id>/profile`, `/chats/<id>/remedy`).
    #[serde(default)]
    profile: Option<String>,
    /// The turn to run again after the move (`/chats/<id>/remedy`).
    #[serde(default)]
    turn: Option<String>,
}

/// The request came from one of our own pages: its `Origin` (or, without one, `Referer`) names
/// this host.
fn same_origin(headers: &HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let source = headers
        .get(header::ORIGIN)
        .or_else(|| headers.get(header::REFERER))
        .and_then(|h| h.to_str().ok());
    let Some(source) = source else { return false };
    let Some((scheme, rest)) = source.split_once("://") else {
        return false;
    };
    let authority = rest.split('/').next().unwrap_or("");
    matches!(scheme, "http" | "https") && authority == host
}

/// Checks of every POST but the login: session, origin, CSRF token. `Err` is the refusal.
fn check_post(
    state: &State,
    headers: &HeaderMap,
    form: &ActionForm,
) -> Result<Session, (StatusCode, &'static str)> {
    let Some(s) = session(state, headers) else {
        return Err((StatusCode::UNAUTHORIZED, "log in first"));
    };
    if !same_origin(headers) {
        tracing::warn!(user = %s.user, "dashboard refused a POST from another origin");
        return Err((
            StatusCode::FORBIDDEN,
            "refused: the request did not come from this dashboard",
        ));
    }
    if !state.access.key.csrf_ok(&s, &form.csrf) {
        tracing::warn!(user = %s.user, "dashboard refused a POST without a valid CSRF token");
        return Err((
            StatusCode::FORBIDDEN,
            "refused: missing or wrong CSRF token",
        ));
    }
    Ok(s)
}

/// An action through the coordinators' ops service, as the operator; back to `back` with the
/// coordinator's answer.
pub(super) async fn ops(state: &State, subject: &str, req: OpsRequest, back: &str) -> Response {
    let (ok, msg) = ask(state, subject, &req).await;
    ops_answer(&req.by, subject, ok, &msg, back)
}

/// Ask the coordinators' ops service: whether it was done, and what it said.
async fn ask(state: &State, subject: &str, req: &OpsRequest) -> (bool, String) {
    let answer = tokio::time::timeout(
        Duration::from_secs(15),
        state
            .bus
            .client
            .request(subject.to_owned(), req.to_json().into()),
    )
    .await;
    match answer {
        Ok(Ok(m)) => match serde_json::from_slice::<OpsReply>(&m.payload) {
            Ok(r) => (r.ok, r.message),
            Err(e) => (
                false,
                format!("the coordinator's answer is not an ops reply: {e}"),
            ),
        },
        Ok(Err(e)) => (false, format!("no coordinator answered: {e}")),
        Err(_) => (false, "no coordinator answered within 15 s".to_owned()),
    }
}

/// Back to `back` with the coordinators' answer, logged.
fn ops_answer(by: &str, subject: &str, ok: bool, msg: &str, back: &str) -> Response {
    tracing::info!(by = %turnpike_core::sizes::quote(by), subject, ok, answer = %turnpike_core::sizes::quote(msg), "dashboard action");
    let sep = if back.contains('?') { '&' } else { '?' };
    Redirect::to(&format!("{back}{sep}ok={ok}&msg={}", urlencode(msg))).into_response()
}

fn back_to(headers: &HeaderMap, fallback: &str) -> String {
    // Back to the page the button was on (same origin, path only), else `fallback`.
    headers
        .get(header::REFERER)
        .and_then(|r| r.to_str().ok())
        .and_then(|r| r.split_once("://").map(|(_, rest)| rest))
        .and_then(|rest| rest.find('/').map(|i| &rest[i..]))
        .map(|p| p.split('?').next().unwrap_or(p).to_owned())
        .filter(|p| p.starts_with('/') && !p.starts_with("//"))
        .unwrap_or_else(|| fallback.to_owned())
}

/// What an action's URL names.
enum Target {
    Turn(TurnId),
    Chat(ChatId),
}

/// Every action: the POST checks, the target from the path, the ops request as the operator,
/// back to the page it came from.
async fn act(
    state: &State,
    headers: &HeaderMap,
    form: &ActionForm,
    subject: &str,
    target: Option<Target>,
) -> Response {
    let s = match check_post(state, headers, form) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let (mut req, fallback) = match target {
        Some(Target::Turn(t)) => {
            let back = format!("/turns/{t}");
            (OpsRequest::turn(s.user, t), back)
        }
        Some(Target::Chat(c)) => (OpsRequest::chat(s.user, c), "/errored".to_owned()),
        None => return StatusCode::NOT_FOUND.into_response(),
    };
    req.id = form.request.clone().filter(|r| !r.is_empty());
    let back = back_to(headers, &fallback);
    ops(state, subject, req, &back).await
}

/// `POST /turns/<id>/kill`, `/turns/<id>/rerun`, `/chats/<id>/clear`.
pub(super) async fn action(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path((kind, id, verb)): Path<(String, String, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    let turn = || TurnId::new(id.as_str()).ok().map(Target::Turn);
    let (subject, target) = match (kind.as_str(), verb.as_str()) {
        ("turns", "kill") => (subjects::OPS_KILL, turn()),
        ("turns", "rerun") => (subjects::OPS_RERUN, turn()),
        ("chats", "clear") => (
            subjects::OPS_CLEAR,
            ChatId::new(id.as_str()).ok().map(Target::Chat),
        ),
        ("chats", "profile" | "remedy") => {
            let Ok(chat) = ChatId::new(id.as_str()) else {
                return StatusCode::NOT_FOUND.into_response();
            };
            return move_chat(&state, &headers, &form, chat, verb == "remedy").await;
        }
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    act(&state, &headers, &form, subject, target).await
}

/// `POST /chats/<id>/profile`: move the chat to `profile`; `/chats/<id>/remedy`: that, then run
/// `turn` again (the concept's remedy for running out of memory, in one confirmed step).
async fn move_chat(
    state: &State,
    headers: &HeaderMap,
    form: &ActionForm,
    chat: ChatId,
    rerun: bool,
) -> Response {
    let s = match check_post(state, headers, form) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    let back = format!("/chats/{chat}");
    let profile = form.profile.clone().filter(|p| !p.is_empty());
    let mut req = OpsRequest::profile(s.user.clone(), chat, profile);
    req.id = form.request.clone().filter(|r| !r.is_empty());
    if !rerun {
        return ops(state, subjects::OPS_PROFILE, req, &back).await;
    }
    let Some(turn) = form.turn.as_deref().and_then(|t| TurnId::new(t).ok()) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let (moved, said) = ask(state, subjects::OPS_PROFILE, &req).await;
    if !moved {
        return ops_answer(&s.user, subjects::OPS_PROFILE, false, &said, &back);
    }
    let mut again = OpsRequest::turn(s.user.clone(), turn);
    // Its own id, derived from the form's: the re-run is deduplicated as the move is.
    again.id = req.id.as_ref().map(|id| format!("{id}-rerun"));
    let (ok, rerun_said) = ask(state, subjects::OPS_RERUN, &again).await;
    ops_answer(
        &s.user,
        subjects::OPS_RERUN,
        ok,
        &format!("{said}; {rerun_said}"),
        &back,
    )
}

#[derive(Deserialize)]
pub(super) struct NextQuery {
    #[serde(default)]
    next: Option<String>,
}

/// Where to go after logging in: only a page this dashboard serves (its path, and a plain
/// query), else the overview. Anything else is refused, whatever a browser would make of it:
/// another host (`//evil`), a tab or newline browsers strip (`/\t/evil.com` becomes `//evil.com`),
/// a backslash.
fn safe_next(next: Option<&str>) -> String {
    next.filter(|n| is_page(n)).unwrap_or("/").to_owned()
}

/// Is `next` a page the router serves: `/`, `/errored`, `/live`, `/runners`, `/turns/<id>` or
/// `/chats/<id>` (ids as the wire allows them), with an optional query of plain characters?
pub(super) fn is_page(next: &str) -> bool {
    let (path, query) = next.split_once('?').unwrap_or((next, ""));
    let id = |s: &str| {
        !s.is_empty()
            && s.len() <= 128
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    };
    let page = match path.split('/').collect::<Vec<_>>().as_slice() {
        ["", ""] | ["", "errored" | "live" | "runners"] => true,
        ["", "turns" | "chats", x] => id(x),
        _ => false,
    };
    let plain_query = query
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"=&_-.%+".contains(&b));
    page && plain_query
}

pub(super) async fn login_page(Query(q): Query<NextQuery>) -> Response {
    Html(html::login(None, &safe_next(q.next.as_deref())).into_string()).into_response()
}

#[derive(Deserialize)]
pub(super) struct LoginForm {
    user: String,
    password: String,
    #[serde(default)]
    next: Option<String>,
}

pub(super) async fn login(
    AxState(state): AxState<Shared>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Form(form): Form<LoginForm>,
) -> Response {
    let next = safe_next(form.next.as_deref());
    // A login form posted from another site could log a victim in as the attacker.
    if !same_origin(&headers) {
        return (
            StatusCode::FORBIDDEN,
            "refused: the request did not come from this dashboard",
        )
            .into_response();
    }
    let t = now().millis();
    let forwarded = headers.get("x-forwarded-for").and_then(|v| v.to_str().ok());
    let client = state.access.proxies.client(peer.ip(), forwarded);
    let shown = turnpike_core::sizes::quote(&form.user);
    // Counted before the password is checked: logins at the same moment cannot all pass.
    let attempt = match state.limiter.begin(client, &form.user, t) {
        Ok(a) => a,
        Err(why) => {
            tracing::warn!(ip = %client, user = %shown, ?why, "dashboard login refused before its check");
            let msg = match why {
                LoginRefused::TooMany => "Too many failed logins; wait a minute.",
                LoginRefused::Busy => "Too many logins at once; try again in a moment.",
            };
            return (
                StatusCode::TOO_MANY_REQUESTS,
                Html(html::login(Some(msg), &next).into_string()),
            )
                .into_response();
        }
    };
    // The hash check takes tens of milliseconds of CPU: off the async workers.
    let users = state.users();
    let (user, password) = (form.user.clone(), form.password);
    let ok = tokio::task::spawn_blocking(move || users.verify(&user, &password))
        .await
        .unwrap_or(false);
    if !ok {
        drop(attempt);
        tracing::warn!(ip = %client, user = %shown, "dashboard login failed");
        return (
            StatusCode::UNAUTHORIZED,
            Html(html::login(Some("Wrong operator name or password."), &next).into_string()),
        )
            .into_response();
    }
    attempt.succeeded();
    let fingerprint = state.users().fingerprint(&form.user).unwrap_or_default();
    let cookie = match state
        .access
        .key
        .issue(&form.user, &fingerprint, t, state.access.session_ttl)
    {
        Ok(c) => c,
        Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    };
    tracing::info!(user = %form.user, "dashboard login");
    let secure =
        if state.config.dashboard_secure_cookie || state.config.dashboard_tls_cert.is_some() {
            "; Secure"
        } else {
            ""
        };
    let set = format!(
        "{SESSION_COOKIE}={cookie}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        state.access.session_ttl.as_secs()
    );
    let mut res = Redirect::to(&next).into_response();
    if let Ok(v) = HeaderValue::from_str(&set) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

pub(super) async fn logout(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Form(form): Form<ActionForm>,
) -> Response {
    let s = match check_post(&state, &headers, &form) {
        Ok(s) => s,
        Err(r) => return r.into_response(),
    };
    // Ended here and now, and on every dashboard once the bucket carries it.
    super::sessions::revoke(&state, &s).await;
    tracing::info!(user = %s.user, "dashboard logout");
    let mut res = Redirect::to("/login").into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("turnpike_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0"),
    );
    res
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::FromRequest;
    use proptest::prelude::*;

    /// A form body as axum decodes it for a handler.
    fn form<T: serde::de::DeserializeOwned>(body: Vec<u8>) -> Option<T> {
        let req = axum::http::Request::builder()
            .method("POST")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(axum::body::Body::from(body))
            .ok()?;
        let rt = tokio::runtime::Builder::new_current_thread().build().ok()?;
        rt.block_on(Form::<T>::from_request(req, &()))
            .ok()
            .map(|f| f.0)
    }

    proptest! {
        /// Issue 33: whatever a browser (or anyone) sends, every form, query string, cookie and
        /// `next` the dashboard reads decodes to a value or a refusal: never a panic.
        #[test]
        fn any_form_query_cookie_or_next_is_refused_or_read(
            body in prop::collection::vec(
                prop_oneof![Just(b'&'), Just(b'='), Just(b'%'), Just(b'+'), any::<u8>()],
                0..300,
            ),
            text in ".{0,200}",
        ) {
            let _ = form::<LoginForm>(body.clone());
            let _ = form::<ActionForm>(body.clone());
            let query = String::from_utf8_lossy(&body).into_owned();
            if let Ok(uri) = format!("/live?{query}").parse::<axum::http::Uri>() {
                let _ = Query::<crate::html::Filter>::try_from_uri(&uri);
                let _ = Query::<NextQuery>::try_from_uri(&uri);
            }
            let next = safe_next(Some(&text));
            prop_assert!(is_page(&next), "{next:?}");
            prop_assert!(!next.contains("//") && next.starts_with('/'));
            let key = crate::auth::SessionKey::new([1; 32]);
            prop_assert!(key.verify(&text, 0).is_none(), "an unsigned cookie verified");
            let _ = crate::auth::Users::parse(&text);
            let _ = crate::auth::TrustedProxies::parse(&text);
        }
    }

    #[test]
    fn only_the_routers_pages_are_pages() {
        for page in [
            "/",
            "/live",
            "/errored",
            "/runners",
            "/turns/t-abc",
            "/chats/room-1",
            "/live?page=2&chat=x",
        ] {
            assert!(is_page(page), "{page}");
        }
        for not in [
            "",
            "//evil.com",
            "/\t/evil.com",
            "/\\evil.com",
            "https://evil.com",
            "/turns/",
            "/turns/a/b",
            "/live?x=<script>",
            "/nowhere",
            "/turns/a.b",
        ] {
            assert!(!is_page(not), "{not:?}");
        }
    }
}
