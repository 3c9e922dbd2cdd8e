//! A stand-in for an OpenAI-compatible model endpoint, for tests: deterministic, streaming, and
//! told by the prompt to misbehave. Std only; one thread per connection; every response closes
//! its connection.
//!
//! - `GET /stats`: `{"completions": n, "last": <the last request's messages>}`.
//! - any other `GET`: `hello from <name>` (a reachability probe).
//! - `POST /v1/chat/completions`: answers the last user message with `<name> heard: <its last
//!   line>`, as server-sent events when `"stream": true` (one event a word, then `[DONE]`), else
//!   as one JSON document. With `--key`, only `Authorization: Bearer <key>` is answered (401
//!   otherwise). A prompt containing `llm-hang` gets its headers and then nothing; `llm-drop`
//!   one event, then the connection is closed; `llm-die` one event, then the server exits;
//!   `llm-bloat`, unless the prompt also holds a retry note (`<system-note>`), one event of
//!   100 MiB on a single line (a client reading lines runs out of memory at a small limit).
//!
//! Usage: `turnpike-test-llm [--port 8080] [--name llm] [--key KEY]`.

use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BODY_MAX: usize = 4 << 20;

struct Server {
    name: String,
    key: Option<String>,
    completions: AtomicU64,
    last: Mutex<Value>,
}

fn main() {
    let mut port = 8080u16;
    let mut name = "llm".to_owned();
    let mut key = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--port" => port = v.parse().unwrap_or(port),
            "--name" => name = v,
            "--key" => key = Some(v),
            other => {
                eprintln!("turnpike-test-llm: unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    let listener = match TcpListener::bind(("0.0.0.0", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("turnpike-test-llm: listen on {port}: {e}");
            std::process::exit(1);
        }
    };
    println!("ready {name} on {port}");
    let server = Arc::new(Server {
        name,
        key,
        completions: AtomicU64::new(0),
        last: Mutex::new(Value::Null),
    });
    for conn in listener.incoming().flatten() {
        let server = server.clone();
        std::thread::spawn(move || {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
            serve(&server, conn);
        });
    }
}

fn serve(server: &Server, conn: TcpStream) {
    let Ok(write) = conn.try_clone() else { return };
    let mut out = write;
    let mut reader = BufReader::new(conn);
    let mut line = String::new();
    if reader.read_line(&mut line).is_err() {
        return;
    }
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let mut length = 0usize;
    let mut auth = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
        let (k, v) = h.split_once(':').unwrap_or((&h, ""));
        match k.trim().to_ascii_lowercase().as_str() {
            "content-length" => length = v.trim().parse().unwrap_or(0),
            "authorization" => auth = Some(v.trim().to_owned()),
            _ => {}
        }
    }
    match (method, path) {
        ("GET", "/stats") => {
            let last = server.last.lock().map(|l| l.clone()).unwrap_or(Value::Null);
            let body = json!({
                "completions": server.completions.load(Ordering::SeqCst),
                "last": last,
            });
            respond(&mut out, 200, "application/json", &body.to_string());
        }
        ("GET", _) => respond(
            &mut out,
            200,
            "text/plain",
            &format!("hello from {}\n", server.name),
        ),
        ("POST", "/v1/chat/completions") => {
            if let Some(key) = &server.key {
                if auth.as_deref() != Some(&format!("Bearer {key}")) {
                    respond(
                        &mut out,
                        401,
                        "application/json",
                        r#"{"error":{"message":"bad key"}}"#,
                    );
                    return;
                }
            }
            let mut body = vec![0u8; length.min(BODY_MAX)];
            if reader.read_exact(&mut body).is_err() {
                respond(&mut out, 400, "text/plain", "short body\n");
                return;
            }
            let Ok(request) = serde_json::from_slice::<Value>(&body) else {
                respond(&mut out, 400, "text/plain", "not JSON\n");
                return;
            };
            server.completions.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut last) = server.last.lock() {
                *last = request["messages"].clone();
            }
            complete(server, &mut out, &request);
        }
        _ => respond(&mut out, 404, "text/plain", "no such path\n"),
    }
}

fn complete(server: &Server, out: &mut TcpStream, request: &Value) {
    let prompt = request["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_owned();
    let last = prompt
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    let reply = format!("{} heard: {last}", server.name);
    if request["stream"] != json!(true) {
        let body = json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
        });
        respond(out, 200, "application/json", &body.to_string());
        return;
    }
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n";
    if out.write_all(head.as_bytes()).is_err() {
        return;
    }
    if prompt.contains("llm-bloat") && !prompt.contains("<system-note>") {
        let event = format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            "x".repeat(100 << 20)
        );
        let _ = out.write_all(event.as_bytes());
        return;
    }
    if prompt.contains("llm-hang") {
        // Headers, then nothing: bounded, so a forgotten server never outlives its test by much.
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    let words: Vec<String> = reply.split(' ').map(|w| format!("{w} ")).collect();
    for (i, w) in words.iter().enumerate() {
        let event = json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"content": w}}]});
        if out
            .write_all(format!("data: {event}\n\n").as_bytes())
            .is_err()
        {
            return;
        }
        let _ = out.flush();
        if i == 0 && prompt.contains("llm-drop") {
            let _ = out.shutdown(std::net::Shutdown::Both);
            return;
        }
        if i == 0 && prompt.contains("llm-die") {
            eprintln!("turnpike-test-llm: told to die");
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = out.write_all(b"data: [DONE]\n\n");
}

fn respond(out: &mut TcpStream, code: u16, kind: &str, body: &str) {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        _ => "Not Found",
    };
    let _ = write!(
        out,
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}
