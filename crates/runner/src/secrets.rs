//! Secrets given to agents (`agent_secrets`, read from `secrets_dir`): read at every attempt, so
//! a rotated file is used from the next attempt on with no restart; handed to the run as files
//! and, where asked, as environment variables (by the backends); and taken out of everything the
//! runner hears from the agent (its messages, status lines, verdict and logs) before it lands, is
//! logged or is recorded, since an agent may print its key by mistake (an HTTP library's error
//! with its headers). A value is never in a log line, an error or a `Debug` output of this
//! module's types.

use std::borrow::Cow;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use turnpike_config::AgentSecret;

/// The largest secret: keys and tokens, not files.
pub const SECRET_MAX_BYTES: u64 = 64 * 1024;

/// Values shorter than this are not taken out of what agents print: too likely to occur by
/// chance, and taking them out would garble replies.
pub const REDACT_MIN: usize = 8;

/// A secret that cannot be given to an attempt: the attempt could not start. Says which secret
/// and why, never its value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret {name} cannot be read from secrets_dir {}: {kind}", dir.display())]
    Unreadable {
        name: String,
        dir: PathBuf,
        kind: std::io::ErrorKind,
    },
    #[error("secret {name} is {len} bytes; a secret is at most {SECRET_MAX_BYTES} bytes")]
    TooLarge { name: String, len: u64 },
    #[error(
        "secret {name} is to be the variable {env}, but a variable cannot hold it (not UTF-8, or a NUL byte)"
    )]
    NotForEnv { name: String, env: String },
}

/// One secret, read.
pub struct Secret {
    /// Its name: the file's in `secrets_dir` and in the agent's secrets directory.
    pub name: String,
    /// The variable that also holds it.
    pub env: Option<String>,
    value: Vec<u8>,
}

impl Secret {
    /// The file's bytes, as the agent gets them.
    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// What the variable holds: the file without its trailing newline (`None` if it is not
    /// UTF-8 or holds a NUL byte).
    pub fn env_value(&self) -> Option<&str> {
        std::str::from_utf8(&self.value)
            .ok()
            .map(|v| v.trim_end_matches(['\n', '\r']))
            .filter(|v| !v.contains('\0'))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("env", &self.env)
            .field("len", &self.value.len())
            .finish_non_exhaustive()
    }
}

/// The secrets of one attempt.
#[derive(Debug, Clone, Default)]
pub struct Secrets(Arc<Vec<Secret>>);

impl Secrets {
    /// Read `wanted` from `dir` (blocking file reads, off the runtime's workers).
    pub async fn read(dir: &Path, wanted: &[AgentSecret]) -> Result<Secrets, SecretError> {
        if wanted.is_empty() {
            return Ok(Secrets::default());
        }
        let (dir, wanted) = (dir.to_path_buf(), wanted.to_vec());
        tokio::task::spawn_blocking(move || Self::read_now(&dir, &wanted))
            .await
            .unwrap_or_else(|e| {
                Err(SecretError::Unreadable {
                    name: "(all)".into(),
                    dir: PathBuf::new(),
                    kind: std::io::Error::other(e).kind(),
                })
            })
    }

    fn read_now(dir: &Path, wanted: &[AgentSecret]) -> Result<Secrets, SecretError> {
        use std::io::Read;
        let mut out = Vec::with_capacity(wanted.len());
        for w in wanted {
            let unreadable = |e: std::io::Error| SecretError::Unreadable {
                name: w.name.clone(),
                dir: dir.to_path_buf(),
                kind: e.kind(),
            };
            let file = std::fs::File::open(dir.join(&w.name)).map_err(unreadable)?;
            let len = file.metadata().map_err(unreadable)?.len();
            if len > SECRET_MAX_BYTES {
                return Err(SecretError::TooLarge {
                    name: w.name.clone(),
                    len,
                });
            }
            let mut value = Vec::with_capacity(len as usize);
            // A file that grows while read is cut at the bound and refused as too large.
            file.take(SECRET_MAX_BYTES + 1)
                .read_to_end(&mut value)
                .map_err(unreadable)?;
            if value.len() as u64 > SECRET_MAX_BYTES {
                return Err(SecretError::TooLarge {
                    name: w.name.clone(),
                    len: value.len() as u64,
                });
            }
            let secret = Secret {
                name: w.name.clone(),
                env: w.env.clone(),
                value,
            };
            if let Some(env) = &secret.env {
                if secret.env_value().is_none() {
                    return Err(SecretError::NotForEnv {
                        name: w.name.clone(),
                        env: env.clone(),
                    });
                }
            }
            out.push(secret);
        }
        Ok(Secrets(Arc::new(out)))
    }

    /// The secrets, in the configured order.
    pub fn iter(&self) -> impl Iterator<Item = &Secret> {
        self.0.iter()
    }

    /// None at all?
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What takes these secrets out of text.
    pub fn redactor(&self) -> Redactor {
        Redactor::new(self.iter().map(|s| (s.name.as_str(), s.value.as_slice())))
    }
}

/// Takes secret values out of text: each one (as text: the file without its trailing newline)
/// becomes `[secret <name>]`.
#[derive(Clone, Default)]
pub struct Redactor {
    /// (value, what replaces it), longest value first: one that holds another goes first.
    needles: Vec<(String, String)>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.needles.len())
            .finish()
    }
}

impl Redactor {
    /// A redactor of `secrets` (name, value). Values under [`REDACT_MIN`] bytes, or not text,
    /// are left alone.
    pub fn new<'a>(secrets: impl Iterator<Item = (&'a str, &'a [u8])>) -> Self {
        let mut needles: Vec<(String, String)> = secrets
            .filter_map(|(name, value)| {
                let text = std::str::from_utf8(value)
                    .ok()?
                    .trim_end_matches(['\n', '\r']);
                (text.len() >= REDACT_MIN).then(|| (text.to_owned(), format!("[secret {name}]")))
            })
            .collect();
        needles.sort_by_key(|n| std::cmp::Reverse(n.0.len()));
        Redactor { needles }
    }

    /// Nothing to take out?
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// `text` with every secret value replaced.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        let mut out = Cow::Borrowed(text);
        for (value, placeholder) in &self.needles {
            if out.contains(value.as_str()) {
                out = Cow::Owned(out.replace(value.as_str(), placeholder));
            }
        }
        out
    }

    /// [`Redactor::redact`] of an owned string, moved through when nothing is replaced.
    pub fn redact_owned(&self, text: String) -> String {
        match self.redact(&text) {
            Cow::Borrowed(_) => text,
            Cow::Owned(changed) => changed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn redactor(secrets: &[(&str, &str)]) -> Redactor {
        Redactor::new(secrets.iter().map(|(n, v)| (*n, v.as_bytes())))
    }

    #[test]
    fn values_become_their_names_and_short_ones_stay() {
        let r = redactor(&[
            ("key", "sk-abcdef0123456789\n"),
            ("pin", "1234"),
            ("long", "sk-abcdef0123456789-and-more"),
        ]);
        assert_eq!(
            r.redact("auth sk-abcdef0123456789-and-more / sk-abcdef0123456789 pin 1234"),
            "auth [secret long] / [secret key] pin 1234"
        );
        assert!(matches!(r.redact("nothing here"), Cow::Borrowed(_)));
        assert!(format!("{r:?}").contains("secrets: 2"));
        assert!(!format!("{r:?}").contains("sk-"));
    }

    #[tokio::test]
    async fn secrets_are_read_bounded_and_checked_for_their_variable() {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("key"), b"sk-secret-value\n").expect("write");
        std::fs::write(dir.path().join("bin"), b"\x00\xffbinary").expect("write");
        std::fs::write(
            dir.path().join("huge"),
            vec![b'x'; SECRET_MAX_BYTES as usize + 1],
        )
        .expect("write");
        let want = |list: &str| turnpike_config::parse_agent_secrets(list).expect("list");
        let read = Secrets::read(dir.path(), &want("key:API_KEY,bin"))
            .await
            .expect("read");
        let names: Vec<(&str, Option<&str>)> = read
            .iter()
            .map(|s| (s.name.as_str(), s.env_value()))
            .collect();
        assert_eq!(names, vec![("key", Some("sk-secret-value")), ("bin", None)]);
        assert!(!format!("{read:?}").contains("sk-secret"), "{read:?}");
        for (list, says) in [
            ("missing", "secret missing cannot be read"),
            ("huge", "secret huge is 65537 bytes"),
            ("bin:BIN", "secret bin is to be the variable BIN"),
        ] {
            let e = Secrets::read(dir.path(), &want(list))
                .await
                .expect_err(list)
                .to_string();
            assert!(e.contains(says), "{e}");
        }
    }

    proptest! {
        /// However a value sits in text, and whatever else is there, it is gone after.
        #[test]
        fn no_value_survives_redaction(
            value in "[a-zA-Z0-9_-]{8,40}",
            other in "[a-zA-Z0-9_-]{8,40}",
            parts in proptest::collection::vec("[ -~]{0,20}", 1..5),
        ) {
            let r = redactor(&[("a", &value), ("b", &other)]);
            let text = parts.join(&value) + &other;
            let out = r.redact(&text);
            prop_assert!(!out.contains(&value), "{out}");
            prop_assert!(!out.contains(&other), "{out}");
        }
    }
}
