//! The pages, as HTML. `maud` escapes every interpolated value, so chat text can never become
//! markup. Pages are pure functions of what was read, so they are tested without a server.

use maud::{html, Markup, DOCTYPE};
use turnpike_core::record::TurnState;
use turnpike_core::wire::{ChatRecord, ErroredChat, LiveTurn, RunnerPresence};
use turnpike_core::{Timestamp, TurnId, TurnRecord};

use turnpike_core::wire::CountersSnapshot;
use turnpike_store::fence::TurnOutput;

mod chats;
mod overview;
mod turns;

pub use chats::{chat, errored, why_died, ChatProfile};
pub use overview::{overview, runners, Overview};
pub use turns::{live, turn};

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
    /// Of a watched bucket, the only keys the page shows (a bucket not named here: any key),
    /// so that a busy deployment's other chats do not make every page re-draw.
    pub keys: Vec<(&'static str, String)>,
    pub body: Markup,
}

pub fn layout(ctx: &Ctx, page: &Page) -> Markup {
    // {"bucket": ["key", ...]}, for the live view (app.js).
    let mut keys = serde_json::Map::new();
    for (bucket, key) in &page.keys {
        if let serde_json::Value::Array(list) = keys
            .entry(*bucket)
            .or_insert_with(|| serde_json::Value::Array(Vec::new()))
        {
            list.push(key.as_str().into());
        }
    }
    let keys = serde_json::Value::Object(keys).to_string();
    html! {
        (DOCTYPE)
        html lang="en" {
            (head(&page.title, true))
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
                main id="main" data-watch=(page.watch) data-keys=(keys) { (page.body) }
            }
        }
    }
}

/// Every page's `<head>`: the title, the style sheet, and the script of pages that re-draw.
fn head(title: &str, script: bool) -> Markup {
    html! {
        head {
            meta charset="utf-8";
            meta name="viewport" content="width=device-width, initial-scale=1";
            title { (title) " · Turnpike" }
            link rel="stylesheet" href="/assets/style.css";
            @if script { script src="/assets/app.js" defer {} }
        }
    }
}

pub fn login(error: Option<&str>, next: &str) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            (head("Log in", false))
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
            // Drawn once with the form: a second click sends the same request again.
            input type="hidden" name="request" value=(request_id());
            button type="submit" class=(format!("btn-{}", label.to_lowercase().replace(' ', "-"))) { (label) }
        }
    }
}

/// A fresh id for one drawn form (16 random bytes, hex).
fn request_id() -> String {
    let mut bytes = [0u8; 16];
    // Without randomness the form still works: the request is only not deduplicated.
    if getrandom::fill(&mut bytes).is_err() {
        return String::new();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn flash(msg: Option<&str>, ok: bool) -> Markup {
    html! { @if let Some(m) = msg { p class=(if ok { "flash ok" } else { "flash bad" }) role="status" { (m) } } }
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

pub fn not_found(what: &str) -> Page {
    Page {
        title: "Not found".into(),
        watch: "",
        keys: Vec::new(),
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
        let profile = ChatProfile {
            name: "<i>p</i>".into(),
            moved: true,
            defined: vec![("<i>q</i>".into(), 1 << 20)],
        };
        let page = chat(
            &ctx,
            "<b>x</b>",
            None,
            &[],
            &profile,
            None,
            flash(Some("<script>alert(1)</script>"), false),
        );
        let s = layout(&ctx, &page).into_string();
        assert!(!s.contains("<script>alert(1)"), "{s}");
        assert!(s.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(s.contains("Chat &lt;b&gt;x&lt;/b&gt;"));
    }
}
