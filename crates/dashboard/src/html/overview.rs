//! The overview (last hour, live turns by state, capacity) and the runners page.

use super::*;

pub struct Overview {
    /// The coordinators' counters, summed, and how many answered.
    pub counters: CountersSnapshot,
    pub coordinators: usize,
    pub cluster: turnpike_store::views::Cluster,
}

pub fn overview(o: &Overview, now: Timestamp) -> Page {
    let c = &o.counters;
    let h = &c.last_hour;
    let cl = &o.cluster;
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
                    @for (s, n) in &cl.live { dt { (state(*s)) } dd { (n) } }
                    dt { "work queue" } dd #queue { (cl.queue_depth) }
                }
            }
            div.card { h2 { "Capacity" }
                dl {
                    dt { "runners" } dd { (cl.runners) }
                    dt { "slots in use" } dd { (cl.slots_in_use) " / " (cl.slots) }
                }
            }
            div.card { h2 { a href="/errored" { "Errored chats" } }
                p.big #errored-count { (cl.errored_chats) }
            }
        }
    };
    Page {
        title: "Overview".into(),
        watch: "turns live chats runners",
        keys: Vec::new(),
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
        keys: Vec::new(),
        body,
    }
}
