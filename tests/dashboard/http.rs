//! The dashboard's HTTP checks without a browser: login, sessions, CSRF and origin, headers,
//! and HTTPS with a certificate.

use super::*;

/// What a browser cannot forge, over plain HTTP: a POST from another origin or with another
/// session's token is refused, pages need a login, logins are rate-limited, and every answer
/// carries the security headers.
#[tokio::test]
async fn the_dashboards_http_checks_hold() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let (base, stop) = start_dashboard(&p).await;
    let hung = send(&p.bus, "checks", "m-1", "hang").await;
    wait_state(&p.bus, &hung, TurnState::Running).await;

    // Without a login: pages go to the login, live fragments and events get 401, POSTs 401.
    let (status, headers, _) = http(&base, "GET", "/live", &[], "").await;
    assert_eq!(status, 303);
    assert!(headers
        .iter()
        .any(|(k, v)| k == "location" && v.starts_with("/login")));
    let (status, _, _) = http(&base, "GET", "/live", &[("X-Turnpike-Fragment", "1")], "").await;
    assert_eq!(status, 401);
    let (status, _, _) = http(&base, "GET", "/events", &[], "").await;
    assert_eq!(status, 401);
    let kill = format!("/turns/{hung}/kill");
    let (status, _, _) = http(&base, "POST", &kill, &[("Origin", &base)], "csrf=x").await;
    assert_eq!(status, 401);

    // Security headers on every answer, the login page included.
    let (_, headers, _) = http(&base, "GET", "/login", &[], "").await;
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let csp = header("content-security-policy").expect("a CSP");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe-inline"),
        "{csp}"
    );
    assert_eq!(header("x-frame-options").as_deref(), Some("DENY"));

    let cookie = dashboard_login(&base, OPERATOR, PASSWORD).await;
    assert!(cookie.starts_with("turnpike_session="));
    let (_, _, live) = http(&base, "GET", "/live", &[("Cookie", &cookie)], "").await;
    let token = csrf_of(&live);
    // Another origin, no origin at all, another session's token: refused, nothing happens.
    let other = dashboard_login(&base, OPERATOR, PASSWORD).await;
    let (_, _, other_page) = http(&base, "GET", "/live", &[("Cookie", &other)], "").await;
    let refusals = [
        vec![
            ("Cookie", cookie.as_str()),
            ("Origin", "http://evil.example"),
        ],
        vec![("Cookie", cookie.as_str())],
    ];
    for headers in &refusals {
        let (status, _, body) = http(&base, "POST", &kill, headers, &format!("csrf={token}")).await;
        assert_eq!(status, 403, "{headers:?}: {body}");
    }
    let (status, _, _) = http(
        &base,
        "POST",
        &kill,
        &[("Cookie", &cookie), ("Origin", &base)],
        &format!("csrf={}", csrf_of(&other_page)),
    )
    .await;
    assert_eq!(status, 403, "another session's token");
    let r = turnpike_store::turns::load(&p.bus, &hung)
        .await
        .expect("load")
        .expect("record")
        .record;
    assert!(
        r.kill.is_none() && r.state == TurnState::Running,
        "no refused POST acted"
    );
    // The right token from this origin acts.
    let (status, _, _) = http(
        &base,
        "POST",
        &kill,
        &[("Cookie", &cookie), ("Origin", &base)],
        &format!("csrf={token}"),
    )
    .await;
    assert_eq!(status, 303);
    assert_eq!(
        wait_ended(&p.bus, &hung, WAIT).await.state,
        TurnState::Killed
    );

    // A forged or expired-looking session is no session.
    let forged = cookie.replacen(OPERATOR, "admin", 1);
    let (status, _, _) = http(&base, "GET", "/live", &[("Cookie", &forged)], "").await;
    assert_eq!(status, 303);

    // Five wrong passwords from one address, then even the right one waits out the window.
    for _ in 0..turnpike_dashboard::auth::LOGIN_FAILURES_PER_WINDOW {
        let (status, _, _) = http(
            &base,
            "POST",
            "/login",
            &[("Origin", &base)],
            "user=ops&password=nope",
        )
        .await;
        assert_eq!(status, 401);
    }
    let body = format!("user={OPERATOR}&password={}", PASSWORD.replace(' ', "+"));
    let (status, _, _) = http(&base, "POST", "/login", &[("Origin", &base)], &body).await;
    assert_eq!(status, 429);

    stop.cancel();
    p.stop().await;
}

/// Given a certificate, the dashboard speaks HTTPS only, and its session cookie is `Secure`.
/// (The certificate is made by Debian's `openssl`; the client is `curl`, trusting only it.)
// curl runs blocking on this thread: the dashboard needs threads of its own meanwhile.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_serves_https_when_given_a_certificate() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let dir = tempfile::tempdir().expect("dir");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
        ])
        .args(["-addext", "subjectAltName=IP:127.0.0.1", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (Debian's openssl package) makes a certificate");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let mut config = p.config.clone();
    config.dashboard_tls_cert = Some(cert.clone());
    config.dashboard_tls_key = Some(key);
    let (base, stop) = start_dashboard_with(&p, config).await;
    let curl = |args: Vec<String>| {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "20", "--cacert"])
            .arg(&cert)
            .args(args)
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let login = curl(vec![
        "-i".into(),
        "-H".into(),
        format!("Origin: {base}"),
        "--data".into(),
        format!("user={OPERATOR}&password={}", PASSWORD.replace(' ', "+")),
        format!("{base}/login"),
    ]);
    assert!(
        login.starts_with("HTTP/1.1 303") || login.starts_with("HTTP/2 303"),
        "{login}"
    );
    let cookie = login
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .expect("a session cookie")
        .to_owned();
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    // Plain HTTP on the same port is not served.
    let plain = base.replacen("https://", "http://", 1);
    let status = Command::new("curl")
        .args([
            "-s",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
        ])
        .arg(format!("{plain}/login"))
        .output()
        .expect("curl");
    assert_ne!(
        String::from_utf8_lossy(&status.stdout),
        "200",
        "plain HTTP must not be served"
    );
    stop.cancel();
    p.stop().await;
}

/// Issue 37: an errored chat's page says why its turn died ("1 × out of memory at 64MiB") and
/// offers the concept's remedy in one confirmed step: move the chat to a profile with more
/// memory and run the turn again. The re-run answers, with the larger limit in its record.
#[tokio::test]
async fn an_errored_chat_that_ran_out_of_memory_is_moved_and_rerun_in_one_step() {
    init_logs();
    let profile = |mib: u64| turnpike_config::ProfileSettings {
        memory_limit: Some(turnpike_config::ByteSize(mib << 20)),
        ..Default::default()
    };
    let p = Pipeline::start(AGENT, |c| {
        c.max_turn_retry = 1;
        c.memory_limit = turnpike_config::ByteSize(64 << 20);
        c.profiles.insert("small".into(), profile(64));
        c.profiles.insert("large".into(), profile(512));
        c.default_profile = "small".into();
    })
    .await;
    let turn = send(&p.bus, "oom-chat", "m-1", "alloc:100").await;
    let record = wait_ended(&p.bus, &turn, WAIT).await;
    assert_eq!(record.state, TurnState::GaveUp, "{record:?}");

    let (base, stop) = start_dashboard(&p).await;
    let cookie = dashboard_login(&base, OPERATOR, PASSWORD).await;
    let (status, _, page) = http(&base, "GET", "/chats/oom-chat", &[("Cookie", &cookie)], "").await;
    assert_eq!(status, 200);
    assert!(page.contains("Why: 1 × out of memory at 64MiB"), "{page}");
    assert!(page.contains("small (the default)"), "{page}");
    assert!(
        page.contains("Move to large (512MiB) and re-run"),
        "the remedy offered: {page}"
    );
    assert!(page.contains("data-confirm"), "confirmed first: {page}");

    let body = format!(
        "csrf={}&request=r-1&profile=large&turn={turn}",
        csrf_of(&page)
    );
    let (status, headers, _) = http(
        &base,
        "POST",
        "/chats/oom-chat/remedy",
        &[("Cookie", &cookie), ("Origin", &base)],
        &body,
    )
    .await;
    assert_eq!(status, 303);
    let location = headers
        .iter()
        .find(|(k, _)| k == "location")
        .map(|(_, v)| v.clone())
        .unwrap_or_default();
    assert!(location.contains("ok=true"), "{location}");
    let again: TurnId = eventually(WAIT, "the re-run", || async {
        let reruns = turnpike_store::views::reruns(&p.bus, &turn, 5).await.ok()?;
        reruns.first().map(|r| r.turn.clone())
    })
    .await;
    let record = wait_ended(&p.bus, &again, WAIT).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    assert_eq!(
        turnpike_tests::profile_used(&record, 0),
        Some(("large".into(), 512 << 20))
    );
    let (_, _, page) = http(&base, "GET", "/chats/oom-chat", &[("Cookie", &cookie)], "").await;
    assert!(page.contains("large"), "{page}");
    assert!(!page.contains("(the default)"), "moved: {page}");
    stop.cancel();
    p.stop().await;
}
