//! Measurement 6, throughput as runners are added, and the latency-against-load curve.

use super::*;

pub(crate) async fn runner_scaling(out: &mut String) -> Result<Vec<(usize, f64)>> {
    let mut points = Vec::new();
    let n = 32;
    writeln!(
        out,
        "\n### 6. Runners on `sleep:1` turns ({n} turns, 2 slots per runner)\n"
    )?;
    writeln!(out, "| runners | turns/s | × linear |")?;
    writeln!(out, "|---|---|---|")?;
    let mut one = None;
    for runners in [1usize, 2, 4] {
        let stack = Stack::start(runners, |c| c.runner_slots = 2).await?;
        let (elapsed, _) = burst(&stack, n, "sleep:1", &format!("s{runners}")).await?;
        let tps = n as f64 / elapsed.as_secs_f64();
        let base = *one.get_or_insert(tps);
        writeln!(
            out,
            "| {runners} | {tps:.2} | {:.2} |",
            tps / (base * runners as f64)
        )?;
        points.push((runners, tps));
        stack.stop().await;
    }
    writeln!(
        out,
        "\nGoal ≥ 0.9 × linear: capacity, not CPU, is the limit here."
    )?;
    Ok(points)
}

/// p50/p99 latency for bursts of growing size on one runner with 4 slots.
pub(crate) async fn latency_vs_load(out: &mut String) -> Result<Vec<(usize, f64, f64)>> {
    writeln!(
        out,
        "\n### Latency vs load (1 runner × 4 slots, agent replies at once)\n"
    )?;
    writeln!(out, "| turns sent at once | p50 | p99 |")?;
    writeln!(out, "|---|---|---|")?;
    let mut points = Vec::new();
    let stack = Stack::start(1, |c| c.runner_slots = 4).await?;
    for load in [10usize, 25, 50, 100, 200] {
        let (_, lat) = burst(&stack, load, "reply:ok", &format!("load{load}")).await?;
        let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
        writeln!(out, "| {load} | {} | {} |", ms(p50), ms(p99))?;
        points.push((load, p50.as_secs_f64() * 1000.0, p99.as_secs_f64() * 1000.0));
    }
    stack.stop().await;
    Ok(points)
}
