//! The operator dashboard in a real browser: headless Chromium driven through chromedriver (both
//! from Debian's packages; `tests/run.sh` installs them), against a real pipeline on a real
//! nats-server. Screenshots are saved under `target/dashboard-*.png`.

use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use turnpike_core::{TurnId, TurnState};
use turnpike_dashboard::{Access, Dashboard, SessionKey, Users};
use turnpike_testkit::{eventually, free_port};
use turnpike_tests::{
    csrf_of, dashboard_login, http, init_logs, kill_turn, send, wait_ended, wait_state, Pipeline,
    ToldTurn,
};

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");

const OPERATOR: &str = "ops";

const PASSWORD: &str = "correct horse battery staple";

/// Every wait is bounded; none of them is a claim about speed.
const WAIT: Duration = Duration::from_secs(60);

/// chromedriver on a free port in a process group of its own, killed on drop with every
/// Chromium it started (a test that panics never closes its session, and the browsers would
/// outlive it).
struct Driver(Child, u16);

impl Driver {
    async fn start() -> Driver {
        let bin = ["chromedriver", "/usr/bin/chromedriver"]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok())
            .expect("chromedriver is not installed: `apt-get install chromium chromium-driver` (tests/run.sh does it)");
        let port = free_port();
        let child = Command::new(bin)
            .process_group(0)
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
        // The group's id is chromedriver's pid; only processes this test started are in it.
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_dashboard(p: &Pipeline) -> (String, CancellationToken) {
    start_dashboard_with(p, p.config.clone()).await
}

async fn start_dashboard_with(
    p: &Pipeline,
    config: turnpike_config::Config,
) -> (String, CancellationToken) {
    turnpike_testkit::serve_dashboard(&p.bus, &config, OPERATOR, PASSWORD).await
}

async fn path(c: &Client) -> String {
    c.current_url().await.expect("url").path().to_owned()
}

/// The text of `css`, once it is on the page (after a click, the next page may still be loading).
/// Found and read in one go, again if a live re-draw replaced the element in between.
async fn text(c: &Client, css: &str) -> String {
    let c = c.clone();
    let css = css.to_owned();
    eventually(WAIT, &format!("the text of {css}"), || {
        let (c, css) = (c.clone(), css.clone());
        async move { c.find(Locator::Css(&css)).await.ok()?.text().await.ok() }
    })
    .await
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

/// The live view's count of change events received, once it is at least `min`.
async fn live_events(c: &Client, min: u64) -> Option<u64> {
    let n = c
        .execute(
            "return window.turnpikeLive ? window.turnpikeLive.events : 0;",
            vec![],
        )
        .await
        .ok()?
        .as_u64()?;
    (n >= min).then_some(n)
}

/// The live view's count of change events of one bucket it heard, once it is at least `min`.
async fn live_events_of(c: &Client, bucket: &str, min: u64) -> Option<u64> {
    let n = c
        .execute(
            "const s = window.turnpikeLive; return s && s.by[arguments[0]] || 0;",
            vec![json!(bucket)],
        )
        .await
        .ok()?
        .as_u64()?;
    (n >= min).then_some(n)
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

// The cases live in dashboard/.
#[path = "dashboard/browser.rs"]
mod browser;
#[path = "dashboard/http.rs"]
mod http;
#[path = "dashboard/replies.rs"]
mod replies;
#[path = "dashboard/security.rs"]
mod security;
