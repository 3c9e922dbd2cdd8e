//! The operator dashboard in a real browser: headless Chromium driven through chromedriver (both
//! from Debian's packages; `tests/run.sh` installs them), against a real pipeline on a real
//! nats-server. Screenshots are saved under `target/dashboard-*.png`.

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use turnpike_core::{TurnId, TurnState};
use turnpike_dashboard::{Access, Dashboard, SessionKey, Users};
use turnpike_testkit::{eventually, free_port};
use turnpike_tests::{
    csrf_of, dashboard_login, http, init_logs, kill_turn, send, wait_ended, wait_state, Pipeline,
};

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const OPERATOR: &str = "ops";
const PASSWORD: &str = "correct horse battery staple";
/// Every wait is bounded; none of them is a claim about speed.
const WAIT: Duration = Duration::from_secs(60);

/// chromedriver on a free port, killed on drop.
struct Driver(Child, u16);

impl Driver {
    async fn start() -> Driver {
        let bin = ["chromedriver", "/usr/bin/chromedriver"]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok())
            .expect("chromedriver is not installed: `apt-get install chromium chromium-driver` (tests/run.sh does it)");
        let port = free_port();
        let child = Command::new(bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start chromedriver");
        eventually(
            Duration::from_secs(30),
            "chromedriver to listen",
            || async move {
                tokio::net::TcpStream::connect(("127.0.0.1", port))
                    .await
                    .ok()
            },
        )
        .await;
        Driver(child, port)
    }

    async fn browser(&self, width: u32, height: u32) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({"args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", format!("--window-size={width},{height}")]}),
        );
        caps.insert("unhandledPromptBehavior".into(), json!("ignore"));
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.1))
            .await
            .expect("a Chromium session")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_dashboard(p: &Pipeline) -> (String, CancellationToken) {
    start_dashboard_with(p, p.config.clone(), "http").await
}

async fn start_dashboard_with(
    p: &Pipeline,
    config: turnpike_config::Config,
    scheme: &str,
) -> (String, CancellationToken) {
    let users = Users::default().with(
        OPERATOR,
        turnpike_dashboard::hash_password(PASSWORD).expect("hash"),
    );
    let access = Access {
        users,
        key: SessionKey::random().expect("key"),
        session_ttl: Duration::from_secs(3600),
    };
    let listener = Dashboard::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("{scheme}://{}", listener.local_addr().expect("addr"));
    let dashboard = Dashboard::new(p.bus.clone(), config, access).expect("dashboard");
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move { dashboard.serve(listener, t).await.expect("serve") });
    (url, token)
}

async fn path(c: &Client) -> String {
    c.current_url().await.expect("url").path().to_owned()
}

/// The text of `css`, once it is on the page (after a click, the next page may still be loading).
async fn text(c: &Client, css: &str) -> String {
    wait_for(c, css).await.text().await.expect("text")
}

/// Wait until `css` matches something on the page as it is now (no reload).
async fn wait_for(c: &Client, css: &str) -> fantoccini::elements::Element {
    let c = c.clone();
    let css = css.to_owned();
    eventually(WAIT, &format!("{css} on the page"), || {
        let (c, css) = (c.clone(), css.clone());
        async move { c.find(Locator::Css(&css)).await.ok() }
    })
    .await
}

async fn wait_gone(c: &Client, css: &str) {
    let c = c.clone();
    let css = css.to_owned();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if c.find_all(Locator::Css(&css))
            .await
            .is_ok_and(|v| v.is_empty())
        {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            let live = c
                .execute("const s = window.turnpikeLive || {}; return JSON.stringify({events: s.events, redraws: s.redraws, failures: s.failures, es: s.source && s.source.readyState, url: location.href});", vec![])
                .await;
            panic!("{css} still on the page after {WAIT:?}; live view: {live:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Marks the loaded document; `still_same_document` is true only if it was never reloaded.
async fn mark_document(c: &Client) {
    c.execute("window.__turnpike_mark = 42; return true;", vec![])
        .await
        .expect("mark");
}
async fn still_same_document(c: &Client) -> bool {
    c.execute("return window.__turnpike_mark === 42;", vec![])
        .await
        .expect("check")
        == json!(true)
}

/// Click `css`; a live re-draw may replace the element between finding and clicking it (a stale
/// element), so find it again until the click lands.
async fn click(c: &Client, css: &str) {
    let (c, css) = (c.clone(), css.to_owned());
    eventually(WAIT, &format!("a click on {css}"), || {
        let (c, css) = (c.clone(), css.clone());
        async move {
            let el = c.find(Locator::Css(&css)).await.ok()?;
            el.click().await.ok()
        }
    })
    .await;
}

async fn click_and_answer(c: &Client, css: &str, accept: bool) -> String {
    click(c, css).await;
    let c2 = c.clone();
    let question = eventually(WAIT, "the confirm dialog", || {
        let c = c2.clone();
        async move { c.get_alert_text().await.ok() }
    })
    .await;
    if accept {
        c.accept_alert().await.expect("accept");
    } else {
        c.dismiss_alert().await.expect("dismiss");
    }
    question
}

async fn screenshot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("screenshot");
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target");
    std::fs::create_dir_all(&dir).expect("target dir");
    std::fs::write(dir.join(format!("dashboard-{name}.png")), png).expect("write screenshot");
}

async fn login(c: &Client, base: &str, password: &str) {
    c.goto(&format!("{base}/login")).await.expect("login page");
    c.find(Locator::Css("input[name=user]"))
        .await
        .expect("user")
        .send_keys(OPERATOR)
        .await
        .expect("type");
    c.find(Locator::Css("input[name=password]"))
        .await
        .expect("pw")
        .send_keys(password)
        .await
        .expect("type");
    c.find(Locator::Css("button[type=submit]"))
        .await
        .expect("submit")
        .click()
        .await
        .expect("click");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_works_the_dashboard_in_a_real_browser() {
    init_logs();
    // Two attempts per turn, the default 10 s retry delay: a pending retry lasts long enough
    // to be seen, and a give-up comes after one retry.
    let p = Pipeline::start(AGENT, |c| {
        c.max_turn_retry = 2;
        c.retry_delay = Duration::from_secs(10);
    })
    .await;
    let (base, stop) = start_dashboard(&p).await;
    let driver = Driver::start().await;
    let c = driver.browser(1280, 900).await;

    // No page without a login.
    c.goto(&format!("{base}/errored")).await.expect("goto");
    assert_eq!(
        path(&c).await,
        "/login",
        "a page without login must go to the login"
    );
    login(&c, &base, "wrong").await;
    assert!(
        text(&c, "p.error").await.contains("Wrong"),
        "a wrong password is refused"
    );
    login(&c, &base, PASSWORD).await;
    wait_for(&c, "header .who").await;
    assert_eq!(text(&c, "header .who").await, OPERATOR);

    // A turn that gives up appears on the errored list without a reload.
    c.goto(&format!("{base}/errored")).await.expect("goto");
    wait_for(&c, "main p.empty").await;
    mark_document(&c).await;
    let doomed = send(&p.bus, "doomed", "m-doomed", "oom").await;
    let row = "tr[data-chat=doomed]";
    wait_for(&c, row).await;
    assert!(
        still_same_document(&c).await,
        "the errored row must appear without a reload"
    );
    assert_eq!(
        wait_state(&p.bus, &doomed, TurnState::GaveUp).await.state,
        TurnState::GaveUp
    );
    screenshot(&c, "errored").await;

    // Clear it, through its confirm dialog; recorded with the operator's name.
    let q = click_and_answer(&c, &format!("{row} button"), true).await;
    assert!(q.contains("Clear the errored flag of chat doomed"), "{q}");
    wait_gone(&c, row).await;
    let chat = turnpike_jetstream::decode_kv::<turnpike_core::wire::ChatRecord>(
        &p.bus
            .chats
            .get("doomed")
            .await
            .expect("get")
            .expect("chat record"),
    )
    .expect("decode");
    assert!(chat.errored.is_none());
    assert_eq!(chat.cleared.last().map(|a| a.by.as_str()), Some(OPERATOR));

    // Kill a hanging turn from the live list: dismissing the dialog does nothing, accepting kills.
    c.goto(&format!("{base}/live")).await.expect("goto");
    mark_document(&c).await;
    let hanging = send(&p.bus, "hanging", "m-hang", "hang").await;
    let row = format!("tr[data-turn='{hanging}'][data-state=running]");
    wait_for(&c, &row).await;
    assert!(
        still_same_document(&c).await,
        "the live row must appear without a reload"
    );
    screenshot(&c, "live").await;
    let q = click_and_answer(&c, &format!("{row} .btn-kill"), false).await;
    assert!(q.contains(&format!("Kill turn {hanging}")), "{q}");
    let r = turnpike_store::turns::load(&p.bus, &hanging)
        .await
        .expect("load")
        .expect("record")
        .record;
    assert!(r.kill.is_none(), "a dismissed dialog must not kill");
    click_and_answer(&c, &format!("{row} .btn-kill"), true).await;
    let killed = wait_ended(&p.bus, &hanging, WAIT).await;
    assert_eq!(killed.state, TurnState::Killed);
    assert_eq!(killed.kill.as_ref().map(|k| k.by.as_str()), Some(OPERATOR));
    wait_gone(&c, &format!("tr[data-turn='{hanging}']")).await;

    // The turn page shows it killed, with who; re-run it.
    c.goto(&format!("{base}/turns/{hanging}"))
        .await
        .expect("goto");
    wait_for(&c, "h1 .state-killed").await;
    assert!(text(&c, "dl.facts").await.contains(OPERATOR));
    let q = click_and_answer(&c, ".btn-re-run", true).await;
    assert!(q.contains("again"), "{q}");
    let rerun = TurnId::for_rerun(&hanging, 1);
    wait_for(&c, ".flash.ok").await;
    let again = wait_state(&p.bus, &rerun, TurnState::Running).await;
    assert_eq!(again.rerun_of.as_ref(), Some(&hanging));
    assert_eq!(
        again.created_by.as_ref().map(|a| a.by.as_str()),
        Some(OPERATOR)
    );
    kill_turn(&p.bus, &rerun).await;

    // A pending retry shows a countdown to its due time.
    c.goto(&format!("{base}/live")).await.expect("goto");
    let retried = send(&p.bus, "retried", "m-retry", "die-until:2").await;
    let countdown = wait_for(
        &c,
        &format!("tr[data-turn='{retried}'][data-state=pending_retry] .countdown"),
    )
    .await;
    let t = countdown.text().await.expect("text");
    assert!(t.starts_with("in ") || t == "due", "countdown reads {t:?}");
    assert_eq!(
        wait_ended(&p.bus, &retried, WAIT).await.state,
        TurnState::Done
    );

    // An HTML-injection message renders as text.
    let inject = send(
        &p.bus,
        "inject",
        "m-inject",
        "reply:<script>alert(1)</script>",
    )
    .await;
    wait_ended(&p.bus, &inject, WAIT).await;
    c.goto(&format!("{base}/turns/{inject}"))
        .await
        .expect("goto");
    assert_eq!(
        text(&c, "#message").await,
        "reply:<script>alert(1)</script>"
    );
    assert!(c.get_alert_text().await.is_err(), "no script ran");
    c.goto(&format!("{base}/chats/inject")).await.expect("goto");
    assert!(text(&c, "ol.history")
        .await
        .contains("<script>alert(1)</script>"));
    assert!(c.get_alert_text().await.is_err(), "no script ran");

    // A POST without the CSRF token is refused (from the dashboard's own page, logged in).
    let status = c
        .execute(
            "return fetch('/turns/' + arguments[0] + '/rerun', {method: 'POST', body: new URLSearchParams({csrf: ''})}).then(r => r.status);",
            vec![json!(inject.as_str())],
        )
        .await
        .expect("fetch");
    assert_eq!(status, json!(403));
    assert!(
        turnpike_store::turns::load(&p.bus, &TurnId::for_rerun(&inject, 1))
            .await
            .expect("load")
            .is_none()
    );

    // Narrow screens: the overview at 390 px.
    c.goto(&format!("{base}/")).await.expect("goto");
    wait_for(&c, "#done").await;
    // The give-up above, counted in the last hour (the turn gave up well before this read).
    assert_eq!(text(&c, "#gave-up").await, "1");
    screenshot(&c, "overview-1280").await;
    c.set_window_size(390, 844).await.expect("resize");
    screenshot(&c, "overview-390").await;
    let overflow = c
        .execute(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1;",
            vec![],
        )
        .await
        .expect("width");
    assert_eq!(
        overflow,
        json!(true),
        "the overview must fit 390 px without sideways scrolling"
    );

    // Logged out: pages are refused again.
    c.delete_all_cookies().await.expect("cookies");
    c.goto(&format!("{base}/live")).await.expect("goto");
    assert_eq!(path(&c).await, "/login");

    c.close().await.expect("close");
    stop.cancel();
    p.stop().await;
}

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

    // Metrics need no login and say what is live.
    let (status, _, metrics) = http(&base, "GET", "/metrics", &[], "").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("turnpike_runner_slots 2"), "{metrics}");
    assert!(metrics.contains("turnpike_coordinators 1"), "{metrics}");

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
    let (base, stop) = start_dashboard_with(&p, config, "https").await;
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
