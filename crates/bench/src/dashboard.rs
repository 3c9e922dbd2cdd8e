//! Measurement 7: the dashboard's page time with many stored turns, each page beside the same
//! reads made by a bare client (the dashboard's own `read` functions, no HTTP, no HTML), so what
//! the page adds over its reads is visible.

use anyhow::{Context, Result};
use std::fmt::Write as _;
use std::future::Future;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use turnpike_core::wire::{ChatError, ChatRecord};
use turnpike_core::{ChatId, Timestamp, TurnId, FORMAT_VERSION};
use turnpike_dashboard::{read, Access, Dashboard, SessionKey, Users};
use turnpike_store::{views, Bus};
use turnpike_testkit::{dashboard_login, http};

use crate::{ms, percentile, send, Stack};

/// Chats in the bucket, every tenth flagged errored; turns live (hanging) while pages are read.
const CHATS: usize = 2_000;
const LIVE: usize = 40;
const WARM: usize = 10;
const SAMPLES: usize = 100;

async fn timed<F, Fut>(n: usize, mut f: F) -> Result<Vec<Duration>>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<()>>,
{
    for _ in 0..WARM {
        f().await?;
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        f().await?;
        out.push(t.elapsed());
    }
    out.sort();
    Ok(out)
}

/// The record of a chat with no turns, flagged errored: its turn gave up.
pub(crate) fn errored_chat(chat: &ChatId) -> ChatRecord {
    ChatRecord {
        workspace: None,
        v: FORMAT_VERSION,
        chat: chat.clone(),
        live: None,
        waiting: vec![],
        history: vec![],
        history_dropped: 0,
        inbound_seq: 0,
        errored: Some(ChatError {
            turn: TurnId::for_message(chat, "x"),
            at: Timestamp(1_800_000_000_000),
            reason: "gave up after 3 attempts".into(),
            cause: Some(turnpike_core::wire::ChatErrorCause::GaveUp),
        }),
        cleared: vec![],
    }
}

/// A dashboard served by this process on loopback over `stack`'s bus, user `bench` logged in.
pub(crate) struct Served {
    pub(crate) base: String,
    pub(crate) cookie: String,
    stop: CancellationToken,
    serving: tokio::task::JoinHandle<Result<(), turnpike_dashboard::DashboardError>>,
}

impl Served {
    pub(crate) async fn start(stack: &crate::Stack) -> Result<Served> {
        let users = Users::default().with("bench", turnpike_dashboard::hash_password("bench")?);
        let access = Access {
            users,
            key: SessionKey::random()?,
            session_ttl: Duration::from_secs(3600),
            proxies: Default::default(),
        };
        let listener = Dashboard::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let stop = CancellationToken::new();
        let dashboard = Dashboard::new(stack.bus.clone(), stack.config.clone(), access)?;
        let serving = tokio::spawn(dashboard.serve(listener, stop.clone()));
        let cookie = dashboard_login(&base, "bench", "bench").await;
        Ok(Served {
            base,
            cookie,
            stop,
            serving,
        })
    }

    /// `n` requests of `path` (after a warm-up), one at a time: their times, sorted.
    pub(crate) async fn time(&self, path: &str, n: usize) -> Result<Vec<Duration>> {
        timed(n, || page(&self.base, &self.cookie, path)).await
    }

    pub(crate) async fn stop(self) -> Result<()> {
        self.stop.cancel();
        self.serving.await?.context("dashboard")?;
        Ok(())
    }
}

async fn page(base: &str, cookie: &str, path: &str) -> Result<()> {
    let (status, _, _) = http(base, "GET", path, &[("Cookie", cookie)], "").await;
    anyhow::ensure!(status == 200, "GET {path}: {status}");
    Ok(())
}

pub async fn page_time(out: &mut String, stored: usize) -> Result<()> {
    let stack = Stack::start(1, |c| c.runner_slots = 4).await?;
    crate::stored_turns::fill_finished_turns(&stack.bus, stored).await?;
    let chats = crate::bucket(&stack.bus, turnpike_core::subjects::BUCKET_CHATS).await?;
    for i in 0..CHATS {
        let chat = ChatId::new(format!("c-{i}"))?;
        let rec = if i % 10 == 0 {
            errored_chat(&chat)
        } else {
            ChatRecord {
                errored: None,
                ..errored_chat(&chat)
            }
        };
        chats
            .put(chat.as_str(), serde_json::to_vec(&rec)?.into())
            .await?;
    }
    let mut hanging = Vec::new();
    for i in 0..LIVE {
        hanging.push(
            send(
                &stack.bus,
                &ChatId::new(format!("live-{i}"))?,
                &format!("hang-{i}"),
                "hang",
            )
            .await?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while views::live_ids(&stack.bus).await?.len() < LIVE {
        anyhow::ensure!(
            Instant::now() < deadline,
            "live turns did not appear: {} of {LIVE} in the live index; the first is {:?}",
            views::live_ids(&stack.bus).await?.len(),
            views::turn(&stack.bus, &hanging[0]).await?.map(|r| r.state)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let served = Served::start(&stack).await?;
    let (base, cookie) = (&served.base, &served.cookie);
    let bus: &Bus = &stack.bus;
    let old = TurnId::for_message(&ChatId::new("stored")?, "old-777");
    let chat0 = ChatId::new("live-0")?;
    let turn_path = format!("/turns/{old}");
    let chat_path = format!("/chats/{chat0}");
    let rows: Vec<(&str, Vec<Duration>, Vec<Duration>)> = vec![
        (
            "overview `/`",
            timed(SAMPLES, || page(base, cookie, "/")).await?,
            timed(SAMPLES, || async {
                read::overview(bus).await.map(drop).map_err(Into::into)
            })
            .await?,
        ),
        (
            "errored chats `/errored`",
            timed(SAMPLES, || page(base, cookie, "/errored")).await?,
            timed(SAMPLES, || async {
                views::chats(bus).await.map(drop).map_err(Into::into)
            })
            .await?,
        ),
        (
            "live turns `/live`",
            timed(SAMPLES, || page(base, cookie, "/live")).await?,
            timed(SAMPLES, || async {
                let ids = views::live_ids(bus).await?;
                views::records(bus, &ids)
                    .await
                    .map(drop)
                    .map_err(Into::into)
            })
            .await?,
        ),
        (
            "turn `/turns/<id>`",
            timed(SAMPLES, || page(base, cookie, &turn_path)).await?,
            timed(SAMPLES, || async {
                views::turn(bus, &old).await?;
                views::reruns(bus, &old, 20)
                    .await
                    .map(drop)
                    .map_err(Into::into)
            })
            .await?,
        ),
        (
            "runners `/runners`",
            timed(SAMPLES, || page(base, cookie, "/runners")).await?,
            timed(SAMPLES, || async {
                views::runners(bus).await.map(drop).map_err(Into::into)
            })
            .await?,
        ),
        (
            "chat `/chats/<id>`",
            timed(SAMPLES, || page(base, cookie, &chat_path)).await?,
            timed(SAMPLES, || async {
                views::chat(bus, &chat0).await?;
                let ids = views::recent_turn_ids(bus, &chat0, 20).await?;
                views::records(bus, &ids)
                    .await
                    .map(drop)
                    .map_err(Into::into)
            })
            .await?,
        ),
    ];
    served.stop().await?;
    for t in &hanging {
        let _ = bus
            .client
            .request(
                turnpike_core::subjects::OPS_KILL,
                serde_json::to_vec(&serde_json::json!({"by": "bench", "turn": t}))?.into(),
            )
            .await;
    }
    stack.stop().await;

    writeln!(
        out,
        "\n### 7. Dashboard page time with {stored} stored turns\n\n\
         {CHATS} chats ({} flagged errored), {LIVE} live turns, one runner; {SAMPLES} requests per page \
         after {WARM} warm-up, one at a time over loopback (a new connection each). Beside each page, \
         the same reads by a bare client (the dashboard's `read` functions, no HTTP or HTML). Goal: \
         p95 ≤ 200 ms.\n\n\
         | page | p50 | p95 | bare reads p50 | bare reads p95 |\n|---|---|---|---|---|",
        CHATS / 10
    )?;
    for (name, page, bare) in &rows {
        writeln!(
            out,
            "| {name} | {} | {} | {} | {} |",
            ms(percentile(page, 0.5)),
            ms(percentile(page, 0.95)),
            ms(percentile(bare, 0.5)),
            ms(percentile(bare, 0.95)),
        )?;
    }
    writeln!(
        out,
        "\nThe overview's reads include a 50 ms wait for more coordinators to answer the stats \
         request (each answers at once; the wait ends the collection). No page reads the turns \
         bucket as a whole: lists read the live index, the chats and runners buckets (one ordered \
         pass each), a turn and its re-runs by key, and a chat's inbound tail backwards."
    )?;
    Ok(())
}
