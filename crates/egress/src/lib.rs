//! The egress proxy an agent reaches the outside through when its profile has an allowlist
//! (`egress_allow`). It speaks the two forms HTTP clients use with `HTTPS_PROXY`/`HTTP_PROXY`:
//! `CONNECT host:port` (a tunnel, for TLS) and a plain HTTP request in absolute form
//! (`GET http://host:port/path`, sent on as one request with `Connection: close`). A destination
//! not on the list gets `403`, whatever it resolves to; the proxy never looks at what flows in a
//! tunnel.
//!
//! The proxy decides, the network enforces: the agent's container is on an internal network
//! whose only other member is the proxy, so a connection that bypasses the proxy has nowhere to
//! go. Each connection's outcome is one [`Decision`], printed by `turnpike egress-proxy` as a
//! line the runner collects for its log.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
pub use turnpike_config::egress::{Allowlist, Destination};

/// The longest request head (request line and headers) read from an agent.
pub const HEAD_MAX: usize = 16 * 1024;
/// How long an agent may take to send its request head.
const HEAD_WITHIN: Duration = Duration::from_secs(30);
/// How long opening a connection to a destination may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);
/// Connections open at once; more are answered `503` (an agent cannot exhaust the proxy's
/// memory or file descriptors, which are its own container's anyway).
pub const CONNECTIONS_MAX: usize = 256;

/// What the proxy did with one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// A tunnel or request to a listed destination, opened.
    Allowed { host: String, port: u16 },
    /// A destination not on the list.
    Refused { host: String, port: u16 },
    /// A listed destination that could not be reached.
    Unreachable {
        host: String,
        port: u16,
        why: String,
    },
    /// Not a proxy request the proxy understands (or too large, or too slow).
    Bad { why: String },
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Allowed { host, port } => write!(f, "allowed {host}:{port}"),
            Decision::Refused { host, port } => write!(f, "refused {host}:{port}"),
            Decision::Unreachable { host, port, why } => {
                write!(f, "unreachable {host}:{port}: {why}")
            }
            Decision::Bad { why } => write!(f, "bad request: {why}"),
        }
    }
}

/// Serve proxy connections on `listener` until the task is dropped; `decided` hears every
/// connection's outcome.
pub async fn serve(
    listener: TcpListener,
    allow: Allowlist,
    decided: impl Fn(Decision) + Send + Sync + 'static,
) {
    let allow = Arc::new(allow);
    let decided = Arc::new(decided);
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    loop {
        let Ok((mut agent, _)) = listener.accept().await else {
            // Out of file descriptors, most likely: let some close.
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let _ = agent.write_all(&answer(503, "too many connections")).await;
            });
            continue;
        };
        let (allow, decided) = (allow.clone(), decided.clone());
        tokio::spawn(async move {
            let decision = handle(&mut agent, &allow).await;
            decided(decision.0);
            if let Some(upstream) = decision.1 {
                splice(agent, upstream).await;
            }
            drop(slot);
        });
    }
}

/// Read one request head, decide, and open the destination when allowed (the response to the
/// agent, or its request, already sent on).
async fn handle(agent: &mut TcpStream, allow: &Allowlist) -> (Decision, Option<TcpStream>) {
    let (head, rest) = match tokio::time::timeout(HEAD_WITHIN, read_head(agent)).await {
        Ok(Ok(h)) => h,
        Ok(Err(why)) => {
            let _ = agent.write_all(&answer(400, &why)).await;
            return (Decision::Bad { why }, None);
        }
        Err(_) => {
            let why = "no request head within 30 s".to_owned();
            let _ = agent.write_all(&answer(408, &why)).await;
            return (Decision::Bad { why }, None);
        }
    };
    let request = match Request::parse(&head) {
        Ok(r) => r,
        Err(why) => {
            let _ = agent.write_all(&answer(400, &why)).await;
            return (Decision::Bad { why }, None);
        }
    };
    let (host, port) = (request.host.clone(), request.port);
    if !allow.allows(&host, port) {
        let why = format!("{host}:{port} is not on this agent's egress allowlist");
        let _ = agent.write_all(&answer(403, &why)).await;
        return (Decision::Refused { host, port }, None);
    }
    let dial = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut upstream =
        match tokio::time::timeout(CONNECT_WITHIN, TcpStream::connect((dial.as_str(), port))).await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => return unreachable(agent, host, port, e.to_string()).await,
            Err(_) => return unreachable(agent, host, port, "no answer within 10 s".into()).await,
        };
    let sent = match &request.forward {
        // A tunnel: tell the agent it is open; what it sent after its head goes through.
        None => {
            agent
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .await
        }
        Some(head) => upstream.write_all(head).await,
    };
    if sent.is_err() || upstream.write_all(&rest).await.is_err() {
        return (
            Decision::Unreachable {
                host,
                port,
                why: "the connection closed while it was opened".into(),
            },
            None,
        );
    }
    (Decision::Allowed { host, port }, Some(upstream))
}

async fn unreachable(
    agent: &mut TcpStream,
    host: String,
    port: u16,
    why: String,
) -> (Decision, Option<TcpStream>) {
    let _ = agent
        .write_all(&answer(502, &format!("cannot reach {host}:{port}: {why}")))
        .await;
    (Decision::Unreachable { host, port, why }, None)
}

/// Copy both ways until both sides are done.
async fn splice(mut agent: TcpStream, mut upstream: TcpStream) {
    let _ = tokio::io::copy_bidirectional(&mut agent, &mut upstream).await;
}

/// The head (through its blank line) and whatever came after it in the same reads.
async fn read_head(agent: &mut TcpStream) -> Result<(Vec<u8>, Vec<u8>), String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = agent
            .read(&mut chunk)
            .await
            .map_err(|e| format!("reading the request: {e}"))?;
        if n == 0 {
            return Err("the connection closed before a whole request head".into());
        }
        let from = buf.len().saturating_sub(3);
        buf.extend_from_slice(&chunk[..n]);
        let found = find(&buf[from..], b"\r\n\r\n").map(|at| from + at + 4);
        if found.unwrap_or(buf.len()) > HEAD_MAX {
            return Err(format!("request head over {HEAD_MAX} bytes"));
        }
        if let Some(end) = found {
            let rest = buf.split_off(end);
            return Ok((buf, rest));
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A proxy request: where to, and for a plain HTTP request the head to send there.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    /// As the agent wrote it (an IPv6 address in brackets).
    host: String,
    port: u16,
    /// `None` for a tunnel; the rewritten head for a plain request.
    forward: Option<Vec<u8>>,
}

impl Request {
    fn parse(head: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(head).map_err(|_| "the head is not UTF-8".to_owned())?;
        let mut lines = text.split("\r\n");
        let line = lines.next().unwrap_or_default();
        let mut parts = line.split(' ');
        let (Some(method), Some(target), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("not a request line: {:?}", clip(line)));
        };
        if !version.starts_with("HTTP/1.") {
            return Err(format!("not HTTP/1: {:?}", clip(version)));
        }
        if method == "CONNECT" {
            let (host, port) = authority(target, None)?;
            return Ok(Request {
                host,
                port,
                forward: None,
            });
        }
        let Some(rest) = target.strip_prefix("http://") else {
            return Err(format!(
                "a proxy takes CONNECT host:port or http://host/path, not {:?}",
                clip(target)
            ));
        };
        let (auth, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        let (host, port) = authority(auth, Some(80))?;
        // The request as the destination expects it: origin form, one request per connection
        // (a second request on the same connection could name another host), and nothing meant
        // for the proxy.
        let mut out = format!("{method} {path} {version}\r\n");
        for h in lines.filter(|l| !l.is_empty()) {
            let name = h.split(':').next().unwrap_or_default().to_ascii_lowercase();
            if matches!(
                name.as_str(),
                "connection" | "proxy-connection" | "proxy-authorization" | "keep-alive"
            ) {
                continue;
            }
            out.push_str(h);
            out.push_str("\r\n");
        }
        out.push_str("Connection: close\r\n\r\n");
        Ok(Request {
            host,
            port,
            forward: Some(out.into_bytes()),
        })
    }
}

/// `host:port` (or `host` with a default port); an IPv6 host keeps its brackets.
fn authority(auth: &str, default_port: Option<u16>) -> Result<(String, u16), String> {
    let bad = || format!("not host:port: {:?}", clip(auth));
    if auth.contains('@') {
        return Err(bad());
    }
    let (host, port) = if auth.starts_with('[') {
        match auth.find(']') {
            Some(i) => (&auth[..=i], auth[i + 1..].strip_prefix(':')),
            None => return Err(bad()),
        }
    } else {
        match auth.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (auth, None),
        }
    };
    let port = match (port, default_port) {
        (Some(p), _) => p.parse().ok().filter(|p| *p > 0).ok_or_else(bad)?,
        (None, Some(d)) => d,
        (None, None) => return Err(bad()),
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

fn clip(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A short response from the proxy itself.
fn answer(code: u16, why: &str) -> Vec<u8> {
    let reason = match code {
        400 => "Bad Request",
        403 => "Forbidden",
        408 => "Request Timeout",
        502 => "Bad Gateway",
        _ => "Service Unavailable",
    };
    let body = format!("turnpike egress proxy: {why}\n");
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

#[cfg(test)]
mod tests;
