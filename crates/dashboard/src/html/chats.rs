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

/// A chat's resource profile, and the profiles there are (name, memory limit in bytes).
pub struct ChatProfile {
    /// The profile it runs with.
    pub name: String,
    /// Moved there by an operator (else: the default).
    pub moved: bool,
    /// Every profile the dashboard's configuration defines, smallest memory first.
    pub defined: Vec<(String, u64)>,
}

/// Why a turn's attempts died, in a few words: "3 × out of memory at 64 MiB", each kind of end
/// counted (at the memory limit it had, for out-of-memory deaths); and, if every one ran out of
/// memory, the largest limit they had.
pub fn why_died(record: &TurnRecord) -> (String, Option<u64>) {
    use turnpike_core::wire::ExitClass;
    let mut kinds: Vec<(String, usize)> = Vec::new();
    let (mut oom, mut others, mut largest) = (0, 0, 0u64);
    for a in &record.attempts {
        let Some(exit) = &a.exit else { continue };
        let memory = exit
            .started
            .as_ref()
            .and_then(|s| s.profile.as_ref())
            .map(|p| p.memory_limit);
        let kind = match (exit.class, memory) {
            (ExitClass::OomKilled, Some(m)) => {
                oom += 1;
                largest = largest.max(m);
                format!("out of memory at {}", turnpike_config::ByteSize(m))
            }
            (ExitClass::OomKilled, None) => {
                others += 1;
                "out of memory".to_owned()
            }
            (class, _) => {
                others += 1;
                class.to_string().replace('_', " ")
            }
        };
        match kinds.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => kinds.push((kind, 1)),
        }
    }
    let text = kinds
        .iter()
        .map(|(k, n)| format!("{n} × {k}"))
        .collect::<Vec<_>>()
        .join(", ");
    (text, (oom > 0 && others == 0).then_some(largest))
}

/// Move the chat to another profile: a choice of every profile but its own.
fn profile_form(ctx: &Ctx, chat: &str, p: &ChatProfile) -> Markup {
    html! {
        form.action method="post" action=(format!("/chats/{chat}/profile")) data-confirm=(format!("Move chat {chat} to the chosen profile? Its next attempts run with it.")) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="request" value=(request_id());
            select name="profile" aria-label="profile" {
                @for (name, memory) in &p.defined {
                    @if *name != p.name { option value=(name) { (name) " (" (turnpike_config::ByteSize(*memory)) ")" } }
                }
            }
            button type="submit" class="btn-move" { "Move" }
        }
    }
}

/// The concept's remedy for a chat that ran out of memory, in one confirmed step: move it to a
/// profile with more memory than its attempts had, and run the turn again.
fn remedy_form(ctx: &Ctx, chat: &str, turn: &TurnId, to: &(String, u64)) -> Markup {
    let (name, memory) = (&to.0, turnpike_config::ByteSize(to.1));
    html! {
        form.action method="post" action=(format!("/chats/{chat}/remedy")) data-confirm=(format!("Move chat {chat} to profile {name} ({memory}) and run turn {turn} again?")) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            input type="hidden" name="request" value=(request_id());
            input type="hidden" name="profile" value=(name);
            input type="hidden" name="turn" value=(turn.as_str());
            button type="submit" class="btn-remedy" { "Move to " (name) " (" (memory) ") and re-run" }
        }
    }
}

pub fn chat(
    ctx: &Ctx,
    id: &str,
    c: Option<&ChatRecord>,
    recent: &[TurnRecord],
    profile: &ChatProfile,
    errored_turn: Option<&TurnRecord>,
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
                        @if let Some(r) = errored_turn {
                            @let (why, oom_at) = why_died(r);
                            @if !why.is_empty() { p.why { "Why: " (why) } }
                            @if let Some(to) = oom_at.and_then(|m| profile.defined.iter().find(|(_, mem)| *mem > m)) {
                                (remedy_form(ctx, id, &r.turn, to))
                            }
                        }
                    }
                }
                @if let Some(a) = c.cleared.last() { p.small { "Last cleared by " (a.by) " " (time(a.at, ctx.now)) } }
                dl.facts {
                    dt { "profile" } dd.profile { (profile.name) @if !profile.moved { " (the default)" } " " (profile_form(ctx, id, profile)) }
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
