//! Measurement 3: the retry path (a death, the 10 s delay, the next attempt).

use super::*;

/// Delay actually taken minus the configured 10 s, from the recorded death to the next attempt's
/// publish, read from the turn records.
pub(crate) async fn retry_path(out: &mut String) -> Result<()> {
    writeln!(out, "\n### 3. Retry path (configured delay 10 s)\n")?;
    writeln!(
        out,
        "| case | retries | p50 late | p99 late | max late | early (most early) |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    for (case, n, slots) in [
        ("isolated", 10usize, 2u32),
        ("burst of 100 deaths", 100, 50),
    ] {
        let stack = Stack::start(2, |c| {
            c.runner_slots = slots;
            c.retry_delay = Duration::from_secs(10);
        })
        .await?;
        let tag = if n == 10 { "iso" } else { "burst" };
        let mut ids = Vec::new();
        for i in 0..n {
            let chat = ChatId::new(format!("{tag}-{i}"))?;
            let id = format!("{tag}-m{i}");
            ids.push(send(&stack.bus, &chat, &id, "die-until:2").await?);
            if n == 10 {
                // Isolated: deaths well apart.
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
        }
        // Late counts from the configured delay; a retry that fired before it is counted apart
        // (as 0 late), so that an early one cannot hide in the percentiles.
        let (mut late, mut early) = (Vec::new(), Vec::new());
        for t in &ids {
            let r = ended(&stack.bus, t).await?;
            if let (Some(died), Some(published)) = (
                r.attempts
                    .first()
                    .and_then(|a| a.exit.as_ref())
                    .map(|e| e.ended_at),
                r.attempts.get(1).and_then(|a| a.published_at),
            ) {
                let gap = published.since(died);
                let delay = stack.config.retry_delay;
                late.push(gap.saturating_sub(delay));
                if gap < delay {
                    early.push(delay - gap);
                }
            }
        }
        late.sort();
        writeln!(
            out,
            "| {case} | {} | {} | {} | {} | {} ({}) |",
            late.len(),
            ms(percentile(&late, 0.5)),
            ms(percentile(&late, 0.99)),
            ms(late.last().copied().unwrap_or_default()),
            early.len(),
            ms(early.iter().max().copied().unwrap_or_default())
        )?;
        stack.stop().await;
    }
    writeln!(out, "\nGoals: isolated p99 ≤ 20 ms; burst p99 ≤ 300 ms (the server's scheduler ticks every 250 ms at most).")?;
    Ok(())
}
