//! A fresh directory per attempt (its working directory, its attachment spool), made and removed
//! off the runtime's workers: directory calls block (on a journalled disk, behind I/O), and those
//! workers also drive the runner's NATS connection and its leases.

use std::path::Path;
use tracing::warn;
use turnpike_core::TurnId;

/// An attempt's working directory. Dropping it, on any way out of `run`, hands the removal to
/// the blocking pool: the exit is what the turn waits for, the removal is housekeeping that may
/// wait for the disk. Without a runtime to hand it to, it is removed here.
pub(crate) struct AttemptDir {
    /// `None` only once `drop` has taken it.
    dir: Option<tempfile::TempDir>,
    turn: TurnId,
}

impl AttemptDir {
    /// A new directory named `<prefix>…` under `parent` (the system's temporary directory when
    /// `None`), made on the blocking pool.
    pub(crate) async fn make(
        parent: Option<&Path>,
        prefix: &str,
        turn: &TurnId,
    ) -> std::io::Result<Self> {
        let (parent, prefix) = (parent.map(Path::to_path_buf), prefix.to_owned());
        let dir = tokio::task::spawn_blocking(move || {
            let mut b = tempfile::Builder::new();
            b.prefix(&prefix);
            match &parent {
                Some(parent) => b.tempdir_in(parent),
                None => b.tempdir(),
            }
        })
        .await
        .map_err(std::io::Error::other)??;
        Ok(Self::new(dir, turn.clone()))
    }

    fn new(dir: tempfile::TempDir, turn: TurnId) -> Self {
        AttemptDir {
            dir: Some(dir),
            turn,
        }
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new(""), tempfile::TempDir::path)
    }
}

impl Drop for AttemptDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        let turn = self.turn.clone();
        let remove = move || {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                warn!(turn_id = %turn, path = %path.display(), error = %e, "cannot remove the attempt's directory");
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(remove)),
            Err(_) => remove(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt_dir() -> AttemptDir {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("left-behind"), b"x").expect("file");
        let chat = turnpike_core::ChatId::new("c").expect("chat id");
        AttemptDir::new(dir, TurnId::for_message(&chat, "m"))
    }

    #[test]
    fn an_attempt_dir_is_removed_on_drop_with_or_without_a_runtime() {
        let outside = attempt_dir();
        let path = outside.path().to_path_buf();
        drop(outside);
        assert!(!path.exists(), "removed at once without a runtime");

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let inside = attempt_dir();
        let path = inside.path().to_path_buf();
        rt.block_on(async move {
            drop(inside);
            // Handed to the blocking pool: gone soon after, not necessarily at once.
            for _ in 0..500 {
                if !path.exists() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            panic!("{} still exists 5 s after the drop", path.display());
        });
    }
}
