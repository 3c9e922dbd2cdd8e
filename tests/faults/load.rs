//! Load and size: runners scaled under load, a chat of heavy replies, an attachment bomb.

use super::*;

/// 6. Scale runners 1 → 3 under a steady load of `sleep:2` turns: every turn ends right; the
/// throughput of each phase is measured (BENCHMARKS.md), not asserted.
#[tokio::test]
async fn f6_runners_scaled_from_one_to_three_under_load() {
    init_logs();
    let c = Cluster::start(ClusterOpts {
        runners: 1,
        ..ClusterOpts::default()
    })
    .await;
    let phase = Duration::from_secs(20 * soak() as u64);
    let interval = Duration::from_millis(333);
    let t0 = turnpike_jetstream::now().millis();
    let load = async {
        let mut expects = Vec::new();
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < phase * 2 {
            let t = send_acked(
                &c.bus,
                &format!("f6-{i}"),
                &format!("f6-m{i}"),
                "sleep:2",
                30,
            )
            .await;
            expects.push(expect_script(t, "sleep:2", 3));
            i += 1;
            tokio::time::sleep(interval).await;
        }
        expects
    };
    let scale = async {
        tokio::time::sleep(phase).await;
        let at = turnpike_jetstream::now().millis();
        c.add_runner().await;
        c.add_runner().await;
        at
    };
    let (expects, scaled_at) = tokio::join!(load, scale);
    let load_end = turnpike_jetstream::now().millis();
    let mut tally = judge(&c.bus, "6 runners 1 -> 3", &expects, long()).await;
    // Turns ended per second within each phase (past a short settling time after each start).
    let mut ends = Vec::new();
    for e in &expects {
        let r = record(&c, &e.turn).await;
        ends.push(r.updated_at.millis());
    }
    let rate = |from: u64, to: u64| {
        let n = ends.iter().filter(|&&t| t >= from && t < to).count();
        n as f64 / ((to - from) as f64 / 1000.0)
    };
    let one = rate(t0 + 5_000, scaled_at);
    let three = rate(scaled_at + 8_000, load_end);
    let line = format!(
        "runners 1 -> 3 (2 slots each, sleep:2 turns in containers, offered 3/s): \
         {one:.2} turns/s with 1 runner, {three:.2} turns/s with 3 ({:.2}x)",
        three / one.max(f64::EPSILON)
    );
    eprintln!("{line}");
    tally.note = line;
    tally.report();
}

/// 10. A heavy chat: one chat whose turns each reply 60 KiB. Its history is bounded in bytes, so
/// the chat record and every work item stay inside NATS's 1 MiB payload: every turn is answered,
/// in order, none wedges.
#[tokio::test]
async fn f10_heavy_chat() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let n = 24 * soak();
    let mut expects = Vec::new();
    for i in 0..n {
        let text = "big-reply:61440";
        let t = send_acked(&c.bus, "f10", &format!("f10-m{i}"), text, 30).await;
        expects.push(expect_script(t, text, 3));
    }
    let mut tally = judge(&c.bus, "10 heavy chat", &expects, long()).await;
    let last = record(&c, &expects[n - 1].turn).await;
    let bytes: usize = last.history.iter().map(|h| h.text.len()).sum();
    let budget = 256 * 1024;
    if bytes > budget {
        tally.wrong += 1;
        tally
            .problems
            .push(format!("history of {bytes} B over {budget} B"));
    }
    tally.note = format!(
        "{n} turns of 60 KiB replies in one chat ({} KiB in all); the last turn's history: {} entries, {} KiB",
        n * 60,
        last.history.len(),
        bytes / 1024
    );
    tally.report();
}

/// 11. An attachment bomb: one object listed many times, objects past the byte limits, another
/// chat's object, while ordinary turns run. What fits the limits (16 × 4 MiB = 64 MiB) is
/// streamed through a runner to its container; the rest is refused with a notice; no node
/// restarts, and the ordinary turns end as the table says.
#[tokio::test]
async fn f11_attachment_bomb() {
    init_logs();
    let c = Cluster::start(ClusterOpts::default()).await;
    let put = |object: &'static str, len: usize| {
        let bus = &c.bus;
        async move {
            let mut reader: &[u8] = &vec![0x5a; len];
            turnpike_store::attachments::put(bus, object, &mut reader)
                .await
                .expect("upload");
        }
    };
    put("f11/m/blob.bin", 4 << 20).await;
    put("f11/m/big.bin", 10 << 20).await;
    let listed = |object: &str, n: usize| {
        (0..n)
            .map(|i| Attachment {
                name: format!("copy{i}.bin"),
                object: object.to_owned(),
            })
            .collect::<Vec<_>>()
    };
    let fits = send_message(
        &c.bus,
        "f11",
        "f11-fits",
        "attachments",
        listed("f11/m/blob.bin", 16),
    )
    .await;
    let refused = [
        (
            send_message(
                &c.bus,
                "f11",
                "f11-count",
                "attachments",
                listed("f11/m/blob.bin", 17),
            )
            .await,
            "f11",
            "lists 17 attachments",
        ),
        (
            send_message(
                &c.bus,
                "f11",
                "f11-bytes",
                "attachments",
                listed("f11/m/big.bin", 7),
            )
            .await,
            "f11",
            "add up to",
        ),
        (
            send_message(
                &c.bus,
                "f11x",
                "f11-foreign",
                "attachments",
                listed("f11/m/blob.bin", 1),
            )
            .await,
            "f11x",
            "is not under this chat's name",
        ),
    ];
    let mut expects = vec![expect_script(fits.clone(), "attachments", 3)];
    for i in 0..6 * soak() {
        let t = send_acked(
            &c.bus,
            &format!("f11-ok-{i}"),
            &format!("f11-ok-m{i}"),
            "reply:ok",
            30,
        )
        .await;
        expects.push(expect_script(t, "reply:ok", 3));
    }
    let mut tally = judge(&c.bus, "11 attachment bomb", &expects, long()).await;
    // The 64 MiB reached the agent whole: 16 files of 4 MiB.
    let outbound = outbound_by_turn(&c.bus).await;
    let summary = outbound
        .get(fits.as_str())
        .and_then(|items| items.iter().find(|i| i.kind == OutboundKind::Message))
        .map(|m| m.text.clone())
        .unwrap_or_default();
    let whole = summary.matches(&format!(" {} ", 4 << 20)).count();
    if whole != 16 {
        tally.wrong += 1;
        tally.problems.push(format!(
            "the agent saw {whole} whole attachments: {summary:.300}"
        ));
    }
    for (turn, chat, says) in &refused {
        let notice = eventually(Duration::from_secs(60), "a refusal notice", || async {
            visible_items(&c.bus, chat)
                .await
                .into_iter()
                .find(|i| &i.turn == turn && i.kind == OutboundKind::Notice)
        })
        .await;
        let made = turns::load(&c.bus, turn).await.expect("read turn");
        if !notice.text.contains(says) || made.is_some() {
            tally.wrong += 1;
            tally.problems.push(format!(
                "{turn}: notice {:?}, turn made: {}",
                notice.text,
                made.is_some()
            ));
        }
    }
    no_restarts(&c, &mut tally).await;
    tally.note = format!(
        "64 MiB (one 4 MiB object listed 16 times) reached the agent whole; {} bombs refused with a notice; no restarts",
        refused.len()
    );
    tally.report();
}
