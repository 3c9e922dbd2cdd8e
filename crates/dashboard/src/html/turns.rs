//! Live turns (with kill) and one turn's page: its attempts, notice, kill and re-runs.

use super::*;

pub fn live(
    ctx: &Ctx,
    turns: &Paged<LiveTurn>,
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
                        tr data-turn=(r.turn.as_str()) data-state=(r.state.as_str()) {
                            td { (turn_link(&r.turn)) }
                            td { (chat_link(&r.chat)) }
                            td { (state(r.state)) }
                            td { (r.attempt) " of " (r.max_attempts) }
                            td.mono { @if let Some(x) = &r.runner { (x.as_str()) } @else { "—" } }
                            td { @if let Some(s) = r.started_at { (duration(ctx.now.millis().saturating_sub(s.millis()))) } @else { "—" } }
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
        keys: Vec::new(),
        body,
    }
}

pub fn turn(
    ctx: &Ctx,
    r: &TurnRecord,
    reruns: &[TurnRecord],
    output: &TurnOutput,
    flash_: Markup,
) -> Page {
    // An ended attempt's count is the record's (final); a running one's is what landed so far.
    let landed_so_far = |n: u32| output.messages.iter().filter(|m| m.attempt == n).count();
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
        h2 { "Replies" }
        div #replies {
            @if output.messages.is_empty() { p.empty { "No reply yet." } }
            @else {
                ol.replies {
                    @for m in &output.messages {
                        li data-attempt=(m.attempt) { span.small { "attempt " (m.attempt) } pre.message { (m.text) } }
                    }
                }
            }
            @if !output.complete { p.small { "More replies than one page shows; the chat's output has them all." } }
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
                        @if let Some(p) = e.started.as_ref().and_then(|s| s.profile.as_ref()) { " · profile " (p.name) " (" (turnpike_config::ByteSize(p.memory_limit)) ")" }
                        @if let (Some(s), Some(st)) = (a.started_at, Some(e.ended_at)) { " · ran " (duration(st.millis().saturating_sub(s.millis()))) }
                        @if let Some(err) = &e.error { div.small { (err) } }
                    }
                    @if a.exit.is_some() { " · " (a.messages_landed) " message(s) landed" }
                    @else if a.started_at.is_some() || a.runner.is_some() { " · " (landed_so_far(a.n)) " message(s) landed so far" }
                    @if let Some(p) = &a.preamble { details { summary { "preamble" } pre { (p) } } }
                }
            }
        }
    };
    Page {
        title: format!("Turn {}", r.turn),
        watch: "turns out",
        keys: vec![("out", r.chat.to_string())],
        body,
    }
}
