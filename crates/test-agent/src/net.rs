//! The test agent's network probes (`fetch:`): HTTP through the proxy the run was given
//! (`HTTP_PROXY`), or directly when it was given none, and bare TCP connections that bypass
//! any proxy. Blocking std sockets with short time limits: a probe never hangs the agent.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

const WITHIN: Duration = Duration::from_secs(5);
/// The most of a response a probe reads.
const READ_MAX: usize = 64 * 1024;

/// One probe's outcome, as a line: `<item> -> <outcome>`.
pub fn probe(item: &str) -> String {
    let outcome = if let Some(addr) = item.strip_prefix("direct=") {
        direct(addr)
    } else if let Some(url) = item.strip_prefix("plain=") {
        fetch(url, false)
    } else {
        fetch(item, true)
    };
    format!("{item} -> {outcome}")
}

/// A TCP connection to `host:port`, past any proxy.
fn direct(addr: &str) -> String {
    let addrs = match addr.to_socket_addrs() {
        Ok(a) => a.collect::<Vec<_>>(),
        Err(_) => return "failed: no address".into(),
    };
    let mut last = "failed: no address".to_owned();
    for a in addrs {
        match TcpStream::connect_timeout(&a, WITHIN) {
            Ok(_) => return "connected".into(),
            Err(e) => last = format!("failed: {:?}", e.kind()),
        }
    }
    last
}

/// `GET url` (`http://host:port/path`): through `HTTP_PROXY` when set, by a CONNECT tunnel
/// (`tunnel`) or as a plain proxied request; `<status> <body>` or why not.
fn fetch(url: &str, tunnel: bool) -> String {
    let Some(rest) = url.strip_prefix("http://") else {
        return "failed: only http:// URLs".into();
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let proxy = std::env::var("HTTP_PROXY")
        .or_else(|_| std::env::var("http_proxy"))
        .ok();
    let result = match proxy.as_deref().and_then(|p| p.strip_prefix("http://")) {
        None => get(authority, authority, path),
        Some(proxy) => {
            let proxy = proxy.trim_end_matches('/');
            if tunnel {
                connect_then_get(proxy, authority, path)
            } else {
                get(proxy, authority, url)
            }
        }
    };
    result.unwrap_or_else(|e| format!("failed: {e}"))
}

fn open(addr: &str) -> Result<TcpStream, String> {
    let addrs: Vec<_> = addr
        .to_socket_addrs()
        .map_err(|e| format!("resolve {addr}: {e}"))?
        .collect();
    let mut last = format!("no address for {addr}");
    for a in addrs {
        match TcpStream::connect_timeout(&a, WITHIN) {
            Ok(s) => {
                let _ = s.set_read_timeout(Some(WITHIN));
                let _ = s.set_write_timeout(Some(WITHIN));
                return Ok(s);
            }
            Err(e) => last = format!("connect {addr}: {:?}", e.kind()),
        }
    }
    Err(last)
}

/// Send a GET for `target` to `via`, naming `host`; the response's status and body.
fn get(via: &str, host: &str, target: &str) -> Result<String, String> {
    let mut s = open(via)?;
    request(&mut s, host, target)
}

fn request(s: &mut TcpStream, host: &str, target: &str) -> Result<String, String> {
    write!(
        s,
        "GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("send: {e}"))?;
    let response = read_all(s)?;
    let (status, body) = split_response(&response)?;
    Ok(format!("{status} {}", body.trim()))
}

fn connect_then_get(proxy: &str, authority: &str, path: &str) -> Result<String, String> {
    let mut s = open(proxy)?;
    write!(
        s,
        "CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n"
    )
    .map_err(|e| format!("send: {e}"))?;
    // The proxy's answer, up to its blank line, byte by byte: nothing of the tunnel is read.
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => break,
        }
        if head.len() > READ_MAX {
            return Err("proxy head too long".into());
        }
    }
    let status = status_of(&head)?;
    if status != 200 {
        // The proxy's own answer: its status and what it said.
        let rest = read_all(&mut s).unwrap_or_default();
        return Ok(format!(
            "proxy {status} {}",
            String::from_utf8_lossy(&rest).trim()
        ));
    }
    request(&mut s, authority, path)
}

fn read_all(s: &mut TcpStream) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > READ_MAX {
                    return Ok(out);
                }
            }
            Err(e) if out.is_empty() => return Err(format!("read: {:?}", e.kind())),
            Err(_) => return Ok(out),
        }
    }
}

fn status_of(head: &[u8]) -> Result<u16, String> {
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("not an HTTP response: {:?}", line.trim()))
}

fn split_response(r: &[u8]) -> Result<(u16, String), String> {
    let at = r
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no response head")?;
    Ok((
        status_of(&r[..at])?,
        String::from_utf8_lossy(&r[at + 4..]).into_owned(),
    ))
}
