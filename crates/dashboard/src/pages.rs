//! The pages, as HTML. `maud` escapes every interpolated value, so chat text can never become
//! markup. Pages are pure functions of what was read, so they are tested without a server.

use maud::{html, Markup, DOCTYPE};
use turnpike_core::lifecycle::{AttemptRecord, TurnState};
use turnpike_core::wire::{ChatRecord, RunnerPresence};
use turnpike_core::{Timestamp, TurnId, TurnRecord};

use crate::read::Counters;

/// What every page is drawn with: the operator, their CSRF token and the time of the read.
pub struct Ctx<'a> {
    pub user: &'a str,
    pub csrf: &'a str,
    pub now: Timestamp,
}

/// A page: its title, the buckets whose changes re-draw it, and its body.
pub struct Page {
    pub title: String,
    pub watch: &'static str,
    pub body: Markup,
}

pub fn layout(ctx: &Ctx, page: &Page) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (page.title) " · Turnpike" }
                link rel="stylesheet" href="/assets/style.css";
                script src="/assets/app.js" defer {}
            }
            body {
                header {
                    a.brand href="/" { "Turnpike" }
                    nav {
                        a href="/" { "Overview" }
                        a href="/errored" { "Errored" }
                        a href="/live" { "Live" }
                        a href="/runners" { "Runners" }
                    }
                    form.logout method="post" action="/logout" {
                        input type="hidden" name="csrf" value=(ctx.csrf);
                        span.who { (ctx.user) }
                        button type="submit" { "Log out" }
                    }
                }
                main id="main" data-watch=(page.watch) { (page.body) }
            }
        }
    }
}

pub fn login(error: Option<&str>, next: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "Log in · Turnpike" }
                link rel="stylesheet" href="/assets/style.css";
            }
            body.login {
                form method="post" action="/login" {
                    h1 { "Turnpike" }
                    @if let Some(e) = error { p.error role="alert" { (e) } }
                    input type="hidden" name="next" value=(next);
                    label { "Operator" input name="user" autocomplete="username" required autofocus; }
                    label { "Password" input name="password" type="password" autocomplete="current-password" required; }
                    button type="submit" { "Log in" }
                }
            }
        }
    }
}

/// `3s ago` / `in 7s`, with the absolute time on hover; the page's script keeps it current.
pub fn time(t: Timestamp, now: Timestamp) -> Markup {
    let abs = t.to_string();
    html! { time datetime=(abs) title=(abs) data-at=(t.millis()) { (relative(t, now)) } }
}

pub fn relative(t: Timestamp, now: Timestamp) -> String {
    let (ms, future) = if t.millis() > now.millis() {
        (t.millis() - now.millis(), true)
    } else {
        (now.millis() - t.millis(), false)
    };
    let s = ms / 1000;
    let amount = if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m", s / 60)
    } else if s < 86_400 {
        format!("{}h", s / 3600)
    } else {
        format!("{}d", s / 86_400)
    };
    if future {
        format!("in {amount}")
    } else {
        format!("{amount} ago")
    }
}

pub fn duration(ms: u64) -> String {
    let s = ms / 1000;
    if s < 60 {
        format!("{s}s")
    } else if s < 3600 {
        format!("{}m {}s", s / 60, s % 60)
    } else {
        format!("{}h {}m", s / 3600, (s % 3600) / 60)
    }
}

fn state(s: TurnState) -> Markup {
    html! { span class=(format!("state state-{}", s.as_str())) { (s.as_str()) } }
}

fn turn_link(t: &TurnId) -> Markup {
    html! { a.mono href=(format!("/turns/{t}")) { (t.as_str()) } }
}

fn chat_link(c: &turnpike_core::ChatId) -> Markup {
    html! { a href=(format!("/chats/{c}")) { (c.as_str()) } }
}

/// A POST button behind a confirm dialog (the page's script asks before it submits).
fn action(ctx: &Ctx, url: &str, label: &str, confirm: &str) -> Markup {
    html! {
        form.action method="post" action=(url) data-confirm=(confirm) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            button type="submit" class=(format!("btn-{}", label.to_lowercase().replace(' ', "-"))) { (label) }
        }
    }
}

pub fn flash(msg: Option<&str>, ok: bool) -> Markup {
    html! { @if let Some(m) = msg { p class=(if ok { "flash ok" } else { "flash bad" }) role="status" { (m) } } }
}

pub struct Overview {
    pub counters: Counters,
    pub coordinators: usize,
    pub live: Vec<(TurnState, u64)>,
    pub queue_depth: u64,
    pub runners: usize,
    pub slots: u32,
    pub slots_in_use: u32,
    pub errored_chats: usize,
}

pub fn overview(o: &Overview, now: Timestamp) -> Page {
    let c = &o.counters;
    let h = &c.last_hour;
    // A coordinator younger than an hour has counted only since it started: say so.
    let young = c.window_start_ms > now.millis().saturating_sub(3_600_000) + 60_000;
    let body = html! {
        h1 { "Overview" }
        section.cards {
            div.card { h2 { "Turns ended, last hour" }
                p.small {
                    (o.coordinators) " coordinator(s) answering"
                    @if young { "; counted since " (time(Timestamp::from_millis(c.window_start_ms), now)) }
                }
                dl {
                    dt { "done" } dd #done { (h.turns_done) }
                    dt { "failed" } dd #failed { (h.turns_failed) }
                    dt { "gave up" } dd #gave-up { (h.turns_gave_up) }
                    dt { "killed" } dd #killed { (h.turns_killed) }
                    dt { "silent" } dd #silent { (h.silent_turns) }
                }
            }
            div.card { h2 { "Retries, last hour" }
                dl {
                    dt { "scheduled" } dd #retries { (h.retries_scheduled) }
                    dt { "runner-lost deaths" } dd #runner-lost { (h.runner_lost) }
                    dt { "dead letters (since start)" } dd { (c.dead_lettered) }
                }
            }
            div.card { h2 { "Live turns" }
                dl {
                    @for (s, n) in &o.live { dt { (state(*s)) } dd { (n) } }
                    dt { "work queue" } dd #queue { (o.queue_depth) }
                }
            }
            div.card { h2 { "Capacity" }
                dl {
                    dt { "runners" } dd { (o.runners) }
                    dt { "slots in use" } dd { (o.slots_in_use) " / " (o.slots) }
                }
            }
            div.card { h2 { a href="/errored" { "Errored chats" } }
                p.big #errored-count { (o.errored_chats) }
            }
        }
    };
    Page {
        title: "Overview".into(),
        watch: "turns live chats runners",
        body,
    }
}

pub struct Paged<T> {
    pub items: Vec<T>,
    pub page: usize,
    pub pages: usize,
    pub total: usize,
}

fn pager<T>(p: &Paged<T>, base: &str) -> Markup {
    let sep = if base.contains('?') { '&' } else { '?' };
    html! {
        @if p.pages > 1 {
            nav.pager {
                @if p.page > 1 { a href=(format!("{base}{sep}page={}", p.page - 1)) { "← newer" } }
                span { "page " (p.page) " of " (p.pages) " (" (p.total) ")" }
                @if p.page < p.pages { a href=(format!("{base}{sep}page={}", p.page + 1)) { "older →" } }
            }
        }
    }
}

pub fn errored(ctx: &Ctx, chats: &Paged<ChatRecord>, base: &str, flash_: Markup) -> Page {
    let body = html! {
        h1 { "Errored chats" }
        (flash_)
        @if chats.items.is_empty() { p.empty { "No chat is flagged." } }
        @else {
            table #errored {
                thead { tr { th { "chat" } th { "turn" } th { "when" } th { "reason" } th { "cleared last" } th {} } }
                tbody {
                    @for c in &chats.items { @if let Some(e) = &c.errored {
                        tr data-chat=(c.chat.as_str()) {
                            td { (chat_link(&c.chat)) }
                            td { (turn_link(&e.turn)) }
                            td { (time(e.at, ctx.now)) }
                            td { (e.reason) }
                            td { @if let Some(a) = c.cleared.last() { (a.by) " " (time(a.at, ctx.now)) } @else { "—" } }
                            td { (action(ctx, &format!("/chats/{}/clear", c.chat), "Clear", &format!("Clear the errored flag of chat {}?", c.chat))) }
                        }
                    } }
                }
            }
            (pager(chats, base))
        }
    };
    Page {
        title: "Errored chats".into(),
        watch: "chats",
        body,
    }
}

fn current(r: &TurnRecord) -> Option<&AttemptRecord> {
    r.attempts.iter().rev().find(|a| a.n == r.attempt)
}

pub fn live(
    ctx: &Ctx,
    turns: &Paged<TurnRecord>,
    base: &str,
    filter: &Filter,
    flash_: Markup,
) -> Page {
    let body = html! {
        h1 { "Live turns" }
        (flash_)
        (filter_form(filter, "/live"))
        @if turns.items.is_empty() { p.empty { "No turn is live." } }
        @else {
            table #live {
                thead { tr { th { "turn" } th { "chat" } th { "state" } th { "attempt" } th { "runner" } th { "running for" } th { "next attempt" } th {} } }
                tbody {
                    @for r in &turns.items {
                        @let a = current(r);
                        tr data-turn=(r.turn.as_str()) data-state=(r.state.as_str()) {
                            td { (turn_link(&r.turn)) }
                            td { (chat_link(&r.chat)) }
                            td { (state(r.state)) }
                            td { (r.attempt) " of " (r.max_attempts) }
                            td.mono { @if let Some(x) = a.and_then(|a| a.runner.as_ref()) { (x.as_str()) } @else { "—" } }
                            td { @if let Some(s) = a.and_then(|a| a.started_at) { (duration(ctx.now.millis().saturating_sub(s.millis()))) } @else { "—" } }
                            td { @if let Some(due) = r.next_attempt_due { span.countdown data-due=(due.millis()) title=(due.to_string()) { (relative(due, ctx.now)) } } @else { "—" } }
                            td { (action(ctx, &format!("/turns/{}/kill", r.turn), "Kill", &format!("Kill turn {} of chat {}?", r.turn, r.chat))) }
                        }
                    }
                }
            }
            (pager(turns, base))
        }
    };
    Page {
        title: "Live turns".into(),
        watch: "turns live",
        body,
    }
}

/// List filters from the query string.
#[derive(Debug, Default, Clone, serde::Deserialize)]
#[serde(default)]
pub struct Filter {
    pub chat: Option<String>,
    pub state: Option<String>,
    /// Only items newer than this many minutes.
    pub within_min: Option<u64>,
    pub page: Option<usize>,
    pub msg: Option<String>,
    pub ok: Option<bool>,
}

fn filter_form(f: &Filter, action: &str) -> Markup {
    html! {
        form.filter method="get" action=(action) {
            input name="chat" placeholder="chat" value=(f.chat.clone().unwrap_or_default());
            select name="state" {
                option value="" { "any state" }
                @for s in ["waiting", "queued", "running", "pending_retry"] {
                    option value=(s) selected[f.state.as_deref() == Some(s)] { (s) }
                }
            }
            input name="within_min" type="number" min="1" placeholder="minutes" value=(f.within_min.map(|m| m.to_string()).unwrap_or_default());
            button type="submit" { "Filter" }
        }
    }
}

pub fn turn(ctx: &Ctx, r: &TurnRecord, reruns: &[TurnRecord], flash_: Markup) -> Page {
    let body = html! {
        h1 { "Turn " span.mono { (r.turn.as_str()) } " " (state(r.state)) }
        (flash_)
        dl.facts {
            dt { "chat" } dd { (chat_link(&r.chat)) }
            dt { "created" } dd { (time(r.created_at, ctx.now)) @if let Some(b) = &r.created_by { " by " (b.by) } }
            dt { "attempts" } dd { (r.attempt) " of " (r.max_attempts) " (MAX_TURN_RETRY=" (r.max_turn_retry) ")" }
            @if let Some(due) = r.next_attempt_due { dt { "next attempt" } dd { span.countdown data-due=(due.millis()) title=(due.to_string()) { (relative(due, ctx.now)) } } }
            @if let Some(o) = &r.outcome { dt { "outcome" } dd { (o.reason.as_str()) " " (time(o.at, ctx.now)) } }
            @if let Some(k) = &r.kill { dt { "killed by" } dd { (k.by) " " (time(k.at, ctx.now)) } }
            @if let Some(n) = &r.notice { dt { "notice" } dd.notice { (n.text) } }
            @if let Some(of) = &r.rerun_of { dt { "re-run of" } dd { (turn_link(of)) } }
            @if !reruns.is_empty() { dt { "re-runs" } dd { @for x in reruns { (turn_link(&x.turn)) " " (state(x.state)) " " } } }
        }
        div.actions {
            @if r.state.is_terminal() {
                (action(ctx, &format!("/turns/{}/rerun", r.turn), "Re-run", &format!("Run turn {} again as a new turn?", r.turn)))
            } @else {
                (action(ctx, &format!("/turns/{}/kill", r.turn), "Kill", &format!("Kill turn {} of chat {}?", r.turn, r.chat)))
            }
        }
        h2 { "Message" }
        pre.message #message { (r.message.text) }
        @if !r.message.attachments.is_empty() {
            ul { @for a in &r.message.attachments { li { (a.name) " (" span.mono { (a.object) } ")" } } }
        }
        h2 { "Attempts" }
        ol.timeline {
            @for a in &r.attempts {
                li {
                    strong { "attempt " (a.n) }
                    @if let Some(t) = a.due_at { " · due " (time(t, ctx.now)) }
                    @if let Some(t) = a.published_at { " · published " (time(t, ctx.now)) }
                    @if let Some(t) = a.started_at { " · started " (time(t, ctx.now)) }
                    @if let Some(x) = &a.runner { " on " span.mono { (x.as_str()) } }
                    @if let Some(e) = &a.exit {
                        " · ended " (time(e.ended_at, ctx.now)) " · "
                        span class=(format!("exit exit-{}", e.class)) { (e.class.as_str()) }
                        @if let Some(c) = e.exit_code { " code " (c) }
                        @if let Some(s) = e.signal { " signal " (s) }
                        @if let (Some(s), Some(st)) = (a.started_at, Some(e.ended_at)) { " · ran " (duration(st.millis().saturating_sub(s.millis()))) }
                        @if let Some(err) = &e.error { div.small { (err) } }
                    }
                    " · " (a.messages_landed) " message(s) landed"
                    @if let Some(p) = &a.preamble { details { summary { "preamble" } pre { (p) } } }
                }
            }
        }
    };
    Page {
        title: format!("Turn {}", r.turn),
        watch: "turns",
        body,
    }
}

pub fn runners(ctx: &Ctx, runners: &[RunnerPresence], stale_after_ms: u64) -> Page {
    let body = html! {
        h1 { "Runners" }
        @if runners.is_empty() { p.empty { "No runner is registered." } }
        @else {
            table #runners {
                thead { tr { th { "runner" } th { "host" } th { "backend" } th { "slots" } th { "version" } th { "last heartbeat" } } }
                tbody {
                    @for p in runners {
                        @let stale = ctx.now.millis().saturating_sub(p.at.millis()) > stale_after_ms;
                        tr class=(if stale { "stale" } else { "" }) {
                            td.mono { (p.runner.as_str()) @if stale { " " span.badge { "stale" } } }
                            td { (p.host) } td { (p.backend) }
                            td { (p.slots_in_use) " / " (p.slots) }
                            td { (p.version) } td { (time(p.at, ctx.now)) }
                        }
                    }
                }
            }
        }
    };
    Page {
        title: "Runners".into(),
        watch: "runners",
        body,
    }
}

pub fn chat(
    ctx: &Ctx,
    id: &str,
    c: Option<&ChatRecord>,
    recent: &[TurnRecord],
    flash_: Markup,
) -> Page {
    let body = html! {
        h1 { "Chat " (id) }
        (flash_)
        @match c {
            None => { p.empty { "No record of this chat." } }
            Some(c) => {
                @if let Some(e) = &c.errored {
                    div.errored {
                        "Errored: " (e.reason) " (turn " (turn_link(&e.turn)) ", " (time(e.at, ctx.now)) ")"
                        (action(ctx, &format!("/chats/{}/clear", c.chat), "Clear", &format!("Clear the errored flag of chat {}?", c.chat)))
                    }
                }
                @if let Some(a) = c.cleared.last() { p.small { "Last cleared by " (a.by) " " (time(a.at, ctx.now)) } }
                dl.facts {
                    dt { "live turn" } dd { @if let Some(t) = &c.live { (turn_link(t)) } @else { "—" } }
                    dt { "waiting" } dd { @if c.waiting.is_empty() { "—" } @for t in &c.waiting { (turn_link(t)) " " } }
                }
            }
        }
        h2 { "Recent turns" }
        @if recent.is_empty() { p.empty { "None." } }
        @else {
            table {
                thead { tr { th { "turn" } th { "message" } th { "state" } th { "attempts" } th { "updated" } } }
                tbody {
                    @for r in recent {
                        tr { td { (turn_link(&r.turn)) } td.clip { (r.message.text) } td { (state(r.state)) } td { (r.attempt) " of " (r.max_attempts) } td { (time(r.updated_at, ctx.now)) } }
                    }
                }
            }
        }
        @if let Some(c) = c {
            h2 { "History" }
            @if c.history_dropped > 0 { p.small { (c.history_dropped) " older entries left out" } }
            ol.history {
                @for h in &c.history { li class=(h.role.as_str()) { pre { (h.text) } } }
            }
        }
    };
    Page {
        title: format!("Chat {id}"),
        watch: "turns chats",
        body,
    }
}

pub fn not_found(what: &str) -> Page {
    Page {
        title: "Not found".into(),
        watch: "",
        body: html! { h1 { "Not found" } p { (what) } },
    }
}

/// The assets, embedded in the binary.
pub const APP_JS: &str = include_str!("../assets/app.js");
pub const STYLE_CSS: &str = include_str!("../assets/style.css");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_times_read_naturally() {
        let now = Timestamp::from_millis(10_000_000);
        assert_eq!(relative(Timestamp::from_millis(9_997_000), now), "3s ago");
        assert_eq!(relative(Timestamp::from_millis(10_007_000), now), "in 7s");
        assert_eq!(
            relative(Timestamp::from_millis(10_000_000 - 7_200_000), now),
            "2h ago"
        );
        assert_eq!(duration(65_000), "1m 5s");
    }

    #[test]
    fn chat_text_is_escaped() {
        let ctx = Ctx {
            user: "ops",
            csrf: "t",
            now: Timestamp::from_millis(0),
        };
        let page = chat(
            &ctx,
            "<b>x</b>",
            None,
            &[],
            flash(Some("<script>alert(1)</script>"), false),
        );
        let s = layout(&ctx, &page).into_string();
        assert!(!s.contains("<script>alert(1)"), "{s}");
        assert!(s.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(s.contains("Chat &lt;b&gt;x&lt;/b&gt;"));
    }
}
