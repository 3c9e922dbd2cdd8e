//! Errored chats (with clear) and one chat's page: its history and turns.

use super::*;

pub fn errored(ctx: &Ctx, chats: &Paged<ErroredChat>, base: &str, flash_: Markup) -> Page {
    let body = html! {
        h1 { "Errored chats" }
        (flash_)
        @if chats.items.is_empty() { p.empty { "No chat is flagged." } }
        @else {
            table #errored {
                thead { tr { th { "chat" } th { "turn" } th { "when" } th { "reason" } th { "cleared last" } th {} } }
                tbody {
                    @for c in &chats.items {
                        @let e = &c.error;
                        tr data-chat=(c.chat.as_str()) {
                            td { (chat_link(&c.chat)) }
                            td { (turn_link(&e.turn)) }
                            td { (time(e.at, ctx.now)) }
                            td { (e.reason) }
                            td { @if let Some(a) = &c.cleared_last { (a.by) " " (time(a.at, ctx.now)) } @else { "—" } }
                            td { (action(ctx, &format!("/chats/{}/clear", c.chat), "Clear", &format!("Clear the errored flag of chat {}?", c.chat))) }
                        }
                    }
                }
            }
            (pager(chats, base))
        }
    };
    Page {
        title: "Errored chats".into(),
        watch: "chats",
        keys: Vec::new(),
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
        keys: Vec::new(),
        body,
    }
}
