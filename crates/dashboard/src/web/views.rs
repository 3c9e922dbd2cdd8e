//! The GET handlers: each reads what it shows, bounded, and renders it with [`crate::html`].

use super::{failed, flash, not_found, page_of, render, session, to_login, urlencode, Shared};
use crate::html::{self, Filter};
use crate::read;
use axum::extract::{Path, Query, State as AxState};
use axum::http::HeaderMap;
use axum::response::Response;
use turnpike_core::{ChatId, TurnId};
use turnpike_jetstream::now;
use turnpike_store::views;

pub(super) async fn overview(AxState(state): AxState<Shared>, headers: HeaderMap) -> Response {
    let s = logged_in!(state, headers, "/");
    match read::overview(&state.bus).await {
        Ok(o) => render(&state, &s, &headers, |ctx| html::overview(&o, ctx.now)),
        Err(e) => failed(e),
    }
}

fn within(f: &Filter, t: turnpike_core::Timestamp) -> bool {
    f.within_min
        .is_none_or(|m| now().millis().saturating_sub(t.millis()) <= m * 60_000)
}

fn query_base(path: &str, f: &Filter) -> String {
    let mut q = Vec::new();
    if let Some(c) = f.chat.as_deref().filter(|c| !c.is_empty()) {
        q.push(format!("chat={}", urlencode(c)));
    }
    if let Some(s) = f.state.as_deref().filter(|s| !s.is_empty()) {
        q.push(format!("state={}", urlencode(s)));
    }
    if let Some(m) = f.within_min {
        q.push(format!("within_min={m}"));
    }
    if q.is_empty() {
        path.to_owned()
    } else {
        format!("{path}?{}", q.join("&"))
    }
}

pub(super) async fn errored(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Query(f): Query<Filter>,
) -> Response {
    let s = logged_in!(state, headers, "/errored");
    let chats = match views::chats(&state.bus).await {
        Ok(c) => c,
        Err(e) => return failed(e),
    };
    let mut flagged: Vec<_> = chats
        .into_iter()
        .filter(|c| c.errored.as_ref().is_some_and(|e| within(&f, e.at)))
        .filter(|c| {
            f.chat
                .as_deref()
                .is_none_or(|x| x.is_empty() || c.chat.as_str() == x)
        })
        .collect();
    flagged.sort_by_key(|c| std::cmp::Reverse(c.errored.as_ref().map(|e| e.at)));
    render(&state, &s, &headers, |ctx| {
        html::errored(
            ctx,
            &page_of(flagged, f.page),
            &query_base("/errored", &f),
            flash(&f),
        )
    })
}

pub(super) async fn live(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Query(f): Query<Filter>,
) -> Response {
    let s = logged_in!(state, headers, "/live");
    let bus = &state.bus;
    // A chat filter reads only that chat's live and waiting turns.
    let ids = match f.chat.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => match ChatId::new(c) {
            Ok(chat) => match views::chat(bus, &chat).await {
                Ok(Some(rec)) => rec.live.into_iter().chain(rec.waiting).collect(),
                Ok(None) => Vec::new(),
                Err(e) => return failed(e),
            },
            Err(_) => Vec::new(),
        },
        None => match views::live_ids(bus).await {
            Ok(ids) => ids,
            Err(e) => return failed(e),
        },
    };
    let mut records = match views::records(bus, &ids).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    records.retain(|r| !r.state.is_terminal());
    records.retain(|r| {
        f.state
            .as_deref()
            .is_none_or(|st| st.is_empty() || r.state.as_str() == st)
    });
    records.retain(|r| within(&f, r.created_at));
    records.sort_by_key(|r| std::cmp::Reverse(r.created_at));
    render(&state, &s, &headers, |ctx| {
        html::live(
            ctx,
            &page_of(records, f.page),
            &query_base("/live", &f),
            &f,
            flash(&f),
        )
    })
}

pub(super) async fn runners(AxState(state): AxState<Shared>, headers: HeaderMap) -> Response {
    let s = logged_in!(state, headers, "/runners");
    let mut list = match views::runners(&state.bus).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    list.sort_by(|a, b| a.runner.as_str().cmp(b.runner.as_str()));
    let stale = 3 * state.config.heartbeat.as_millis() as u64;
    render(&state, &s, &headers, |ctx| html::runners(ctx, &list, stale))
}

pub(super) async fn turn(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(f): Query<Filter>,
) -> Response {
    let s = logged_in!(state, headers, &format!("/turns/{id}"));
    let Ok(turn) = TurnId::new(id.as_str()) else {
        return not_found(&state, &s, &headers, "No such turn.");
    };
    let record = match views::turn(&state.bus, &turn).await {
        Ok(Some(r)) => r,
        Ok(None) => return not_found(&state, &s, &headers, "No such turn."),
        Err(e) => return failed(e),
    };
    let reruns = match views::reruns(&state.bus, &turn, 20).await {
        Ok(r) => r,
        Err(e) => return failed(e),
    };
    let output = match read::output(&state.bus, &record).await {
        Ok(o) => o,
        Err(e) => return failed(e),
    };
    render(&state, &s, &headers, |ctx| {
        html::turn(ctx, &record, &reruns, &output, flash(&f))
    })
}

pub(super) async fn chat(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(f): Query<Filter>,
) -> Response {
    let s = logged_in!(state, headers, &format!("/chats/{id}"));
    let Ok(chat_id) = ChatId::new(id.as_str()) else {
        return not_found(&state, &s, &headers, "No such chat.");
    };
    let bus = &state.bus;
    let (record, recent) = match tokio::try_join!(views::chat(bus, &chat_id), async {
        let ids = views::recent_turn_ids(bus, &chat_id, 20).await?;
        views::records(bus, &ids).await
    }) {
        Ok(x) => x,
        Err(e) => return failed(e),
    };
    render(&state, &s, &headers, |ctx| {
        html::chat(ctx, chat_id.as_str(), record.as_ref(), &recent, flash(&f))
    })
}
