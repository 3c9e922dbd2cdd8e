//! The fault suite: Turnpike as containers (3-node R3 NATS cluster, 2 coordinators, a
//! dispatcher, Docker runners; see `cluster/`) on a private Docker network, with nodes killed,
//! cut off and restarted under load. Every case judges turn records and chat output, never logs,
//! and adds a row (case, turns, lost, duplicated, wrong outcome) to target/fault-summary.tsv,
//! which `tests/run.sh` prints as a table.
//!
//! Cases by what they do to the cluster: `machines` (nodes lost and restarted), `load` (load and
//! size), `races` (hostile input and races). Run alone, one case at a time:
//! `cargo nextest run -p turnpike-tests --test faults --test-threads 1`. `TURNPIKE_SOAK=<k>` multiplies every load by k (the long run).

use futures::StreamExt;
use std::collections::HashMap;
use std::time::{Duration, Instant};
use turnpike_core::record::TurnState;
use turnpike_core::wire::{Attachment, ExitClass, OutboundKind, RunnerEvent, RunnerEventKind};
use turnpike_core::{subjects, ChatId, RunnerId, TurnId, TurnRecord, FORMAT_VERSION};
use turnpike_store::turns;
use turnpike_testkit::eventually;
use turnpike_tests::cluster::*;
use turnpike_tests::{
    connect_as, dead_letters, init_logs, send_message, visible_items, wait_state,
};

/// How long a case waits for its turns to end: generous (an R3 cluster and six roles share two
/// cores here), and longer for a soak.
fn long() -> Duration {
    Duration::from_secs(300 * soak() as u64)
}

async fn record(c: &Cluster, turn: &TurnId) -> TurnRecord {
    turns::load(&c.bus, turn)
        .await
        .expect("read turn")
        .expect("turn exists")
        .record
}

/// Count every node of the cluster that is not running, or has restarted, as a wrong outcome.
async fn no_restarts(c: &Cluster, tally: &mut Tally) {
    let mut names: Vec<String> = vec!["nats-1".into(), "nats-2".into(), "nats-3".into()];
    names.extend((1..=c.opts.coordinators).map(|k| format!("coordinator-{k}")));
    names.push("dispatcher".into());
    names.extend((1..=c.opts.runners).map(|k| format!("runner-{k}")));
    for name in &names {
        let (running, restarts) = c.state(name).await;
        if !running || restarts > 0 {
            tally.wrong += 1;
            tally
                .problems
                .push(format!("{name}: running {running}, restarts {restarts}"));
        }
    }
}

fn runner_name(c: &Cluster, runner: &RunnerId) -> String {
    let prefix = format!("tpf{}-", c.id);
    runner
        .as_str()
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("runner {runner} is not this cluster's"))
        .to_owned()
}

// The crate root of this test binary: its modules live in faults/.
#[path = "faults/load.rs"]
mod load;
#[path = "faults/machines.rs"]
mod machines;
#[path = "faults/races.rs"]
mod races;
