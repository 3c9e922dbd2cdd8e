//! An attempt's egress (`egress_allow`): an internal network of its own (no route out) holding
//! the agent and a proxy container, which is also on `egress_network` and opens connections to
//! the listed destinations only. Made before the agent's container, removed after it; a runner
//! removes what an earlier life of it left.

use super::run::{engine_error, is_refusal, is_status};
use super::*;
use bollard::container::LogOutput;
use bollard::models::{
    ContainerCreateBody, EndpointSettings, HostConfig, NetworkConnectRequest, NetworkCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListNetworksOptionsBuilder, LogsOptionsBuilder,
};
use futures::StreamExt;
use tracing::{info, warn};
use turnpike_config::Profile;
use turnpike_core::exit::RawExit;

/// On an attempt's proxy and network: the runner that made them.
pub const LABEL_EGRESS_RUNNER: &str = "turnpike.egress.runner";
/// The name the agent reaches its proxy by, on its network.
pub const PROXY_HOST: &str = "egress-proxy";
pub const PROXY_PORT: u16 = 3128;
/// How long the proxy may take to listen.
const READY_WITHIN: Duration = Duration::from_secs(15);
/// The proxy's own limits: it splices bytes, no more.
const PROXY_MEMORY: i64 = 64 << 20;
const PROXY_PIDS: i64 = 64;

/// One attempt's egress, to be removed after it.
pub(super) struct Egress {
    network: String,
    proxy: String,
}

/// The internal network of the attempt whose container is `agent_container`.
pub(super) fn network_of(agent_container: &str) -> String {
    format!("{agent_container}-net")
}

/// The variables every HTTP client reads for its proxy (both cases: curl reads only the lower
/// case `http_proxy`, others only upper case).
pub(super) fn proxy_env() -> Vec<String> {
    let url = format!("http://{PROXY_HOST}:{PROXY_PORT}");
    ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"]
        .iter()
        .map(|v| format!("{v}={url}"))
        .chain(["NO_PROXY=".to_owned(), "no_proxy=".to_owned()])
        .collect()
}

impl DockerBackend {
    /// Make the attempt's network and start its proxy; `Err` is how the attempt ends.
    pub(super) async fn egress_up(
        &self,
        agent_container: &str,
        profile: &Profile,
    ) -> Result<Egress, RawExit> {
        let egress = Egress {
            network: network_of(agent_container),
            proxy: format!("{agent_container}-egress"),
        };
        // Names of this very attempt: only a leftover of it can hold them.
        self.egress_down(&egress, false).await;
        let labels = HashMap::from([
            (
                LABEL_EGRESS_RUNNER.to_owned(),
                self.container.runner.to_string(),
            ),
            (
                LABEL_INSTANCE.to_owned(),
                self.container.instance.as_str().to_owned(),
            ),
        ]);
        self.docker
            .create_network(NetworkCreateRequest {
                name: egress.network.clone(),
                driver: Some("bridge".into()),
                internal: Some(true),
                labels: Some(labels.clone()),
                ..Default::default()
            })
            .await
            .map_err(|e| engine_error(format!("creating the attempt's network failed: {e}")))?;
        let up = self.start_proxy(&egress, profile, labels).await;
        if let Err(raw) = up {
            self.egress_down(&egress, false).await;
            return Err(raw);
        }
        Ok(egress)
    }

    async fn start_proxy(
        &self,
        egress: &Egress,
        profile: &Profile,
        labels: HashMap<String, String>,
    ) -> Result<(), RawExit> {
        let body = ContainerCreateBody {
            image: Some(self.egress.image.clone()),
            cmd: Some(vec![
                "egress-proxy".into(),
                "--listen".into(),
                format!("0.0.0.0:{PROXY_PORT}"),
                "--allow".into(),
                profile.egress_allow.to_string(),
            ]),
            user: Some("65534:65534".into()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                memory: Some(PROXY_MEMORY),
                memory_swap: Some(PROXY_MEMORY),
                pids_limit: Some(PROXY_PIDS),
                network_mode: Some(self.egress.network.clone()),
                cap_drop: Some(vec!["ALL".to_owned()]),
                security_opt: Some(vec!["no-new-privileges".to_owned()]),
                readonly_rootfs: Some(true),
                auto_remove: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        };
        let opts = CreateContainerOptionsBuilder::new()
            .name(&egress.proxy)
            .build();
        match self.docker.create_container(Some(opts), body).await {
            Ok(_) => {}
            Err(e) if is_refusal(&e) => {
                return Err(RawExit {
                    start_error: Some(format!(
                        "cannot create the egress proxy from image {:?} (egress_proxy_image): {e}",
                        self.egress.image
                    )),
                    ..RawExit::default()
                })
            }
            Err(e) => {
                return Err(engine_error(format!(
                    "creating the egress proxy failed: {e}"
                )))
            }
        }
        self.docker
            .connect_network(
                &egress.network,
                NetworkConnectRequest {
                    container: egress.proxy.clone(),
                    endpoint_config: Some(EndpointSettings {
                        aliases: Some(vec![PROXY_HOST.to_owned()]),
                        ..Default::default()
                    }),
                },
            )
            .await
            .map_err(|e| {
                engine_error(format!(
                    "joining the egress proxy to the attempt's network failed: {e}"
                ))
            })?;
        self.docker
            .start_container(&egress.proxy, None)
            .await
            .map_err(|e| engine_error(format!("starting the egress proxy failed: {e}")))?;
        // The agent's first connection must find it listening.
        let ready = tokio::time::timeout(READY_WITHIN, self.proxy_says_ready(&egress.proxy)).await;
        match ready {
            Ok(true) => Ok(()),
            Ok(false) => Err(engine_error(format!(
                "the egress proxy exited before it listened: {}",
                self.proxy_lines(&egress.proxy).await.join("; ")
            ))),
            Err(_) => Err(engine_error(
                "the egress proxy did not listen within 15 s".into(),
            )),
        }
    }

    /// Follow the proxy's output until it says `ready` (`false`: it ended first).
    async fn proxy_says_ready(&self, proxy: &str) -> bool {
        let opts = LogsOptionsBuilder::new()
            .follow(true)
            .stdout(true)
            .stderr(true)
            .build();
        let mut logs = self.docker.logs(proxy, Some(opts));
        let mut seen = Vec::new();
        while let Some(Ok(chunk)) = logs.next().await {
            if let LogOutput::StdOut { message } = chunk {
                seen.extend_from_slice(&message);
                if seen
                    .split(|b| *b == b'\n')
                    .any(|l| l.starts_with(b"ready "))
                {
                    return true;
                }
            }
        }
        false
    }

    /// What the proxy printed, line by line (its decisions).
    async fn proxy_lines(&self, proxy: &str) -> Vec<String> {
        let opts = LogsOptionsBuilder::new().stdout(true).stderr(true).build();
        let mut logs = self.docker.logs(proxy, Some(opts));
        let mut text = Vec::new();
        while let Some(Ok(chunk)) = logs.next().await {
            text.extend_from_slice(&chunk.into_bytes());
        }
        String::from_utf8_lossy(&text)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Remove the attempt's proxy and network; with `report`, log what the proxy refused (an
    /// agent that asked for an unlisted destination is news to its operator).
    pub(super) async fn egress_down(&self, egress: &Egress, report: bool) {
        if report {
            let lines = self.proxy_lines(&egress.proxy).await;
            let refused: Vec<&str> = lines
                .iter()
                .filter_map(|l| l.strip_prefix("refused "))
                .collect();
            let allowed = lines.iter().filter(|l| l.starts_with("allowed ")).count();
            if !refused.is_empty() {
                let mut distinct = refused.clone();
                distinct.sort_unstable();
                distinct.dedup();
                info!(
                    allowed,
                    refused = refused.len(),
                    destinations = %distinct.iter().take(10).copied().collect::<Vec<_>>().join(","),
                    "egress refused destinations not on the profile's list"
                );
            }
        }
        self.remove(&egress.proxy).await;
        if let Err(e) = self.docker.remove_network(&egress.network).await {
            if !is_status(&e, 404) {
                warn!(network = %egress.network, error = %e, "could not remove the attempt's network");
            }
        }
    }

    /// Remove the proxies and networks an earlier life of this runner left.
    pub(super) async fn reap_egress(&self) -> Result<(), BackendError> {
        let label = vec![format!("{LABEL_EGRESS_RUNNER}={}", self.container.runner)];
        for proxy in self.list(label.clone()).await? {
            self.remove(&proxy.id).await;
        }
        let filters: HashMap<&str, Vec<String>> = HashMap::from([("label", label)]);
        let networks = self
            .docker
            .list_networks(Some(
                ListNetworksOptionsBuilder::new().filters(&filters).build(),
            ))
            .await
            .map_err(|source| BackendError::Docker {
                what: "list attempt networks",
                source,
            })?;
        for n in networks {
            if let Some(name) = n.name {
                if let Err(e) = self.docker.remove_network(&name).await {
                    warn!(network = %name, error = %e, "could not remove a network left by an earlier life");
                }
            }
        }
        Ok(())
    }
}

/// The proxy's image and the network it reaches the destinations through.
#[derive(Debug, Clone)]
pub(super) struct EgressSettings {
    pub image: String,
    pub network: String,
}
