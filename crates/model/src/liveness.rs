//! Liveness: from every reachable state (faults included), the work can still be finished —
//! every message taken, every turn ended and settled, the chat idle — by steps that are not
//! faults. In temporal logic, AG EF settled over the fault-free steps: under fairness (every
//! process keeps taking its steps, schedules fire, leases of the dead lapse), a turn owed an
//! attempt gets it and no chat is left wedged.
//!
//! `stateright`'s `eventually` looks only at paths that end; this pass keeps the whole graph
//! (fingerprints and fault-free edges), searches backwards from the settled states, and reports
//! the shortest path to a state from which settling is impossible.

use crate::{Action, Protocol, World};
use stateright::Model;
use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};

#[derive(Debug)]
pub struct Report {
    pub states: usize,
    pub edges: usize,
    pub settled: usize,
    /// The shortest path to a state from which the work can no longer be finished.
    pub stuck: Option<Vec<(Action, World)>>,
}

fn fingerprint(w: &World) -> u64 {
    let mut h = DefaultHasher::new();
    w.hash(&mut h);
    h.finish()
}

pub fn check(m: &Protocol) -> Report {
    let mut ids: HashMap<u64, u32> = HashMap::new();
    let mut fps: Vec<u64> = Vec::new();
    let mut parent: Vec<u32> = Vec::new();
    let mut settled: Vec<bool> = Vec::new();
    let mut edges: Vec<(u32, u32)> = Vec::new();
    let mut queue = VecDeque::new();
    let init = m.init_states();
    for s in &init {
        let fp = fingerprint(s);
        if let Entry::Vacant(e) = ids.entry(fp) {
            e.insert(fps.len() as u32);
            parent.push(fps.len() as u32);
            fps.push(fp);
            settled.push(m.settled(s));
            queue.push_back(s.clone());
        }
    }
    let mut actions = Vec::new();
    while let Some(s) = queue.pop_front() {
        let from = ids[&fingerprint(&s)];
        actions.clear();
        m.actions(&s, &mut actions);
        for a in actions.drain(..) {
            let fault = m.is_fault(&s, &a);
            let Some(next) = m.next_state(&s, a) else {
                continue;
            };
            let fp = fingerprint(&next);
            let to = match ids.entry(fp) {
                Entry::Occupied(e) => *e.get(),
                Entry::Vacant(e) => {
                    let id = fps.len() as u32;
                    e.insert(id);
                    fps.push(fp);
                    parent.push(from);
                    settled.push(m.settled(&next));
                    queue.push_back(next);
                    id
                }
            };
            if !fault {
                edges.push((from, to));
            }
        }
    }
    let n = fps.len();
    // Backwards from the settled states over fault-free edges.
    let mut rev_start = vec![0u32; n + 1];
    for (_, to) in &edges {
        rev_start[*to as usize + 1] += 1;
    }
    for i in 0..n {
        rev_start[i + 1] += rev_start[i];
    }
    let mut fill = rev_start.clone();
    let mut rev = vec![0u32; edges.len()];
    for (from, to) in &edges {
        rev[fill[*to as usize] as usize] = *from;
        fill[*to as usize] += 1;
    }
    let mut can = settled.clone();
    let mut work: Vec<u32> = (0..n as u32).filter(|i| settled[*i as usize]).collect();
    while let Some(i) = work.pop() {
        for j in rev_start[i as usize]..rev_start[i as usize + 1] {
            let p = rev[j as usize];
            if !can[p as usize] {
                can[p as usize] = true;
                work.push(p);
            }
        }
    }
    // Ids are in BFS order: the first stuck one has a shortest path.
    let stuck = (0..n)
        .find(|i| !can[*i])
        .map(|i| path(m, &init, &parent, &fps, i as u32));
    Report {
        states: n,
        edges: edges.len(),
        settled: settled.iter().filter(|s| **s).count(),
        stuck,
    }
}

/// Rebuild the path to state `id` by replaying from the initial state along its parents.
fn path(
    m: &Protocol,
    init: &[World],
    parent: &[u32],
    fps: &[u64],
    id: u32,
) -> Vec<(Action, World)> {
    let mut chain = vec![id];
    let mut at = id;
    while parent[at as usize] != at {
        at = parent[at as usize];
        chain.push(at);
    }
    chain.reverse();
    let Some(mut state) = init
        .iter()
        .find(|s| fingerprint(s) == fps[chain[0] as usize])
        .cloned()
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut actions = Vec::new();
    for next in &chain[1..] {
        actions.clear();
        m.actions(&state, &mut actions);
        let step = actions.drain(..).find_map(|a| {
            let s = m.next_state(&state, a.clone())?;
            (fingerprint(&s) == fps[*next as usize]).then_some((a, s))
        });
        let Some((a, s)) = step else { break };
        state = s.clone();
        out.push((a, s));
    }
    out
}
