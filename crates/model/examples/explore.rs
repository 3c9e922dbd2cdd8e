use stateright::{Checker, Model};
use turnpike_model::Protocol;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap_or(0))
        .collect();
    let arg = |i: usize, d: usize| args.get(i).copied().unwrap_or(d);
    let (turns, runners, coords, faults, kill) =
        (arg(0, 1), arg(1, 1), arg(2, 1), arg(3, 0) as u8, arg(4, 0));
    let m = Protocol::new(turns, runners, coords).with(|p| {
        p.faults = faults;
        p.max_turn_retry = arg(5, 2) as u32;
        p.says = arg(6, 1) as u32;
        p.early_timers = arg(7, 1) as u8;
        if kill > 0 {
            p.killable = vec![0];
        }
    });
    let t = std::time::Instant::now();
    let c = m.clone().checker().threads(2).spawn_bfs().join();
    println!(
        "safety: {} states ({} unique), depth {}, {:?}",
        c.state_count(),
        c.unique_state_count(),
        c.max_depth(),
        t.elapsed()
    );
    for (name, path) in c.discoveries() {
        let actions = path.clone().into_actions();
        println!("discovery: {name} ({} steps)", actions.len());
        // The steps of a counterexample (`sometimes` examples are not worth reading).
        if std::env::var_os("TRACE").is_some() && name.starts_with("never") {
            for a in &actions {
                println!("  {a:?}");
            }
            println!("{:#?}", path.last_state());
        }
    }
    let t = std::time::Instant::now();
    let r = turnpike_model::liveness::check(&m);
    println!(
        "liveness: {} states, {} edges, {} settled, stuck: {:?}, {:?}",
        r.states,
        r.edges,
        r.settled,
        r.stuck.as_ref().map(|p| p.len()),
        t.elapsed()
    );
    if let Some(p) = r.stuck {
        for (a, _) in &p {
            println!("  {a:?}");
        }
        println!("{:#?}", p.last().map(|x| &x.1));
    }
}
