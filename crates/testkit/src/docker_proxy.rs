//! A fault injector in front of the Docker Engine's socket: the Docker tests point a runner at
//! it (`docker_host`) and make the engine's answers to chosen requests never come back, as an
//! engine restart, a dropped socket or a client time-out does, while the engine still acts on
//! them.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

/// A Unix-socket proxy to the local Docker Engine.
pub struct DockerProxy {
    dir: tempfile::TempDir,
    rules: Arc<Mutex<Vec<Rule>>>,
    accept: tokio::task::JoinHandle<()>,
}

/// Requests whose text holds `pattern` reach the engine (`forward`) or not, and their connection
/// is then dropped: `left` more of them (`None`: all, until healed).
struct Rule {
    pattern: String,
    left: Option<usize>,
    forward: bool,
}

/// The engine's socket: `$DOCKER_HOST` if it names one, else the usual path.
fn engine_socket() -> PathBuf {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from("/var/run/docker.sock"))
}

impl DockerProxy {
    pub async fn start() -> DockerProxy {
        let dir = tempfile::tempdir().expect("a dir for the socket");
        let path = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&path).expect("bind the Docker proxy");
        let rules: Arc<Mutex<Vec<Rule>>> = Arc::default();
        let upstream = engine_socket();
        let r = rules.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (r, upstream) = (r.clone(), upstream.clone());
                tokio::spawn(async move {
                    if let Ok(engine) = UnixStream::connect(&upstream).await {
                        relay(client, engine, r).await;
                    }
                });
            }
        });
        DockerProxy { dir, rules, accept }
    }

    /// `docker_host` for a runner to use it.
    pub fn host(&self) -> String {
        format!("unix://{}", self.dir.path().join("docker.sock").display())
    }

    /// The next `n` requests whose text holds `pattern` (e.g. `/wait`, `/start`) reach the
    /// engine; their answers never come back (the connection is dropped).
    pub fn drop_answers(&self, pattern: &str, n: usize) {
        self.rule(pattern, Some(n), true);
    }

    /// Every request whose text holds `pattern` fails without reaching the engine (its
    /// connection is dropped), until [`DockerProxy::heal`].
    pub fn refuse_all(&self, pattern: &str) {
        self.rule(pattern, None, false);
    }

    pub fn heal(&self) {
        if let Ok(mut rules) = self.rules.lock() {
            rules.clear();
        }
    }

    fn rule(&self, pattern: &str, left: Option<usize>, forward: bool) {
        if let Ok(mut rules) = self.rules.lock() {
            rules.push(Rule {
                pattern: pattern.to_owned(),
                left,
                forward,
            });
        }
    }
}

impl Drop for DockerProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// What a rule does to a request.
#[derive(PartialEq)]
enum Fate {
    Pass,
    /// Forwarded; its answer dropped.
    Unanswered,
    /// Never forwarded.
    Refused,
}

/// What becomes of the request in `chunk`; counts it against the rule that takes it.
fn fate(rules: &Mutex<Vec<Rule>>, chunk: &[u8]) -> Fate {
    let Ok(mut rules) = rules.lock() else {
        return Fate::Pass;
    };
    let text = String::from_utf8_lossy(chunk);
    let Some(i) = rules.iter().position(|r| text.contains(&r.pattern)) else {
        return Fate::Pass;
    };
    let fate = if rules[i].forward {
        Fate::Unanswered
    } else {
        Fate::Refused
    };
    match &mut rules[i].left {
        None => {}
        Some(1) => {
            rules.remove(i);
        }
        Some(n) => *n -= 1,
    }
    fate
}

async fn relay(client: UnixStream, engine: UnixStream, rules: Arc<Mutex<Vec<Rule>>>) {
    let (mut cr, mut cw) = client.into_split();
    let (mut er, mut ew) = engine.into_split();
    // Set before a doomed request is forwarded: from then on nothing reaches the client.
    let muted = std::sync::atomic::AtomicBool::new(false);
    let to_engine = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                // The client closed its side (an attach's stdin ends so): pass the half-close
                // on, and keep the answers coming until the engine ends.
                Ok(0) => {
                    let _ = ew.shutdown().await;
                    std::future::pending::<()>().await;
                    return;
                }
                Err(_) => return,
                Ok(n) => n,
            };
            let fate = fate(&rules, &buf[..n]);
            if fate != Fate::Pass {
                muted.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            if fate == Fate::Refused {
                return;
            }
            if ew.write_all(&buf[..n]).await.is_err() {
                return;
            }
            if fate == Fate::Unanswered {
                // Give the engine the request, then drop the connection before any answer.
                let _ = ew.flush().await;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                return;
            }
        }
    };
    let to_client = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match er.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if muted.load(std::sync::atomic::Ordering::SeqCst) {
                continue;
            }
            if cw.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // The engine's side ending, or a dropped request, ends the connection both ways.
    tokio::select! {
        _ = to_engine => {}
        _ = to_client => {}
    }
}
