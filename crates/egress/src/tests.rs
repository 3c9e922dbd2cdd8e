use super::*;
use std::sync::Mutex;

#[test]
fn requests_parse_into_destinations_and_origin_form() {
    let r = Request::parse(b"CONNECT api.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("connect");
    assert_eq!(
        (r.host.as_str(), r.port, r.forward),
        ("api.example.com", 443, None)
    );
    let r = Request::parse(b"CONNECT [::1]:8443 HTTP/1.1\r\n\r\n").expect("v6");
    assert_eq!((r.host.as_str(), r.port), ("[::1]", 8443));
    let r = Request::parse(
        b"POST http://llm:8080/v1/chat?x=1 HTTP/1.1\r\nHost: llm:8080\r\nProxy-Connection: keep-alive\r\nConnection: keep-alive\r\nProxy-Authorization: Basic eA==\r\nContent-Length: 2\r\n\r\n",
    )
    .expect("absolute form");
    assert_eq!((r.host.as_str(), r.port), ("llm", 8080));
    assert_eq!(
        String::from_utf8(r.forward.expect("forwarded head")).expect("utf8"),
        "POST /v1/chat?x=1 HTTP/1.1\r\nHost: llm:8080\r\nContent-Length: 2\r\nConnection: close\r\n\r\n"
    );
    let r = Request::parse(b"GET http://example.com HTTP/1.0\r\n\r\n").expect("no path");
    assert_eq!(r.port, 80);
    assert!(String::from_utf8_lossy(&r.forward.expect("head")).starts_with("GET / HTTP/1.0\r\n"));
    for bad in [
        &b"GET /relative HTTP/1.1\r\n\r\n"[..],
        b"GET https://example.com/ HTTP/1.1\r\n\r\n",
        b"CONNECT example.com HTTP/1.1\r\n\r\n",
        b"CONNECT example.com:0 HTTP/1.1\r\n\r\n",
        b"CONNECT user@example.com:443 HTTP/1.1\r\n\r\n",
        b"CONNECT example.com:443 SPDY/3\r\n\r\n",
        b"CONNECT  example.com:443 HTTP/1.1\r\n\r\n",
        b"\xff\xfe\r\n\r\n",
    ] {
        assert!(
            Request::parse(bad).is_err(),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
}

/// A destination on loopback that answers each connection with what it received first,
/// prefixed, and echoes the rest.
async fn upstream() -> (u16, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    (port, task)
}

async fn proxy(allow: &str) -> (u16, Arc<Mutex<Vec<Decision>>>, tokio::task::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = l.local_addr().expect("addr").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let allow = Allowlist::parse(allow).expect("list");
    let task = tokio::spawn(serve(l, allow, move |d| log.lock().expect("log").push(d)));
    (port, seen, task)
}

/// Send `head`, then `then`, and read until the proxy or the destination closes (or `want`
/// bytes came).
async fn exchange(proxy: u16, head: &str, then: &[u8], want: usize) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", proxy))
        .await
        .expect("connect");
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(then).await.expect("then");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while got.len() < want {
        match tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!(
                "no answer in 10 s; so far {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

#[tokio::test]
async fn a_listed_destination_is_tunnelled_and_any_other_refused() {
    let (up, _u) = upstream().await;
    let (other, _o) = upstream().await;
    let (p, seen, _t) = proxy(&format!("127.0.0.1:{up},localhost:{up}")).await;

    let established = "HTTP/1.1 200 Connection established\r\n\r\n";
    let got = exchange(
        p,
        &format!("CONNECT 127.0.0.1:{up} HTTP/1.1\r\n\r\n"),
        b"ping",
        established.len() + 4,
    )
    .await;
    assert_eq!(got, format!("{established}ping"));

    let got = exchange(
        p,
        &format!("CONNECT 127.0.0.1:{other} HTTP/1.1\r\n\r\n"),
        b"ping",
        usize::MAX,
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 403 Forbidden\r\n"), "{got}");
    assert!(
        got.contains("not on this agent's egress allowlist"),
        "{got}"
    );
    assert!(
        !got.contains("ping"),
        "nothing reached the other port: {got}"
    );

    // Not by another name for the same place.
    let got = exchange(
        p,
        &format!("CONNECT [::1]:{up} HTTP/1.1\r\n\r\n"),
        b"",
        usize::MAX,
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 403"), "{got}");

    // A plain HTTP request goes on in origin form, once, with nothing meant for the proxy.
    let sent = "GET /a?b HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
    let got = exchange(
        p,
        &format!("GET http://localhost:{up}/a?b HTTP/1.1\r\nHost: localhost\r\nProxy-Authorization: x\r\n\r\n"),
        b"",
        sent.len(),
    )
    .await;
    // The echo server returns the head it was sent.
    assert_eq!(got, sent);

    let decisions: Vec<String> = seen
        .lock()
        .expect("log")
        .iter()
        .map(|d| d.to_string())
        .collect();
    assert_eq!(
        decisions,
        [
            format!("allowed 127.0.0.1:{up}"),
            format!("refused 127.0.0.1:{other}"),
            format!("refused [::1]:{up}"),
            format!("allowed localhost:{up}"),
        ]
    );
}

#[tokio::test]
async fn bad_requests_and_dead_destinations_get_an_answer() {
    // A port nothing listens on: bind, note it, close.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        l.local_addr().expect("addr").port()
    };
    let (p, seen, _t) = proxy(&format!("127.0.0.1:{closed}")).await;
    let got = exchange(
        p,
        &format!("CONNECT 127.0.0.1:{closed} HTTP/1.1\r\n\r\n"),
        b"",
        usize::MAX,
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{got}");
    let got = exchange(p, "GET /x HTTP/1.1\r\n\r\n", b"", usize::MAX).await;
    assert!(got.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{got}");
    let huge = format!(
        "CONNECT 127.0.0.1:{closed} HTTP/1.1\r\nX: {}\r\n\r\n",
        "a".repeat(HEAD_MAX)
    );
    let got = exchange(p, &huge, b"", usize::MAX).await;
    assert!(
        got.starts_with("HTTP/1.1 400") && got.contains("over 16384 bytes"),
        "{got}"
    );
    let seen = seen.lock().expect("log");
    assert!(matches!(seen[0], Decision::Unreachable { .. }), "{seen:?}");
    assert!(matches!(seen[1], Decision::Bad { .. }), "{seen:?}");
    assert!(matches!(seen[2], Decision::Bad { .. }), "{seen:?}");
}
