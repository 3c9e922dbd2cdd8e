//! The dashboard's cluster gauges, in the Prometheus text format: the cluster as JetStream shows
//! it (live turns by state, work queue depth, runner slots, errored chats). Served on
//! `metrics_listen`, the listener every role serves its `/metrics` on (bound where scrapers
//! reach it, not where the public does), never on the dashboard's own: a scraper holds no
//! session, and the public listener does only logged-in work. Read at most once per
//! [`REFRESH`], whoever scrapes, however often: a scrape of stale gauges returns them and starts
//! one read in the background; no request reads the cluster itself.
//!
//! Counters of what happened (turns ended, retries, deaths) belong to the coordinators that did
//! it: each exports its own on `metrics_listen`, and Prometheus adds them up
//! (`sum by (state) (turnpike_turns_ended_total)`). The dashboard does not re-export them, so a
//! scrape of both never counts an event twice.

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::DashboardError;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: String,
}

/// How old the gauges may be before a scrape starts a new read.
pub const REFRESH: std::time::Duration = std::time::Duration::from_secs(15);

pub struct ClusterMetrics {
    /// The last text, and when it was read (`None`: never yet).
    last: std::sync::Mutex<(Option<std::time::Instant>, String)>,
    /// A read is under way: no second one starts meanwhile.
    reading: std::sync::atomic::AtomicBool,
    registry: Registry,
    live: Family<StateLabel, Gauge>,
    queue: Gauge,
    runners: Gauge,
    slots: Gauge,
    slots_in_use: Gauge,
    errored: Gauge,
    coordinators: Gauge,
}

impl Default for ClusterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ClusterMetrics {
    pub fn new() -> Self {
        // `turnpike_cluster_*`: served beside each role's own metrics (`turnpike up` serves them
        // all on one listener), the cluster's gauges never share a name with a role's.
        let mut registry = Registry::with_prefix("turnpike_cluster");
        let live = Family::<StateLabel, Gauge>::default();
        let (queue, runners, slots, slots_in_use, errored, coordinators) = (
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
            Gauge::default(),
        );
        registry.register("live_turns", "Turns not yet ended, by state", live.clone());
        registry.register(
            "work_queue_depth",
            "Attempts waiting for a runner",
            queue.clone(),
        );
        registry.register("runners", "Runners with a presence record", runners.clone());
        registry.register(
            "runner_slots",
            "Attempt slots of all runners",
            slots.clone(),
        );
        registry.register(
            "runner_slots_in_use",
            "Attempt slots in use",
            slots_in_use.clone(),
        );
        registry.register(
            "errored_chats",
            "Chats flagged errored for operators",
            errored.clone(),
        );
        registry.register(
            "coordinators",
            "Coordinators answering the ops service",
            coordinators.clone(),
        );
        ClusterMetrics {
            last: std::sync::Mutex::new((None, String::new())),
            reading: std::sync::atomic::AtomicBool::new(false),
            registry,
            live,
            queue,
            runners,
            slots,
            slots_in_use,
            errored,
            coordinators,
        }
    }

    /// The gauges as last read; if they are older than [`REFRESH`] (or were never read), one
    /// read starts in the background, and a later scrape sees it.
    pub fn cached(self: &std::sync::Arc<Self>, bus: &turnpike_store::Bus) -> String {
        use std::sync::atomic::Ordering;
        let (stale, text) = {
            let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            (
                last.0.is_none_or(|t| t.elapsed() >= REFRESH),
                last.1.clone(),
            )
        };
        if stale && !self.reading.swap(true, Ordering::SeqCst) {
            let (me, bus) = (self.clone(), bus.clone());
            tokio::spawn(async move {
                match me.read(&bus).await {
                    Ok(text) => {
                        *me.last.lock().unwrap_or_else(|p| p.into_inner()) =
                            (Some(std::time::Instant::now()), text)
                    }
                    Err(e) => tracing::warn!(error = %e, "cluster gauges not read"),
                }
                me.reading.store(false, Ordering::SeqCst);
            });
        }
        text
    }

    /// Read the cluster now (the one place a whole scan happens, at most once per [`REFRESH`]).
    async fn read(&self, bus: &turnpike_store::Bus) -> Result<String, DashboardError> {
        let o = crate::read::overview(bus).await?;
        self.live.clear();
        for s in ["waiting", "queued", "running", "pending_retry"] {
            self.live
                .get_or_create(&StateLabel {
                    state: s.to_owned(),
                })
                .set(0);
        }
        for (s, n) in &o.cluster.live {
            self.live
                .get_or_create(&StateLabel {
                    state: s.as_str().to_owned(),
                })
                .set(*n as i64);
        }
        self.queue.set(o.cluster.queue_depth as i64);
        self.runners.set(o.cluster.runners as i64);
        self.slots.set(i64::from(o.cluster.slots));
        self.slots_in_use.set(i64::from(o.cluster.slots_in_use));
        self.errored.set(o.cluster.errored_chats as i64);
        self.coordinators.set(o.coordinators as i64);
        let mut out = String::new();
        encode(&mut out, &self.registry).map_err(|e| DashboardError::Read {
            what: "metrics".into(),
            why: e.to_string(),
        })?;
        Ok(out)
    }
}

/// What a role's `/metrics` shows: its text exposition, made when scraped.
pub type Render = std::sync::Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// Serve `render` as `/metrics` on `listener` until `shutdown`: a role's own metrics endpoint
/// (`metrics_listen`).
pub async fn serve_role_metrics(
    listener: tokio::net::TcpListener,
    render: Render,
    shutdown: tokio_util::sync::CancellationToken,
) -> Result<(), DashboardError> {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let render = render.clone();
            async move {
                match render() {
                    Ok(text) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
                    Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e).into_response(),
                }
            }
        }),
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(DashboardError::Serve)
}

/// The Prometheus text format's content type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
