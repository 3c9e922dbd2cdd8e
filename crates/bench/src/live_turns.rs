//! Measurement 8 (issue 36): what live turns cost while they wait. A coordinator and a runner run
//! as child processes of this binary beside the nats-server; the runner's 4 slots are held by
//! hanging agents, and `n` more turns are live: queued (one per chat, each with a work item in
//! the queue) or mostly waiting (ten per chat: one queued, nine waiting behind it). Then, with
//! nothing arriving: CPU per process over a minute, the cluster view's time (what `turnpike
//! status` and the dashboard's overview show), memory, and how long after the runner is killed
//! its four attempts are declared lost.

use crate::stack::*;
use anyhow::{Context, Result};
use futures::StreamExt;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use turnpike_core::record::TurnState;
use turnpike_core::wire::ExitClass;
use turnpike_core::{ChatId, TurnId};

/// How the live turns wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Shape {
    /// One turn per chat, queued for a runner.
    Queued,
    /// Ten turns per chat: one queued, nine waiting for it.
    Waiting,
}

impl Shape {
    fn per_chat(self) -> usize {
        match self {
            Shape::Queued => 1,
            Shape::Waiting => 10,
        }
    }
}

/// Idle for this long, once the coordinator has settled, before the minute measured.
const SETTLE: Duration = Duration::from_secs(5);
/// The coordinator has settled once it spends less than this of a core over [`QUIET`]: the
/// burst of new turns is behind it (each is looked at once, a pass after it changed).
const SETTLED_BELOW: f64 = 0.02;
/// How often whether the coordinator has settled is checked.
const QUIET: Duration = Duration::from_secs(5);
/// Settling that takes longer than this is reported as not settled.
const SETTLE_LIMIT: Duration = Duration::from_secs(600);
/// CPU is measured over this.
const WINDOW: Duration = Duration::from_secs(60);
/// The cluster view is read this many times.
const VIEWS: usize = 40;
/// Slots of the runner, each held by a hanging agent.
const SLOTS: usize = 4;

/// Measurement 8 for each of `sizes`, both shapes.
pub(crate) async fn live_turns(out: &mut String, sizes: &[usize], shapes: &[Shape]) -> Result<()> {
    writeln!(
        out,
        "\n### 8. Live turns at rest: idle cost, views and lost-runner detection\n"
    )?;
    writeln!(
        out,
        "| live turns | idle CPU s per minute: nats-server / coordinator / runner | `turnpike status` p50 / p95 | coordinator RSS (per live turn) | runner killed → its attempts lost: first / last | one listing of the work queue: time (server CPU) | planting → coordinator settled: time (its CPU per new turn) |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    let mut config = None;
    let mut pages = Vec::new();
    for &n in sizes {
        for &shape in shapes {
            let row = one(n, shape).await?;
            writeln!(out, "{}", row.line)?;
            config = Some(row.config);
            pages.push(row.pages);
        }
    }
    writeln!(
        out,
        "\nDashboard pages, p50 / p95 of {PAGES} requests each (after 10 warm-up), one at a time over \
loopback, with 1 chat in 100 flagged errored besides:\n"
    )?;
    writeln!(out, "| live turns | {} |", PAGE_NAMES.join(" | "))?;
    writeln!(out, "|---|{}", "---|".repeat(PAGE_NAMES.len()))?;
    for p in &pages {
        writeln!(out, "{p}")?;
    }
    if let Some((lease, heartbeat)) = config {
        writeln!(
            out,
            "\nRelease build; the coordinator and the runner are child processes of the bench (CPU from `/proc`, \
10 ms ticks); the runner has {SLOTS} slots, each held by a hanging agent; \"queued\": one turn per chat \
waiting for a runner; \"waiting\": ten per chat, one queued and nine behind it, planted by 32 writers \
(far faster than turns arrive through a dispatcher). The coordinator follows each new turn and looks at it \
once, a pass after it changed; once it spends under 2% of a core for 5 s it has settled, and {}s later CPU \
is measured over {}s of nothing arriving. The coordinator's RSS is divided by the live turns. A runner's death should \
be noticed within lease + heartbeat + 1 s = {:.0} s (lease {}, heartbeat {}).",
            SETTLE.as_secs(),
            WINDOW.as_secs(),
            (lease + heartbeat).as_secs_f64() + 1.0,
            humantime::format_duration(lease),
            humantime::format_duration(heartbeat),
        )?;
    }
    Ok(())
}

struct Row {
    line: String,
    /// The dashboard's page times, as a row of the pages' table.
    pages: String,
    config: (Duration, Duration),
}

/// Requests per dashboard page.
const PAGES: usize = 40;
/// The pages timed, in the table's order.
const PAGE_NAMES: [&str; 7] = [
    "overview `/`",
    "live `/live`",
    "live, last page",
    "errored `/errored`",
    "chat `/chats/<id>`",
    "turn `/turns/<id>`",
    "runners `/runners`",
];

/// One size and shape, on a pipeline of its own.
async fn one(n: usize, shape: Shape) -> Result<Row> {
    let stack = Stack::start_with(0, false, |c| c.runner_slots = SLOTS as u32).await?;
    let mut coordinator = spawn_coordinator(&stack)?;
    let mut runner = spawn_runner(&stack)?;
    let config = (stack.config.lease, stack.config.heartbeat);
    let measured = measure(&stack, n, shape, coordinator.id(), &mut runner).await;
    let _ = coordinator.kill();
    let _ = coordinator.wait();
    let _ = runner.kill();
    let _ = runner.wait();
    stack.stop().await;
    let m = measured?;
    let per_min = |d: Duration| d.as_secs_f64() * 60.0 / WINDOW.as_secs_f64();
    let line = format!(
        "| {n} {} | {:.2} / {:.2} / {:.2} | {} / {} | {:.0} MiB ({:.0} B) | {:.1} s / {:.1} s | {} ({}) | {:.0} s ({:.0} µs) |",
        match shape {
            Shape::Queued => "queued",
            Shape::Waiting => "waiting",
        },
        per_min(m.server_cpu),
        per_min(m.coordinator_cpu),
        per_min(m.runner_cpu),
        ms(m.view_p50),
        ms(m.view_p95),
        m.coordinator_rss_mib,
        m.coordinator_rss_mib * 1024.0 * 1024.0 / n.max(1) as f64,
        m.lost_first.as_secs_f64(),
        m.lost_last.as_secs_f64(),
        ms(m.listing.0),
        ms(m.listing.1),
        m.settled.0.as_secs_f64(),
        m.settled.1.as_secs_f64() * 1e6 / n.max(1) as f64,
    );
    eprintln!("{line}");
    let cells: Vec<String> = m
        .pages
        .iter()
        .map(|t| format!("{} / {}", ms(percentile(t, 0.5)), ms(percentile(t, 0.95))))
        .collect();
    let pages = format!(
        "| {n} {} | {} |",
        match shape {
            Shape::Queued => "queued",
            Shape::Waiting => "waiting",
        },
        cells.join(" | ")
    );
    eprintln!("{pages}");
    Ok(Row {
        line,
        pages,
        config,
    })
}

struct Measured {
    server_cpu: Duration,
    coordinator_cpu: Duration,
    runner_cpu: Duration,
    view_p50: Duration,
    view_p95: Duration,
    coordinator_rss_mib: f64,
    /// One listing of the work queue: its time, and the server's CPU for it.
    listing: (Duration, Duration),
    /// From the first turn planted until the coordinator settled, and its CPU meanwhile.
    settled: (Duration, Duration),
    lost_first: Duration,
    lost_last: Duration,
    /// Each of [`PAGE_NAMES`]'s times, sorted.
    pages: Vec<Vec<Duration>>,
}

async fn measure(
    stack: &Stack,
    n: usize,
    shape: Shape,
    coordinator: u32,
    runner: &mut std::process::Child,
) -> Result<Measured> {
    let bus = &stack.bus;
    // The runner's slots, held.
    let mut hung = Vec::new();
    for i in 0..SLOTS {
        let chat = ChatId::new(format!("hang-{i}"))?;
        hung.push(send(bus, &chat, &format!("hang-m{i}"), "hang").await?);
    }
    for turn in &hung {
        wait_state(bus, turn, TurnState::Running).await?;
    }
    let c = coordinator.to_string();
    let cpu = |pid: &str| crate::procstat::Cpu::of(pid).own;
    let (planted, planting_cpu) = (Instant::now(), cpu(&c));
    plant(bus, n, shape).await?;
    eprintln!("{n} {shape:?} turns planted in {:.1?}", planted.elapsed());
    // Until the coordinator has followed and looked at every new turn.
    loop {
        let before = cpu(&c);
        tokio::time::sleep(QUIET).await;
        let spent = cpu(&c).saturating_sub(before).as_secs_f64() / QUIET.as_secs_f64();
        if spent < SETTLED_BELOW || planted.elapsed() > SETTLE_LIMIT {
            break;
        }
    }
    let settled = (planted.elapsed(), cpu(&c).saturating_sub(planting_cpu));
    eprintln!(
        "settled {:.1?} after planting began, coordinator CPU {:.2?}",
        settled.0, settled.1
    );
    // What one round's listing of the work queue costs (the coordinator does one a round).
    let server = stack.server_pid();
    let (cpu0, t0) = (crate::procstat::Cpu::of(&server).own, Instant::now());
    let queued = turnpike_store::work::queued_turns(bus).await?.len();
    let listing = (
        t0.elapsed(),
        crate::procstat::Cpu::of(&server).own.saturating_sub(cpu0),
    );
    eprintln!(
        "work queue listed ({queued} turns) in {:.1?}, server CPU {:.2?}",
        listing.0, listing.1
    );
    tokio::time::sleep(SETTLE).await;

    let r = runner.id().to_string();
    let (s0, c0, r0) = (cpu(&server), cpu(&c), cpu(&r));
    tokio::time::sleep(WINDOW).await;
    let (s1, c1, r1) = (cpu(&server), cpu(&c), cpu(&r));

    let mut views = Vec::with_capacity(VIEWS);
    for _ in 0..VIEWS {
        let t0 = Instant::now();
        let cluster = turnpike_store::views::cluster(bus, turnpike_jetstream::now()).await?;
        views.push(t0.elapsed());
        let live: u64 = cluster.live.iter().map(|(_, k)| k).sum();
        anyhow::ensure!(
            live as usize == n + SLOTS,
            "the view counts {live} live turns, not {}",
            n + SLOTS
        );
    }
    views.sort();
    let (rss, _) = crate::procstat::rss_mib(coordinator);
    let pages = dashboard_pages(stack, n, shape, &hung[0]).await?;

    // The runner dies: its attempts are declared lost by the sweep, a lease and a pass later.
    let killed = Instant::now();
    runner.kill()?;
    let mut lost = Vec::new();
    for turn in &hung {
        wait_lost(bus, turn).await?;
        lost.push(killed.elapsed());
    }
    lost.sort();
    Ok(Measured {
        server_cpu: s1.saturating_sub(s0),
        coordinator_cpu: c1.saturating_sub(c0),
        runner_cpu: r1.saturating_sub(r0),
        view_p50: percentile(&views, 0.5),
        view_p95: percentile(&views, 0.95),
        coordinator_rss_mib: rss,
        listing,
        settled,
        lost_first: lost.first().copied().unwrap_or_default(),
        lost_last: lost.last().copied().unwrap_or_default(),
        pages,
    })
}

/// The dashboard's pages at `n` live turns of `shape`, with one chat in 100 flagged errored
/// (besides the live ones): each of [`PAGE_NAMES`]'s times.
async fn dashboard_pages(
    stack: &Stack,
    n: usize,
    shape: Shape,
    running: &TurnId,
) -> Result<Vec<Vec<Duration>>> {
    let bus = &stack.bus;
    let flagged = (n / 100).max(1);
    let chats = bucket(bus, turnpike_core::subjects::BUCKET_CHATS).await?;
    for i in 0..flagged {
        let chat = ChatId::new(format!("errored-{i}"))?;
        let record = crate::dashboard::errored_chat(&chat);
        chats
            .put(chat.as_str(), serde_json::to_vec(&record)?.into())
            .await?;
    }
    let served = crate::dashboard::Served::start(stack).await?;
    // The last page of the live list: the oldest turns (50 a page).
    let last = (n + SLOTS).div_ceil(50).max(1);
    let chat = ChatId::new("live-0")?;
    let paths = [
        "/".to_owned(),
        "/live".to_owned(),
        format!("/live?page={last}"),
        "/errored".to_owned(),
        format!("/chats/{chat}"),
        format!("/turns/{running}"),
        "/runners".to_owned(),
    ];
    let mut times = Vec::with_capacity(paths.len());
    for path in &paths {
        times.push(served.time(path, PAGES).await?);
    }
    served.stop().await?;
    eprintln!("{n} {shape:?}: pages timed");
    Ok(times)
}

/// `n` live turns of `shape`, created as the dispatcher creates them (indexed, recorded, joined
/// to their chat, the first admitted and its work item published), 32 chats at a time.
async fn plant(bus: &turnpike_store::Bus, n: usize, shape: Shape) -> Result<()> {
    let per_chat = shape.per_chat();
    let chats = n.div_ceil(per_chat);
    let mut created = futures::stream::iter(0..chats)
        .map(|c| async move {
            let chat = ChatId::new(format!("live-{c}"))?;
            for m in 0..per_chat.min(n - c * per_chat) {
                turnpike_testkit::plant::turn(bus, &chat, &format!("m{m}"), m as u64 + 1).await?;
            }
            Ok::<_, anyhow::Error>(())
        })
        .buffer_unordered(32);
    while let Some(done) = created.next().await {
        done?;
    }
    Ok(())
}

async fn wait_state(bus: &turnpike_store::Bus, turn: &TurnId, state: TurnState) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Some(v) = turnpike_store::turns::load(bus, turn).await? {
            if v.record.state == state {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    anyhow::bail!("turn {turn} not {state} within a minute")
}

/// Until attempt 1 of `turn` is recorded lost with its runner (polled every 50 ms).
async fn wait_lost(bus: &turnpike_store::Bus, turn: &TurnId) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let record = turnpike_store::turns::load(bus, turn)
            .await?
            .context("the turn's record")?
            .record;
        let class = record
            .attempts
            .first()
            .and_then(|a| a.exit.as_ref())
            .map(|e| e.class);
        if class == Some(ExitClass::RunnerLost) {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    anyhow::bail!("turn {turn}'s attempt was not declared lost within two minutes")
}
