//! What goes into a run's volume: the watchdog, read out of its image, and the attachments.

use super::super::BackendError;
use bollard::Docker;
use futures::StreamExt;

/// Where the watchdog binary lies in `agent_init_image`.
const INIT_IN_IMAGE: &str = "/turnpike-agent-init";
/// The watchdog is small (a static binary of a few hundred KiB); anything far larger is not it.
const INIT_MAX_BYTES: u64 = 16 << 20;

/// Read the watchdog binary out of `image`, by exporting the image (`docker save`): no
/// container is made, so a runner killed meanwhile, or an engine refusing removals, leaves
/// nothing behind. The export is a tar of tars (one per layer, as `<id>/layer.tar` or OCI
/// `blobs/sha256/<digest>`, uncompressed either way); the file is looked for in each layer.
pub(super) async fn load_init(docker: &Docker, image: &str) -> Result<bytes::Bytes, BackendError> {
    let missing = |detail: String| BackendError::InitImage {
        image: image.to_owned(),
        detail,
    };
    // The image holds the binary and little else; anything far larger is not that image.
    let limit = INIT_MAX_BYTES * 4;
    let mut export = Vec::new();
    let mut stream = docker.export_image(image);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| missing(e.to_string()))?;
        if (export.len() + chunk.len()) as u64 > limit {
            return Err(missing(format!("the image is larger than {limit} bytes")));
        }
        export.extend_from_slice(&chunk);
    }
    let wanted = INIT_IN_IMAGE.trim_start_matches('/');
    let mut outer = tar::Archive::new(&export[..]);
    let entries = outer.entries().map_err(|e| missing(e.to_string()))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| missing(e.to_string()))?;
        if entry.header().entry_type() != tar::EntryType::Regular || entry.size() == 0 {
            continue;
        }
        let mut layer = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut layer).map_err(|e| missing(e.to_string()))?;
        // Manifests and configs are JSON, not tars: skip whatever does not read as one.
        let mut files = tar::Archive::new(&layer[..]);
        let Ok(files) = files.entries() else { continue };
        for file in files.flatten() {
            let mut file = file;
            let is_it = file
                .path()
                .is_ok_and(|p| p.to_string_lossy().trim_start_matches("./") == wanted);
            if !is_it {
                continue;
            }
            let mut init = Vec::new();
            std::io::Read::read_to_end(&mut file, &mut init).map_err(|e| missing(e.to_string()))?;
            if !init.starts_with(b"\x7fELF") {
                return Err(missing(format!("{INIT_IN_IMAGE} is not an executable")));
            }
            return Ok(bytes::Bytes::from(init));
        }
    }
    Err(missing(format!("{INIT_IN_IMAGE} is not in the image")))
}

/// A tar archive for the run's volume: `init` (the watchdog, executable by any user) and
/// `attachments/<name>` per attachment (readable by any user), packed from memory and the
/// spooled files into an unnamed temporary file and streamed from there: never more than a
/// buffer of the attachments in memory.
/// The secrets as a tar of files owned by `uid`, mode 0400, in memory (they are small).
pub(super) fn secrets_tar(secrets: &crate::secrets::Secrets, uid: u64) -> std::io::Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for s in secrets.iter() {
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o400);
        h.set_uid(uid);
        h.set_size(s.value().len() as u64);
        h.set_cksum();
        builder.append_data(&mut h, &s.name, s.value())?;
    }
    builder.into_inner()
}

pub(super) async fn run_dir_tar(
    init: bytes::Bytes,
    files: Vec<crate::attachments::Spooled>,
    workspace: Option<(std::path::PathBuf, u64)>,
) -> std::io::Result<tokio::fs::File> {
    let tar = tokio::task::spawn_blocking(move || {
        let mut builder = tar::Builder::new(tempfile::tempfile()?);
        let mut h = tar::Header::new_gnu();
        h.set_mode(0o555);
        h.set_size(init.len() as u64);
        h.set_cksum();
        builder.append_data(&mut h, "init", &init[..])?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_cksum();
        builder.append_data(&mut h, "attachments/", std::io::empty())?;
        for a in &files {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(a.len);
            h.set_cksum();
            builder.append_data(
                &mut h,
                format!("attachments/{}", a.name),
                std::fs::File::open(&a.path)?,
            )?;
        }
        // The chat's workspace, the agent's own (its user owns every entry; the runner's copy
        // may be owned by anyone).
        if let Some((dir, uid)) = &workspace {
            append_owned(&mut builder, dir, std::path::Path::new("workspace"), *uid)?;
        }
        let mut file = builder.into_inner()?;
        std::io::Seek::rewind(&mut file)?;
        Ok::<_, std::io::Error>(file)
    })
    .await
    .map_err(std::io::Error::other)??;
    Ok(tokio::fs::File::from_std(tar))
}

/// Append `dir` as `name` and everything under it (links as links), each entry owned by `uid`.
fn append_owned<W: std::io::Write>(
    builder: &mut tar::Builder<W>,
    dir: &std::path::Path,
    name: &std::path::Path,
    uid: u64,
) -> std::io::Result<()> {
    let mut h = owned(tar::EntryType::Directory, 0o700, uid, 0);
    builder.append_data(&mut h, name, std::io::empty())?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let path = name.join(entry.file_name());
        if kind.is_dir() {
            append_owned(builder, &entry.path(), &path, uid)?;
        } else if kind.is_file() {
            let mut h = owned(tar::EntryType::Regular, 0o600, uid, entry.metadata()?.len());
            builder.append_data(&mut h, &path, std::fs::File::open(entry.path())?)?;
        } else if kind.is_symlink() {
            let mut h = owned(tar::EntryType::Symlink, 0o777, uid, 0);
            builder.append_link(&mut h, &path, std::fs::read_link(entry.path())?)?;
        }
    }
    Ok(())
}

/// A header for an entry of `kind` owned by `uid` (user and group).
fn owned(kind: tar::EntryType, mode: u32, uid: u64, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(uid);
    h.set_gid(uid);
    h.set_size(size);
    h.set_cksum();
    h
}
