//! An attempt's attachments, streamed from the object store to files in a spool directory, never
//! held in memory: a message may list up to `attachments_max` objects adding up to
//! `attachments_max_total_bytes`, and a runner runs `runner_slots` attempts at once, so holding
//! them would put the runner's own memory (and its other runs) at the mercy of one message.
//! The backends take the files from there: hard links for the process backend, a tar streamed
//! from disk for Docker.

use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;
use turnpike_config::Config;
use turnpike_core::wire::WorkItem;
use turnpike_store::attachments::ObjectError;
use turnpike_store::Bus;

use crate::scratch::AttemptDir;

/// One attachment on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spooled {
    /// The name the agent sees (one safe path component).
    pub name: String,
    pub path: PathBuf,
    pub len: u64,
}

/// The spool directory of one attempt (removed when dropped) and the files in it.
pub struct Spool {
    /// Held for its removal on drop.
    _dir: Option<AttemptDir>,
    pub files: Vec<Spooled>,
}

/// Why an attempt's attachments could not be had.
#[derive(Debug, thiserror::Error)]
pub enum AttachmentError {
    /// The message's attachments can never be had (too many, too large, gone): the agent
    /// cannot start, and trying again would not help.
    #[error("{0}")]
    Refused(String),
    /// The object store or the local disk failed: a death of this attempt, which a retry may
    /// not hit.
    #[error("{0}")]
    Unavailable(String),
}

/// Fetch the message's attachments into a fresh spool directory (under `scratch_dir` when set),
/// within the count and byte limits. Each object's bytes are counted as they arrive, so an
/// object larger than its metadata says is refused too, after at most one limit's worth.
pub async fn fetch(bus: &Bus, config: &Config, work: &WorkItem) -> Result<Spool, AttachmentError> {
    use AttachmentError::{Refused, Unavailable};
    let listed = &work.message.attachments;
    if listed.len() > config.attachments_max {
        return Err(Refused(format!(
            "the message lists {} attachments; the limit is {}",
            listed.len(),
            config.attachments_max
        )));
    }
    let mut spool = Spool {
        _dir: None,
        files: Vec::new(),
    };
    if listed.is_empty() {
        return Ok(spool);
    }
    let prefix = format!("turnpike-{}-{}-attachments-", work.turn, work.attempt);
    let dir = AttemptDir::make(config.scratch_dir.as_deref(), &prefix, &work.turn)
        .await
        .map_err(|e| Unavailable(format!("cannot make the attachment spool: {e}")))?;
    let max = config.attachment_max_bytes.0;
    let max_total = config.attachments_max_total_bytes.0;
    let mut total = 0u64;
    for (i, a) in listed.iter().enumerate() {
        let what = format!("attachment {:?} (object {:?})", a.name, a.object);
        let obj = turnpike_store::attachments::open(bus, &a.object)
            .await
            .map_err(|e| match e {
                ObjectError::Missing(_) => Refused(format!("{what} is not in the object store")),
                ObjectError::Bus(e) => Unavailable(format!("{what} unavailable: {e}")),
            })?;
        let declared = obj.info().size as u64;
        if declared > max {
            return Err(Refused(format!(
                "attachment {:?} is {declared} bytes; the limit is {}",
                a.name, config.attachment_max_bytes
            )));
        }
        if total + declared > max_total {
            return Err(Refused(format!(
                "the attachments add up to more than {}",
                config.attachments_max_total_bytes
            )));
        }
        // Numbered, not named: two attachments may share a name.
        let path = dir.path().join(i.to_string());
        let len = copy_bounded(obj, &path, max.min(max_total - total))
            .await
            .map_err(|e| match e {
                Copy::TooLong(limit) => Refused(format!("{what} holds more than {limit} bytes")),
                Copy::Read(e) => Unavailable(format!("{what} could not be read: {e}")),
                Copy::Write(e) => Unavailable(format!("cannot spool {what}: {e}")),
            })?;
        total += len;
        spool.files.push(Spooled {
            name: sanitize_attachment_name(&a.name),
            path,
            len,
        });
    }
    spool._dir = Some(dir);
    Ok(spool)
}

enum Copy {
    TooLong(u64),
    Read(std::io::Error),
    Write(std::io::Error),
}

/// Stream `from` into a new file at `to`, in chunks; more than `limit` bytes is an error.
async fn copy_bounded(
    mut from: impl tokio::io::AsyncRead + Unpin,
    to: &Path,
    limit: u64,
) -> Result<u64, Copy> {
    use tokio::io::AsyncReadExt;
    let mut file = tokio::fs::File::create(to).await.map_err(Copy::Write)?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut len = 0u64;
    loop {
        let n = from.read(&mut buf).await.map_err(Copy::Read)?;
        if n == 0 {
            break;
        }
        len += n as u64;
        if len > limit {
            return Err(Copy::TooLong(limit));
        }
        file.write_all(&buf[..n]).await.map_err(Copy::Write)?;
    }
    file.flush().await.map_err(Copy::Write)?;
    Ok(len)
}

/// An attachment name safe to use as one path component: no separators, no `..`, no NUL.
pub fn sanitize_attachment_name(name: &str) -> String {
    let base = name.rsplit(['/', '\\']).next().unwrap_or("");
    let cleaned: String = base
        .chars()
        .map(|c| if c.is_control() || c == ':' { '_' } else { c })
        .collect();
    let cleaned = cleaned.trim_matches('.').trim();
    if cleaned.is_empty() {
        "attachment".to_owned()
    } else {
        cleaned.chars().take(200).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_copy_stops_past_its_limit_and_keeps_what_fits() {
        let dir = tempfile::tempdir().expect("dir");
        let fits = dir.path().join("fits");
        let data = vec![7u8; 200_000];
        let n = copy_bounded(&data[..], &fits, 200_000).await;
        assert!(matches!(n, Ok(200_000)));
        assert_eq!(std::fs::read(&fits).expect("read"), data);
        let over = dir.path().join("over");
        let n = copy_bounded(&data[..], &over, 199_999).await;
        assert!(matches!(n, Err(Copy::TooLong(199_999))));
    }

    #[test]
    fn attachment_names_cannot_escape() {
        let s = sanitize_attachment_name;
        assert_eq!(s("report.pdf"), "report.pdf");
        assert_eq!(s("../../etc/passwd"), "passwd");
        assert_eq!(s("..\\..\\x.txt"), "x.txt");
        assert_eq!(s(".."), "attachment");
        assert_eq!(s("a\0b"), "a_b");
        assert_eq!(s(""), "attachment");
    }
}
