//! Issue 33: the dashboard's login under pressure, sessions that end when they must, where a
//! login may send the browser, and no unauthenticated work. Each failed before its fix.

use super::*;

/// A dashboard whose operators come from a users file (so a test can change it), with `key`
/// and `proxies`.
async fn dashboard_from_file(
    p: &Pipeline,
    users_file: &std::path::Path,
    key: [u8; 32],
    proxies: &str,
) -> (String, CancellationToken) {
    let config = turnpike_config::Config {
        dashboard_users_file: Some(users_file.to_path_buf()),
        dashboard_trusted_proxies: Some(proxies.to_owned()),
        ..p.config.clone()
    };
    let access = Access {
        users: Users::load(users_file).expect("users"),
        key: SessionKey::new(key),
        session_ttl: Duration::from_secs(3600),
        proxies: turnpike_dashboard::auth::TrustedProxies::parse(proxies).expect("proxies"),
    };
    let listener = Dashboard::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let dashboard = Dashboard::new(p.bus.clone(), config, access).expect("dashboard");
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move { dashboard.serve(listener, t).await.expect("serve") });
    (url, token)
}

fn users_file(dir: &std::path::Path, users: &[(&str, &str)]) -> std::path::PathBuf {
    let path = dir.join("users");
    let lines: Vec<String> = users
        .iter()
        .map(|(n, pw)| {
            format!(
                "{n}:{}",
                turnpike_dashboard::hash_password(pw).expect("hash")
            )
        })
        .collect();
    std::fs::write(&path, lines.join("\n")).expect("write users");
    path
}

fn form(user: &str, password: &str) -> String {
    format!("user={user}&password={}", password.replace(' ', "+"))
}

/// Forty wrong passwords for one operator at once: every one is counted before its check,
/// so at most the window's five are checked (401) and the rest refused at once (429). (Before:
/// 36 × 401, all checked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_wrong_passwords_are_counted_before_they_are_checked() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let (base, stop) = start_dashboard(&p).await;
    let tries = (0..40).map(|_| {
        let base = base.clone();
        async move {
            http(
                &base,
                "POST",
                "/login",
                &[("Origin", &base)],
                &form(OPERATOR, "nope"),
            )
            .await
            .0
        }
    });
    let statuses = futures::future::join_all(tries).await;
    let checked = statuses.iter().filter(|s| **s == 401).count();
    let refused = statuses.iter().filter(|s| **s == 429).count();
    assert!(
        checked <= turnpike_dashboard::auth::LOGIN_FAILURES_PER_WINDOW as usize,
        "{checked} passwords checked: {statuses:?}"
    );
    assert_eq!(checked + refused, 40, "{statuses:?}");
    stop.cancel();
    p.stop().await;
}

/// Behind a trusted proxy each client's own address counts: one operator's failures do not
/// lock out another sharing the proxy; a name is limited whatever the addresses; and a
/// forwarded address from anyone but the proxy is ignored.
#[tokio::test]
async fn logins_are_limited_per_client_behind_a_trusted_proxy_and_per_name() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let dir = tempfile::tempdir().expect("dir");
    let file = users_file(dir.path(), &[("ops", "pw-ops"), ("alice", "pw-alice")]);
    let (base, stop) = dashboard_from_file(&p, &file, [3; 32], "127.0.0.1").await;
    let login = |xff: String, user: &'static str, pw: &'static str| {
        let base = base.clone();
        async move {
            http(
                &base,
                "POST",
                "/login",
                &[("Origin", &base), ("X-Forwarded-For", &xff)],
                &form(user, pw),
            )
            .await
            .0
        }
    };
    // ops fails five times from 198.51.100.1: that client is locked out...
    for _ in 0..turnpike_dashboard::auth::LOGIN_FAILURES_PER_WINDOW {
        assert_eq!(login("198.51.100.1".into(), "ops", "nope").await, 401);
    }
    assert_eq!(login("198.51.100.1".into(), "ops", "pw-ops").await, 429);
    // ... alice behind the same proxy is not.
    assert_eq!(login("198.51.100.2".into(), "alice", "pw-alice").await, 303);
    // One name from many addresses: twenty failures, then that name waits too.
    let per_name = turnpike_dashboard::auth::LOGIN_NAME_FAILURES_PER_WINDOW;
    for i in 5..per_name {
        assert_eq!(login(format!("203.0.113.{i}"), "ops", "nope").await, 401);
    }
    assert_eq!(login("203.0.113.200".into(), "ops", "pw-ops").await, 429);
    stop.cancel();
    // Without the proxy trusted, the header is nobody's word: 127.0.0.1 is the client.
    let (base, stop) = dashboard_from_file(&p, &file, [4; 32], "").await;
    for i in 0..turnpike_dashboard::auth::LOGIN_FAILURES_PER_WINDOW {
        let (status, _, _) = http(
            &base,
            "POST",
            "/login",
            &[
                ("Origin", &base),
                ("X-Forwarded-For", &format!("192.0.2.{i}")),
            ],
            &form("alice", "nope"),
        )
        .await;
        assert_eq!(status, 401);
    }
    let (status, _, _) = http(
        &base,
        "POST",
        "/login",
        &[("Origin", &base), ("X-Forwarded-For", "192.0.2.99")],
        &form("alice", "pw-alice"),
    )
    .await;
    assert_eq!(status, 429, "a spoofed header escaped the limit");
    stop.cancel();
    p.stop().await;
}

/// A removed operator loses access at once, one with a new password too, and a logout ends its
/// session on every dashboard sharing the key (before: the cookie lived on until it expired).
#[tokio::test]
async fn sessions_end_with_their_operator_and_at_logout_everywhere() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let dir = tempfile::tempdir().expect("dir");
    let file = users_file(dir.path(), &[("ops", "pw-ops"), ("alice", "pw-alice")]);
    let (a, stop_a) = dashboard_from_file(&p, &file, [5; 32], "").await;
    let (b, stop_b) = dashboard_from_file(&p, &file, [5; 32], "").await;
    let page = |base: String, cookie: String| async move {
        http(&base, "GET", "/live", &[("Cookie", &cookie)], "")
            .await
            .0
    };
    // Logout on A: the old cookie is refused by A at once, and by B once it hears.
    let ops = dashboard_login(&a, "ops", "pw-ops").await;
    assert_eq!(page(a.clone(), ops.clone()).await, 200);
    assert_eq!(
        page(b.clone(), ops.clone()).await,
        200,
        "B accepts A's session"
    );
    let (_, _, live) = http(&a, "GET", "/live", &[("Cookie", &ops)], "").await;
    let (status, _, _) = http(
        &a,
        "POST",
        "/logout",
        &[("Cookie", &ops), ("Origin", &a)],
        &format!("csrf={}", csrf_of(&live)),
    )
    .await;
    assert_eq!(status, 303);
    assert_eq!(
        page(a.clone(), ops.clone()).await,
        303,
        "A still accepts it"
    );
    eventually(WAIT, "B to refuse the logged-out session", || {
        let (b, ops) = (b.clone(), ops.clone());
        async move { (page(b, ops).await == 303).then_some(()) }
    })
    .await;
    // alice is removed from the file: her session ends at once.
    let alice = dashboard_login(&a, "alice", "pw-alice").await;
    assert_eq!(page(a.clone(), alice.clone()).await, 200);
    // (A new modification time, whatever the file system's clock granularity.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    users_file(dir.path(), &[("ops", "pw-ops")]);
    eventually(WAIT, "a removed operator's session refused", || {
        let (a, alice) = (a.clone(), alice.clone());
        async move { (page(a, alice).await == 303).then_some(()) }
    })
    .await;
    stop_a.cancel();
    stop_b.cancel();
    p.stop().await;
}

/// After a login, the browser goes only to a page this dashboard serves: `/%09/evil.com`
/// (a tab browsers strip, making `//evil.com`) passed the old check.
#[tokio::test]
async fn a_login_sends_the_browser_only_to_a_page_of_this_dashboard() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let (base, stop) = start_dashboard(&p).await;
    for evil in [
        "/%09/evil.com",
        "//evil.com",
        "/%5Cevil.com",
        "/%0A/evil.com",
        "https://evil.com",
    ] {
        let (status, _, page) = http(&base, "GET", &format!("/login?next={evil}"), &[], "").await;
        assert_eq!(status, 200);
        assert!(
            page.contains(r#"name="next" value="/""#),
            "{evil}: the form's next is not the overview"
        );
        let body = format!("{}&next={evil}", form(OPERATOR, PASSWORD));
        let (status, headers, _) = http(&base, "POST", "/login", &[("Origin", &base)], &body).await;
        assert_eq!(status, 303);
        let location = headers
            .iter()
            .find(|(k, _)| k == "location")
            .map(|(_, v)| v.clone());
        assert_eq!(location.as_deref(), Some("/"), "{evil}");
    }
    // A page of its own is kept.
    let body = format!("{}&next=/live%3Fpage%3D2", form(OPERATOR, PASSWORD));
    let (_, headers, _) = http(&base, "POST", "/login", &[("Origin", &base)], &body).await;
    assert!(headers
        .iter()
        .any(|(k, v)| k == "location" && v == "/live?page=2"));
    stop.cancel();
    p.stop().await;
}

/// The public listener does no work for strangers: no `/metrics` there (before: 200 and a scan
/// of every chat and live turn, per request, without a login). The gauges are for
/// `metrics_listen`.
#[tokio::test]
async fn the_public_listener_serves_no_metrics() {
    init_logs();
    let p = Pipeline::start(AGENT, |_| {}).await;
    let (base, stop) = start_dashboard(&p).await;
    let (status, _, body) = http(&base, "GET", "/metrics", &[], "").await;
    assert_ne!(status, 200, "{body}");
    assert!(!body.contains("turnpike_"), "{body}");
    stop.cancel();
    p.stop().await;
}
