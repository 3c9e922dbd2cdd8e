//! The GET handlers: each reads what it shows, bounded, and renders it with [`crate::html`].

use super::{failed, flash, not_found, render, session, to_login, urlencode, Shared, PAGE_SIZE};
use crate::html::{self, Filter, Paged};
use crate::read;
use axum::extract::{Path, Query, State as AxState};
use axum::http::HeaderMap;
use axum::response::Response;
use turnpike_core::record::TurnState;
use turnpike_core::wire::{ErroredPage, ErroredQuery, LivePage, LiveQuery, LiveTurn};
use turnpike_core::{ChatId, TurnId, FORMAT_VERSION};
use turnpike_jetstream::now;
use turnpike_store::views;

pub(super) async fn overview(AxState(state): AxState<Shared>, headers: HeaderMap) -> Response {
    let s = logged_in!(state, headers, "/");
    match read::overview(&state.bus).await {
        Ok(o) => render(&state, &s, &headers, |ctx| html::overview(&o, ctx.now)),
        Err(e) => failed(e),
    }
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

/// Since when a list's `within_min` filter reaches back.
fn since(f: &Filter) -> Option<turnpike_core::Timestamp> {
    f.within_min
        .map(|m| turnpike_core::Timestamp::from_millis(now().millis().saturating_sub(m * 60_000)))
}

/// Where page `page` (from 1) of a list starts.
fn offset(page: Option<usize>) -> usize {
    page.unwrap_or(1).max(1).saturating_sub(1) * PAGE_SIZE
}

/// A page of a list paged by whoever read it (`page` clamped to the last by [`last_page`]).
fn paged<T>(items: Vec<T>, total: usize, page: Option<usize>) -> Paged<T> {
    Paged {
        items,
        page: page.unwrap_or(1).max(1),
        pages: total.div_ceil(PAGE_SIZE).max(1),
        total,
    }
}

/// A page past the last one shows the last one.
fn last_page(total: usize, page: Option<usize>) -> Option<usize> {
    let pages = total.div_ceil(PAGE_SIZE).max(1);
    Some(page.unwrap_or(1).clamp(1, pages))
}

pub(super) async fn errored(
    AxState(state): AxState<Shared>,
    headers: HeaderMap,
    Query(f): Query<Filter>,
) -> Response {
    let s = logged_in!(state, headers, "/errored");
    let bus = &state.bus;
    let query = |page| ErroredQuery {
        v: FORMAT_VERSION,
        since: since(&f),
        offset: offset(page),
        limit: PAGE_SIZE,
    };
    // A chat filter reads only that chat's record; the list, a page of the read model.
    let page = match f.chat.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => match ChatId::new(c) {
            Ok(chat) => views::chat_errored_page(bus, &chat, &query(f.page)).await,
            Err(_) => Ok(ErroredPage::of(std::iter::empty(), &query(f.page))),
        },
        None => match views::errored_page(bus, &query(f.page)).await {
            Ok(p) if p.chats.is_empty() && offset(f.page) >= p.total && p.total > 0 => {
                views::errored_page(bus, &query(last_page(p.total, f.page))).await
            }
            other => other,
        },
    };
    let page = match page {
        Ok(p) => p,
        Err(e) => return failed(e),
    };
    let at = last_page(page.total, f.page);
    render(&state, &s, &headers, |ctx| {
        html::errored(
            ctx,
            &paged(page.chats, page.total, at),
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
    let wanted = match f.state.as_deref().filter(|st| !st.is_empty()) {
        None => None,
        Some(st) => match st.parse::<TurnState>() {
            Ok(state) => Some(state),
            // No turn is in a state that does not exist.
            Err(_) => return render_live(&state, &s, &headers, &f, paged(Vec::new(), 0, None)),
        },
    };
    let query = |page| LiveQuery {
        v: FORMAT_VERSION,
        state: wanted,
        since: since(&f),
        offset: offset(page),
        limit: PAGE_SIZE,
    };
    // A chat filter reads only that chat's live and waiting turns; the list, a page of the
    // read model.
    let page = match f.chat.as_deref().filter(|c| !c.is_empty()) {
        Some(c) => match ChatId::new(c) {
            Ok(chat) => views::chat_live_page(bus, &chat, &query(f.page)).await,
            Err(_) => Ok(LivePage::of(std::iter::empty(), &query(f.page))),
        },
        None => match views::live_page(bus, &query(f.page)).await {
            Ok(p) if p.turns.is_empty() && offset(f.page) >= p.total && p.total > 0 => {
                views::live_page(bus, &query(last_page(p.total, f.page))).await
            }
            other => other,
        },
    };
    match page {
        Ok(p) => {
            let at = last_page(p.total, f.page);
            render_live(&state, &s, &headers, &f, paged(p.turns, p.total, at))
        }
        Err(e) => failed(e),
    }
}

fn render_live(
    state: &Shared,
    s: &super::Session,
    headers: &HeaderMap,
    f: &Filter,
    turns: Paged<LiveTurn>,
) -> Response {
    render(state, s, headers, |ctx| {
        html::live(ctx, &turns, &query_base("/live", f), f, flash(f))
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
    let (record, recent, moved) = match tokio::try_join!(
        views::chat(bus, &chat_id),
        async {
            let ids = views::recent_turn_ids(bus, &chat_id, 20).await?;
            views::records(bus, &ids).await
        },
        turnpike_store::profiles::of_chat(bus, &chat_id)
    ) {
        Ok(x) => x,
        Err(e) => return failed(e),
    };
    // Why the turn that flagged it died, and the remedy for running out of memory.
    let errored_turn = match record.as_ref().and_then(|c| c.errored.as_ref()) {
        Some(e) => match views::turn(bus, &e.turn).await {
            Ok(r) => r,
            Err(e) => return failed(e),
        },
        None => None,
    };
    let config = &state.config;
    let mut defined: Vec<(String, u64)> = config
        .profile_names()
        .into_iter()
        .filter_map(|n| config.profile(Some(&n)).map(|p| (n, p.memory_limit.0)))
        .collect();
    defined.sort_by(|a, b| a.1.cmp(&b.1).then_with(|| a.0.cmp(&b.0)));
    let profile = html::ChatProfile {
        name: moved.clone().unwrap_or(config.default_profile.clone()),
        moved: moved.is_some(),
        defined,
    };
    render(&state, &s, &headers, |ctx| {
        html::chat(
            ctx,
            chat_id.as_str(),
            record.as_ref(),
            &recent,
            &profile,
            errored_turn.as_ref(),
            flash(&f),
        )
    })
}
