//! An attempt's copy of its chat's workspace: a directory on the runner, restored from the
//! chat's current version before the run, and stored at a clean exit under the attempt's own
//! object name. The store makes it the chat's only if the exit ends the turn while the attempt
//! holds the fence (`store::workspaces::save`); the runner never decides that.
//!
//! The process backend gives the agent this directory itself; the Docker backend copies it into
//! the container's `/workspace` before the start and back out after the exit.

use crate::scratch::AttemptDir;
use std::path::{Path, PathBuf};
use tracing::{info, warn};
use turnpike_core::wire::WorkItem;
use turnpike_jetstream::BusError;
use turnpike_store::Bus;

/// Bytes a tar file adds to what it holds (headers, padding), allowed on top of the limit when
/// a stored version is read.
const TAR_SLACK: u64 = 1 << 20;

/// An attempt's workspace directory and its limit.
pub(crate) struct Workspace {
    dir: AttemptDir,
    max: u64,
}

impl Workspace {
    /// A fresh directory holding the chat's workspace as `work` names it (empty when it names
    /// none, or the version is gone). `Err` only when the store did not answer: the attempt
    /// dies and may be retried, rather than run on a workspace that is not the chat's.
    pub(crate) async fn restore(
        bus: &Bus,
        scratch: Option<&Path>,
        work: &WorkItem,
        max: u64,
    ) -> Result<Workspace, BusError> {
        let prefix = format!("turnpike-ws-{}-{}-", work.turn, work.attempt);
        let dir = AttemptDir::make(scratch, &prefix, &work.turn)
            .await
            .map_err(|e| BusError::kv("make the workspace directory", e))?;
        let me = Workspace { dir, max };
        let Some(object) = &work.workspace else {
            return Ok(me);
        };
        let bytes = match turnpike_store::workspaces::get(bus, object, max + TAR_SLACK).await {
            Ok(Some(b)) => b,
            Ok(None) => {
                warn!(
                    object,
                    "the chat's workspace is gone (expired or reset); starting empty"
                );
                return Ok(me);
            }
            // Larger than this profile allows now: the agent starts without it, rather than
            // never again.
            Err(e @ BusError::Unrecoverable { .. }) => {
                warn!(object, error = %e, "the chat's workspace is over this profile's limit; starting empty");
                return Ok(me);
            }
            Err(e) => return Err(e),
        };
        let path = me.path().to_path_buf();
        let unpacked = tokio::task::spawn_blocking(move || unpack(&bytes, &path))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        if let Err(e) = unpacked {
            warn!(object, error = %e, "the chat's workspace cannot be unpacked; starting empty");
            me.clear().await;
        }
        info!(object, "workspace restored");
        Ok(me)
    }

    pub(crate) fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Empty the directory (keeping it).
    pub(crate) async fn clear(&self) {
        let path = self.path().to_path_buf();
        let _ = tokio::task::spawn_blocking(move || clear(&path)).await;
    }

    /// Store what the run left as the attempt's own version: its object name, or `None` when
    /// there is nothing to store (over the limit, or the store failed: the chat keeps the
    /// version it had, and the operator is told in the log).
    pub(crate) async fn store(&self, bus: &Bus, work: &WorkItem) -> Option<String> {
        let (path, max) = (self.path().to_path_buf(), self.max);
        let packed = tokio::task::spawn_blocking(move || pack(&path, max))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        let tar = match packed {
            Ok(Packed::Tar(t)) => t,
            Ok(Packed::Over(size)) => {
                warn!(
                    bytes = size,
                    max, "the workspace is over its limit: not saved; the chat keeps its last one"
                );
                return None;
            }
            Err(e) => {
                warn!(error = %e, "cannot pack the workspace: not saved");
                return None;
            }
        };
        let object = turnpike_store::workspaces::object_name(&work.chat, &work.turn, work.attempt);
        match turnpike_store::workspaces::put(bus, &object, &mut tar.as_slice()).await {
            Ok(bytes) => {
                info!(object, bytes, "workspace stored");
                Some(object)
            }
            Err(e) => {
                warn!(object, error = %e, "cannot store the workspace: not saved");
                None
            }
        }
    }
}

enum Packed {
    Tar(Vec<u8>),
    /// What the files add up to, over the limit.
    Over(u64),
}

/// Unpack a stored version into `dir`: paths that would leave it are refused by `tar`, and
/// neither owners nor permission bits beyond the user's are taken from the file.
fn unpack(bytes: &[u8], dir: &Path) -> std::io::Result<()> {
    let mut archive = tar::Archive::new(bytes);
    archive.set_preserve_permissions(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    archive.unpack(dir)
}

/// `dir` as a tar file, unless its files add up to more than `max` bytes. Symbolic links are
/// stored as links, never followed: an agent's link to a file of the runner's host must not
/// carry that file into the store.
fn pack(dir: &Path, max: u64) -> std::io::Result<Packed> {
    let size = size_of(dir)?;
    if size > max {
        return Ok(Packed::Over(size));
    }
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder.append_dir_all(".", dir)?;
    Ok(Packed::Tar(builder.into_inner()?))
}

/// The bytes of the regular files under `dir` (links not followed).
fn size_of(dir: &Path) -> std::io::Result<u64> {
    let mut total = 0u64;
    let mut stack: Vec<PathBuf> = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                stack.push(entry.path());
            } else if kind.is_file() {
                total = total.saturating_add(entry.metadata()?.len());
            }
        }
    }
    Ok(total)
}

/// Empty `dir`, keeping it.
pub(crate) fn clear(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(entry.path())?;
        } else {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workspace_round_trips_without_following_links_and_within_its_limit() {
        let from = tempfile::tempdir().expect("dir");
        std::fs::create_dir(from.path().join("notes")).expect("mkdir");
        std::fs::write(from.path().join("notes/today.md"), b"remember this").expect("write");
        let outside = tempfile::NamedTempFile::new().expect("file");
        std::fs::write(outside.path(), b"the host's secret").expect("write");
        std::os::unix::fs::symlink(outside.path(), from.path().join("link")).expect("link");

        let Packed::Tar(tar) = pack(from.path(), 1024).expect("pack") else {
            panic!("13 bytes are within 1 KiB");
        };
        let to = tempfile::tempdir().expect("dir");
        unpack(&tar, to.path()).expect("unpack");
        assert_eq!(
            std::fs::read(to.path().join("notes/today.md")).expect("read"),
            b"remember this"
        );
        // The link came back as a link; the host's file was never read into the tar.
        assert!(std::fs::symlink_metadata(to.path().join("link"))
            .expect("link")
            .file_type()
            .is_symlink());
        assert!(!tar.windows(17).any(|w| w == b"the host's secret"));

        assert!(matches!(
            pack(from.path(), 12).expect("pack"),
            Packed::Over(13)
        ));
    }

    #[test]
    fn an_archive_cannot_write_outside_its_directory() {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        let data = b"escaped";
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        // Written by hand: `set_path` refuses `..` itself.
        header.as_gnu_mut().expect("gnu").name[..13].copy_from_slice(b"../escaped.md");
        header.set_cksum();
        builder.append(&header, &data[..]).expect("append");
        let tar = builder.into_inner().expect("tar");
        let parent = tempfile::tempdir().expect("dir");
        let dir = parent.path().join("ws");
        std::fs::create_dir(&dir).expect("mkdir");
        let _ = unpack(&tar, &dir);
        assert!(!parent.path().join("escaped.md").exists());
    }
}
