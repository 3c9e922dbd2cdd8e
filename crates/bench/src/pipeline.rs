//! Measurement 1: the pipeline against the same JetStream operations replayed bare.

use super::*;

/// Turns the census counts operations over.
const CENSUS_TURNS: usize = 100;

/// The JetStream operations one turn costs (as the census counted them), replayed with no
/// Turnpike logic, `concurrency` "turns" at a time, on streams configured like the pipeline's
/// own, over `connections` client connections. Returns baseline turns per second.
async fn baseline(
    stack: &Stack,
    mix: &[(Op, usize)],
    n: usize,
    concurrency: usize,
    connections: usize,
) -> Result<f64> {
    let base = census::Baseline::create(stack, concurrency, connections).await?;
    let start = Instant::now();
    let mut handles = Vec::new();
    let per_worker = n.div_ceil(concurrency);
    for w in 0..concurrency {
        let (base, mix) = (base.clone(), mix.to_vec());
        handles.push(tokio::spawn(async move {
            for t in 0..per_worker {
                base.turn(w, t, &mix).await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for h in handles {
        h.await??;
    }
    Ok((per_worker * concurrency) as f64 / start.elapsed().as_secs_f64())
}

pub(crate) async fn pipeline_overhead(out: &mut String, n: usize, slots: usize) -> Result<()> {
    let agent = std::env::current_exe().map_or("?", |me| agent_command(&me).1);
    writeln!(
        out,
        "\n### 1. Pipeline vs raw JetStream ({n} turns, agent replies at once, process backend: \
         `{agent}`, `scratch_dir` {})\n",
        scratch_dir().map_or("unset (system temp dir)".into(), |d| d
            .display()
            .to_string())
    )?;
    // What one turn costs on the wire, counted on a stack of its own so the timed runs below
    // carry no `>` subscription.
    let stack = Stack::start(1, |c| c.runner_slots = 4).await?;
    let mix = census::count(&stack, CENSUS_TURNS, "census").await?;
    stack.stop().await;
    let whole = mix.whole();
    let ops_per_turn = census::round_trips(&whole);
    writeln!(
        out,
        "What one turn costs on the wire ({CENSUS_TURNS} turns, every request the server saw, \
         counted by a `>` subscription); the baseline replays the rounded counts:\n"
    )?;
    writeln!(out, "| operation | per turn | baseline replays |")?;
    writeln!(out, "|---|---|---|")?;
    for (op, per_turn) in &mix.0 {
        let replay = whole.iter().find(|(o, _)| o == op).map_or(0, |(_, k)| *k);
        writeln!(out, "| {op} | {per_turn:.2} | {replay} |")?;
    }
    writeln!(
        out,
        "| **round trips** (acks are fire-and-forget) | {:.2} | {ops_per_turn} |\n",
        mix.round_trips()
    )?;
    writeln!(
        out,
        "| runners × slots | turns/s | p50 | p99 | baseline turns/s (ops/s) | ratio | \
         CPU ms per turn: server / roles / agents | baseline: server / client | \
         baseline on the pipeline's connections: turns/s, ratio, server / client | \
         minimal-ops baseline: turns/s, ratio, server / client |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|")?;
    let mut rows = Vec::new();
    for runners in [1usize, 2, 4] {
        let stack = Stack::start(runners, |c| c.runner_slots = slots as u32).await?;
        let server = stack.server_pid();
        let mut pipe = Vec::new();
        let mut base = Vec::new();
        let mut spread = Vec::new();
        let mut lat = Vec::new();
        // One connection each for the chat adapter (this process), dispatcher, coordinator and
        // every runner.
        let connections = 3 + runners;
        let (mut pipe_cpu, mut base_cpu, mut spread_cpu, mut min_cpu) = (
            [Duration::ZERO; 3],
            [Duration::ZERO; 2],
            [Duration::ZERO; 2],
            [Duration::ZERO; 2],
        );
        let mut minimal = Vec::new();
        // Alternate the pipeline and the two baselines so that a noisy neighbour hits all alike;
        // medians of ROUNDS.
        for round in 0..ROUNDS {
            let (s0, me0) = (
                crate::procstat::Cpu::of(&server),
                crate::procstat::Cpu::of("self"),
            );
            let (elapsed, l) = burst(&stack, n, "reply:ok", &format!("p{runners}r{round}")).await?;
            let (s1, me1) = (
                crate::procstat::Cpu::of(&server),
                crate::procstat::Cpu::of("self"),
            );
            let b = baseline(&stack, &whole, n, runners * slots, 1).await?;
            let (s2, me2) = (
                crate::procstat::Cpu::of(&server),
                crate::procstat::Cpu::of("self"),
            );
            spread.push(baseline(&stack, &whole, n, runners * slots, connections).await?);
            let (s3, me3) = (
                crate::procstat::Cpu::of(&server),
                crate::procstat::Cpu::of("self"),
            );
            // The second baseline: the fewest operations a turn needs, replayed alike.
            minimal.push(baseline(&stack, census::MINIMAL, n, runners * slots, 1).await?);
            let (s4, me4) = (
                crate::procstat::Cpu::of(&server),
                crate::procstat::Cpu::of("self"),
            );
            pipe.push(n as f64 / elapsed.as_secs_f64());
            base.push(b);
            lat.extend(l);
            pipe_cpu[0] += s1.own - s0.own;
            pipe_cpu[1] += me1.own - me0.own;
            pipe_cpu[2] += me1.children - me0.children;
            base_cpu[0] += s2.own - s1.own;
            base_cpu[1] += me2.own - me1.own;
            spread_cpu[0] += s3.own - s2.own;
            spread_cpu[1] += me3.own - me2.own;
            min_cpu[0] += s4.own - s3.own;
            min_cpu[1] += me4.own - me3.own;
        }
        lat.sort();
        let (tps, b, sb, mb) = (
            median(&mut pipe),
            median(&mut base),
            median(&mut spread),
            median(&mut minimal),
        );
        rows.push((runners, tps));
        let per_turn =
            |d: Duration| format!("{:.2}", d.as_secs_f64() * 1000.0 / (n * ROUNDS) as f64);
        writeln!(
            out,
            "| {runners} × {slots} | {tps:.1} | {} | {} | {b:.1} ({:.0}) | {:.2} | {} / {} / {} | {} / {} | \
             {sb:.1} on {connections}, {:.2}, {} / {} | {mb:.1}, {:.2}, {} / {} |",
            ms(percentile(&lat, 0.5)),
            ms(percentile(&lat, 0.99)),
            b * ops_per_turn as f64,
            tps / b,
            per_turn(pipe_cpu[0]),
            per_turn(pipe_cpu[1]),
            per_turn(pipe_cpu[2]),
            per_turn(base_cpu[0]),
            per_turn(base_cpu[1]),
            tps / sb,
            per_turn(spread_cpu[0]),
            per_turn(spread_cpu[1]),
            tps / mb,
            per_turn(min_cpu[0]),
            per_turn(min_cpu[1]),
        )?;
        stack.stop().await;
    }
    writeln!(
        out,
        "\nratio = turns/s ÷ baseline turns/s (= baseline ops/s ÷ {ops_per_turn} round trips per \
         turn); medians of {ROUNDS} alternating rounds; the baseline runs runners × slots loops at \
         once; goal ≥ 0.8. CPU is per turn, summed over the rounds: the server's, this process's \
         (the roles, or the baseline's client), and the agents' (reaped child processes). The \
         column before last replays the same loops spread over as many connections as the pipeline \
         holds (one per role), with its CPU per turn: the gap between the two baselines is the \
         price of the roles being separate clients, as they are in a deployment, rather than of \
         Turnpike's logic. The minimal-ops baseline replays the fewest operations a turn needs \
         ({} round trips, docs/benchmarks/minimal-turn.md) the same way: the census's baseline \
         cannot see an operation that need not happen, this one can.",
        census::round_trips(census::MINIMAL)
    )?;
    // The "a baseline loop" read literally: one loop, no concurrency. Shown for reference
    // only; it is latency-bound where the pipeline is not, so the goal is judged above.
    let stack = Stack::start(1, |c| c.runner_slots = 4).await?;
    let one = baseline(&stack, &whole, n, 1, 1).await?;
    stack.stop().await;
    let against_one: Vec<String> = rows
        .iter()
        .map(|(r, tps)| format!("{:.2} at {r} × {slots}", tps / one))
        .collect();
    writeln!(
        out,
        "\nFor reference, a single baseline loop (no concurrency) does {one:.1} turns/s. Against \
         it the ratios would be {}. That flatters the pipeline, which runs many turns at once, so \
         the goal is judged against the matched concurrency above.",
        against_one.join(", ")
    )?;
    Ok(())
}
