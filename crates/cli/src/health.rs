//! `turnpike healthcheck`: container health checks for images with no shell or curl.
//!
//! Each check asks about *this* container's process, through the same NATS credentials the role
//! uses: a runner's presence record, which only its heartbeat renews; a coordinator's own
//! instance of the ops service; the dispatcher's consumer. For nats-server containers it reads
//! the monitoring endpoint.

use anyhow::{anyhow, bail, Context, Result};
use futures::StreamExt;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turnpike_config::Config;
use turnpike_core::subjects;
use turnpike_jetstream::now;
use turnpike_store::Bus;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Check {
    /// This runner's presence is fresh (its heartbeat renews it).
    Runner,
    /// This container's coordinator answers as an instance of the ops service.
    Coordinator,
    /// JetStream answers and the dispatcher's consumer exists.
    Dispatcher,
    /// nats-server's monitoring endpoint says healthy (`--url`).
    Nats,
    /// This container's dashboard answers `/healthz` (it is connected to NATS).
    Dashboard,
}

/// How long the whole check may take: container engines kill slower checks anyway.
const DEADLINE: Duration = Duration::from_secs(8);

/// `turnpike healthcheck`: prints the verdict; the exit code says it to the container engine.
pub async fn report(check: Check, url: &str, config: Config) -> Result<std::process::ExitCode> {
    match run(check, url, config).await {
        Ok(what) => {
            println!("healthy: {what}");
            Ok(std::process::ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("unhealthy: {}", crate::cause_chain(&e));
            Ok(std::process::ExitCode::FAILURE)
        }
    }
}

pub async fn run(check: Check, url: &str, config: Config) -> Result<String> {
    tokio::time::timeout(DEADLINE, check_once(check, url, config))
        .await
        .map_err(|_| anyhow!("no answer within {DEADLINE:?}"))?
}

async fn check_once(check: Check, url: &str, config: Config) -> Result<String> {
    match check {
        Check::Nats => http_ok(url).await,
        Check::Dashboard => {
            // A wildcard listen address is reached on loopback from inside the container.
            let listen = config
                .dashboard_listen
                .replace("0.0.0.0:", "127.0.0.1:")
                .replace("[::]:", "[::1]:");
            http_ok(&format!("http://{listen}/healthz")).await
        }
        role => check_role(role, config).await,
    }
}

/// A role's own health, through NATS with the role's credentials.
async fn check_role(check: Check, mut config: Config) -> Result<String> {
    // A health check never creates anything.
    config.manage_topology = false;
    if let Check::Runner = check {
        config = turnpike_runner::nats_identity(config)?;
    }
    let bus = Bus::connect(&config, "turnpike-healthcheck").await?;
    match check {
        Check::Runner => {
            let id = turnpike_runner::runner_id(&config);
            let presence = turnpike_store::runners::presence(&bus, &id)
                .await?
                .ok_or_else(|| anyhow!("runner {id} has no presence record"))?;
            let age = now().millis().saturating_sub(presence.at.millis());
            let limit = u64::try_from(config.lease.as_millis()).unwrap_or(u64::MAX);
            if age > limit {
                bail!("runner {id}: presence is {age} ms old (lease {limit} ms)");
            }
            Ok(format!(
                "runner {id}: presence {age} ms old, {}/{} slots in use",
                presence.slots_in_use, presence.slots
            ))
        }
        Check::Coordinator => {
            let host = turnpike_jetstream::host_name();
            let inbox = bus.client.new_inbox();
            let mut replies = bus.client.subscribe(inbox.clone()).await?;
            bus.client
                .publish_with_reply(
                    format!("$SRV.INFO.{}", subjects::OPS_SERVICE),
                    inbox,
                    "".into(),
                )
                .await?;
            bus.client.flush().await?;
            let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
            while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, replies.next()).await {
                let info: serde_json::Value = match serde_json::from_slice(&msg.payload) {
                    Ok(v) => v,
                    Err(_) => continue,
                };
                if info["metadata"]["host"].as_str() == Some(host.as_str()) {
                    return Ok(format!("coordinator on {host} answers"));
                }
            }
            bail!("no coordinator instance on {host} answered")
        }
        Check::Dispatcher => {
            bus.js
                .get_stream(subjects::STREAM_CHAT_IN)
                .await
                .context("inbound stream")?
                .consumer_info(subjects::CONSUMER_DISPATCHER)
                .await
                .context("dispatcher consumer")?;
            Ok("dispatcher: JetStream answers, consumer present".into())
        }
        Check::Nats | Check::Dashboard => bail!("not checked through NATS"),
    }
}

/// A plain HTTP/1.0 GET; healthy on status 200. Only `http://host:port/path` URLs.
async fn http_ok(url: &str) -> Result<String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow!("--url {url:?}: only http:// URLs are supported"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let mut stream = tokio::net::TcpStream::connect(authority)
        .await
        .with_context(|| format!("connect to {authority}"))?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {authority}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream
        .take(64 * 1024)
        .read_to_end(&mut response)
        .await
        .context("read the response")?;
    let text = String::from_utf8_lossy(&response);
    let status = text.lines().next().unwrap_or_default();
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default().trim();
    if status.split_whitespace().nth(1) == Some("200") {
        Ok(format!("{url}: {body}"))
    } else {
        bail!("{url}: {status} {body}")
    }
}
