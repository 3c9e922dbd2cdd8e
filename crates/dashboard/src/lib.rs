//! `turnpike dashboard`: the operators' web pages. It keeps no state of its own: every page is
//! read from JetStream when it is asked for, live pages are re-drawn when a KV watch sees a change
//! (server-sent events), and every action is a request to the coordinators' ops service — the
//! same path as the CLI, so there is no second write path.

pub mod auth;
mod changes;
pub mod html;
pub mod metrics;
pub mod read;
mod web;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use turnpike_config::Config;
use turnpike_store::Bus;

pub use auth::{hash_password, SessionKey, Users};

#[derive(Debug, thiserror::Error)]
pub enum DashboardError {
    #[error("cannot read {path}: {source}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {why}")]
    BadFile { path: PathBuf, why: String },
    #[error("no operators: set dashboard_users_file to a file of `name:hash` lines (`turnpike dashboard hash-password` makes a hash)")]
    NoOperators,
    #[error("cannot hash a password: {0}")]
    Hash(String),
    #[error("no random numbers from the operating system: {0}")]
    Random(String),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the web server stopped: {0}")]
    Serve(#[source] std::io::Error),
    #[error("dashboard TLS: {0}")]
    Tls(String),
    #[error("cannot read {what}: {why}")]
    Read { what: String, why: String },
    #[error("{key}: {why}")]
    BadSetting { key: &'static str, why: String },
}

/// Who may log in and how sessions are signed.
pub struct Access {
    pub users: Users,
    pub key: SessionKey,
    pub session_ttl: Duration,
    /// Whose `X-Forwarded-For` names the client.
    pub proxies: auth::TrustedProxies,
}

impl Access {
    /// From the configuration: the users file (required) and the session key file (a random
    /// key when none is set: sessions then end when the dashboard restarts).
    pub fn from_config(config: &Config) -> Result<Access, DashboardError> {
        let users = match &config.dashboard_users_file {
            Some(p) => Users::load(p)?,
            None => Users::default(),
        };
        if users.is_empty() {
            return Err(DashboardError::NoOperators);
        }
        let key = match &config.dashboard_session_key_file {
            Some(p) => SessionKey::from_file(p)?,
            None => SessionKey::random()?,
        };
        let proxies =
            auth::TrustedProxies::parse(config.dashboard_trusted_proxies.as_deref().unwrap_or(""))
                .map_err(|why| DashboardError::BadSetting {
                    key: "dashboard_trusted_proxies",
                    why,
                })?;
        Ok(Access {
            users,
            key,
            session_ttl: config.dashboard_session_ttl,
            proxies,
        })
    }
}

pub struct Dashboard {
    state: Arc<web::State>,
}

impl Dashboard {
    pub fn new(bus: Bus, config: Config, access: Access) -> Result<Dashboard, DashboardError> {
        if access.users.is_empty() {
            return Err(DashboardError::NoOperators);
        }
        Ok(Dashboard {
            state: Arc::new(web::State::new(bus, config, access)),
        })
    }

    /// The cluster gauges, for this process's `metrics_listen` (as the other roles' metrics).
    pub fn metrics(&self) -> impl Fn() -> Result<String, std::fmt::Error> + Send + Sync {
        let state = self.state.clone();
        move || Ok(state.metrics.cached(&state.bus))
    }

    pub async fn bind(addr: &str) -> Result<TcpListener, DashboardError> {
        TcpListener::bind(addr)
            .await
            .map_err(|source| DashboardError::Listen {
                addr: addr.to_owned(),
                source,
            })
    }

    /// Serve on `listener` until `shutdown`.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: CancellationToken,
    ) -> Result<(), DashboardError> {
        let changes = changes::spawn(self.state.bus.clone(), shutdown.clone());
        self.state.set_changes(changes, shutdown.clone());
        tokio::spawn(web::sessions::follow(self.state.clone(), shutdown.clone()));
        let app = web::router(self.state.clone());
        if let Ok(addr) = listener.local_addr() {
            tracing::info!(%addr, "dashboard listening");
        }
        let service = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
        let tls = match (
            &self.state.config.dashboard_tls_cert,
            &self.state.config.dashboard_tls_key,
        ) {
            (Some(cert), Some(key)) => Some((cert.clone(), key.clone())),
            (None, None) => None,
            _ => {
                return Err(DashboardError::Tls(
                    "set both dashboard_tls_cert and dashboard_tls_key".into(),
                ))
            }
        };
        let Some((cert, key)) = tls else {
            return axum::serve(listener, service)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await
                .map_err(DashboardError::Serve);
        };
        // One crypto provider for the process (ring, as the NATS client uses).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let config = axum_server::tls_rustls::RustlsConfig::from_pem_file(&cert, &key)
            .await
            .map_err(|e| {
                DashboardError::Tls(format!("{} / {}: {e}", cert.display(), key.display()))
            })?;
        let handle = axum_server::Handle::new();
        let h = handle.clone();
        tokio::spawn(async move {
            shutdown.cancelled().await;
            h.graceful_shutdown(Some(Duration::from_secs(5)));
        });
        let listener = listener.into_std().map_err(DashboardError::Serve)?;
        axum_server::from_tcp_rustls(listener, config)
            .handle(handle)
            .serve(service)
            .await
            .map_err(DashboardError::Serve)
    }
}
