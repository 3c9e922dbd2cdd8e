//! What the pages show beyond the store's read model ([`turnpike_store::views`]): the
//! coordinators' counters, asked of them, and a turn's replies so far.

use futures::StreamExt;
use serde::Deserialize;
use std::time::Duration;
use turnpike_core::{subjects, TurnRecord};
use turnpike_store::{views, Bus};

use crate::DashboardError;

fn kv_err(what: impl Into<String>, e: impl std::fmt::Display) -> DashboardError {
    DashboardError::Read {
        what: what.into(),
        why: e.to_string(),
    }
}

/// Reads at most when showing one turn's replies: far more than any turn lands, and a bound on
/// what one page view can cost.
const MAX_OUTPUT_READS: usize = 1000;

/// The bot messages the turn has landed so far, read from the chat's output: the record counts
/// an attempt's messages only once it ended, and a page shows a running one's as they land.
pub async fn output(
    bus: &Bus,
    r: &TurnRecord,
) -> Result<turnpike_store::fence::TurnOutput, DashboardError> {
    turnpike_store::fence::turn_output(bus, &r.chat, &r.turn, MAX_OUTPUT_READS)
        .await
        .map_err(|e| kv_err(format!("the replies of turn {}", r.turn), e))
}

use turnpike_core::wire::CountersSnapshot;

#[derive(Deserialize)]
struct ServiceStats {
    #[serde(default)]
    id: String,
    #[serde(default)]
    endpoints: Vec<EndpointStats>,
}

#[derive(Deserialize)]
struct EndpointStats {
    #[serde(default)]
    data: Option<CountersSnapshot>,
}

/// Every coordinator's counters, summed, and how many coordinators answered. Collects answers
/// until none has come for `quiet` (each coordinator answers at once).
pub async fn coordinator_counters(
    bus: &Bus,
    quiet: Duration,
) -> Result<(CountersSnapshot, usize), DashboardError> {
    let inbox = bus.client.new_inbox();
    let mut sub = bus
        .client
        .subscribe(inbox.clone())
        .await
        .map_err(|e| kv_err("the coordinators' stats", e))?;
    bus.client
        .publish_with_reply(
            format!("$SRV.STATS.{}", subjects::OPS_SERVICE),
            inbox,
            bytes::Bytes::new(),
        )
        .await
        .map_err(|e| kv_err("the coordinators' stats", e))?;
    let mut total = CountersSnapshot::default();
    let mut seen = std::collections::HashSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    loop {
        let wait = quiet.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(wait, sub.next()).await {
            Ok(Some(m)) => {
                if let Ok(s) = serde_json::from_slice::<ServiceStats>(&m.payload) {
                    // Every endpoint carries the same process-wide counters: count each process once.
                    if seen.insert(s.id.clone()) {
                        if let Some(c) = s.endpoints.iter().find_map(|e| e.data.clone()) {
                            total.add(&c);
                        }
                    }
                }
            }
            _ => break,
        }
    }
    Ok((total, seen.len()))
}

/// What the overview shows: counters summed over the coordinators, and the cluster's
/// [`views::Cluster`] view.
pub async fn overview(bus: &Bus) -> Result<crate::html::Overview, DashboardError> {
    // At once: the counters' collection waits out 50 ms of quiet for more coordinators.
    let (counted, cluster) = tokio::join!(
        coordinator_counters(bus, Duration::from_millis(50)),
        views::cluster(bus, turnpike_jetstream::now())
    );
    let (counters, coordinators) = counted?;
    let cluster = cluster.map_err(|e| kv_err("the cluster", e))?;
    Ok(crate::html::Overview {
        counters,
        coordinators,
        cluster,
    })
}
