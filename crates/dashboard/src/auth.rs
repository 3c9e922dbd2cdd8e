//! Who may use the dashboard: operators from a users file (argon2 password hashes), sessions in a
//! signed cookie, a CSRF token bound to the session, and a login rate limit per client address.
//!
//! The session is the cookie: `<user>:<expires-ms>:<nonce>:<hmac>`, HMAC-SHA256 over the first
//! three fields with the dashboard's session key. No session table, so any number of dashboard
//! processes sharing one key accept each other's sessions, and a restart logs nobody out.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::collections::HashMap;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use crate::DashboardError;

type HmacSha256 = Hmac<Sha256>;

/// The cookie holding the session.
pub const SESSION_COOKIE: &str = "turnpike_session";

/// Operator names: letters, digits and `_ . @ -`, so a name never needs escaping in the cookie.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '@' | '-'))
}

/// Operators and their password hashes (PHC strings, as `turnpike dashboard hash-password`
/// prints them). File format: one `name:hash` per line; blank lines and `#` comments ignored.
#[derive(Debug, Clone, Default)]
pub struct Users {
    by_name: HashMap<String, String>,
}

/// What is wrong with a line of the operators file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UsersLineError {
    #[error("line {line}: expected name:hash")]
    NoColon { line: usize },
    #[error("line {line}: operator name {name:?} may use only letters, digits and _ . @ -")]
    BadName { line: usize, name: String },
    #[error("line {line}: the hash of {name} is not a PHC string (make one with `turnpike dashboard hash-password`)")]
    NotPhc { line: usize, name: String },
}

impl Users {
    pub fn load(path: &Path) -> Result<Users, DashboardError> {
        let text = std::fs::read_to_string(path).map_err(|source| DashboardError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        Users::parse(&text).map_err(|why| DashboardError::BadFile {
            path: path.to_path_buf(),
            why: why.to_string(),
        })
    }

    pub fn parse(text: &str) -> Result<Users, UsersLineError> {
        let mut by_name = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let (n, line) = (i + 1, line.trim());
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let Some((name, hash)) = line.split_once(':') else {
                return Err(UsersLineError::NoColon { line: n });
            };
            if !valid_name(name) {
                return Err(UsersLineError::BadName {
                    line: n,
                    name: name.to_owned(),
                });
            }
            if PasswordHash::new(hash).is_err() {
                return Err(UsersLineError::NotPhc {
                    line: n,
                    name: name.to_owned(),
                });
            }
            by_name.insert(name.to_owned(), hash.to_owned());
        }
        Ok(Users { by_name })
    }

    pub fn with(mut self, name: &str, phc: String) -> Users {
        self.by_name.insert(name.to_owned(), phc);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    /// True if `name` exists and `password` is its password. An unknown name costs a hash check
    /// too, so response times do not tell which names exist.
    pub fn verify(&self, name: &str, password: &str) -> bool {
        let hash = self.by_name.get(name);
        let phc = hash.map(String::as_str).unwrap_or(DUMMY_HASH);
        let ok = PasswordHash::new(phc)
            .map(|h| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
            .unwrap_or(false);
        ok && hash.is_some()
    }
}

/// A valid argon2id hash of a random password nobody knows, checked for unknown names.
const DUMMY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$6Xf0PJ7/NO3h0rDYQ3fMRtt5fMwe4qGdIS3G0ggl8kY";

/// An argon2id PHC string for `password`, with a fresh random salt.
pub fn hash_password(password: &str) -> Result<String, DashboardError> {
    let salt = SaltString::encode_b64(&random::<16>()?)
        .map_err(|e| DashboardError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| DashboardError::Hash(e.to_string()))
}

/// `N` bytes from the operating system's random source.
pub fn random<const N: usize>() -> Result<[u8; N], DashboardError> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|e| DashboardError::Random(e.to_string()))?;
    Ok(out)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A logged-in operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub user: String,
    pub expires_ms: u64,
    nonce: String,
}

/// The key sessions and CSRF tokens are signed with.
#[derive(Clone)]
pub struct SessionKey([u8; 32]);

impl SessionKey {
    pub fn new(bytes: [u8; 32]) -> Self {
        SessionKey(bytes)
    }

    pub fn random() -> Result<Self, DashboardError> {
        Ok(SessionKey(random::<32>()?))
    }

    /// A key file holds at least 32 bytes; its SHA-256 is the key (any secret text works).
    pub fn from_file(path: &Path) -> Result<Self, DashboardError> {
        use sha2::Digest;
        let bytes = std::fs::read(path).map_err(|source| DashboardError::ReadFile {
            path: path.to_path_buf(),
            source,
        })?;
        let trimmed = bytes.trim_ascii();
        if trimmed.len() < 32 {
            return Err(DashboardError::BadFile {
                path: path.to_path_buf(),
                why: "a session key needs at least 32 bytes".into(),
            });
        }
        Ok(SessionKey(Sha256::digest(trimmed).into()))
    }

    fn mac(&self, what: &str, payload: &str) -> HmacSha256 {
        // HMAC accepts keys of any length: this cannot fail.
        let mut m = <HmacSha256 as Mac>::new_from_slice(&self.0).unwrap_or_else(|_| unreachable!());
        m.update(what.as_bytes());
        m.update(b"\0");
        m.update(payload.as_bytes());
        m
    }

    /// A new session cookie value for `user`, valid for `ttl` from `now_ms`.
    pub fn issue(&self, user: &str, now_ms: u64, ttl: Duration) -> Result<String, DashboardError> {
        let expires = now_ms.saturating_add(ttl.as_millis() as u64);
        let payload = format!("{user}:{expires}:{}", hex(&random::<12>()?));
        let tag = hex(&self.mac("session", &payload).finalize().into_bytes());
        Ok(format!("{payload}:{tag}"))
    }

    /// The session a cookie value proves, if its signature holds and it has not expired.
    pub fn verify(&self, cookie: &str, now_ms: u64) -> Option<Session> {
        let (payload, tag) = cookie.rsplit_once(':')?;
        let tag = unhex(tag)?;
        self.mac("session", payload).verify_slice(&tag).ok()?;
        let mut parts = payload.splitn(3, ':');
        let user = parts.next()?;
        let expires_ms: u64 = parts.next()?.parse().ok()?;
        let nonce = parts.next()?;
        if !valid_name(user) || expires_ms <= now_ms {
            return None;
        }
        Some(Session {
            user: user.to_owned(),
            expires_ms,
            nonce: nonce.to_owned(),
        })
    }

    /// The CSRF token of a session: forms carry it, every POST must echo it.
    pub fn csrf(&self, session: &Session) -> String {
        let payload = format!("{}:{}", session.user, session.nonce);
        hex(&self.mac("csrf", &payload).finalize().into_bytes())
    }

    pub fn csrf_ok(&self, session: &Session, token: &str) -> bool {
        let Some(tag) = unhex(token) else {
            return false;
        };
        let payload = format!("{}:{}", session.user, session.nonce);
        self.mac("csrf", &payload).verify_slice(&tag).is_ok()
    }
}

/// Failed logins allowed per client address in one window; later attempts in the window are
/// refused without checking the password.
pub const LOGIN_FAILURES_PER_WINDOW: u32 = 5;
pub const LOGIN_WINDOW: Duration = Duration::from_secs(60);

/// Failed-login counts per client address (in memory: a restart forgets them, which only
/// resets the window).
#[derive(Default)]
pub struct LoginLimiter {
    failures: Mutex<HashMap<IpAddr, (u64, u32)>>,
}

impl LoginLimiter {
    /// Whether `ip` may try a password now.
    pub fn allowed(&self, ip: IpAddr, now_ms: u64) -> bool {
        let map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&ip) {
            Some((start, n)) if now_ms < start + LOGIN_WINDOW.as_millis() as u64 => {
                *n < LOGIN_FAILURES_PER_WINDOW
            }
            _ => true,
        }
    }

    pub fn failed(&self, ip: IpAddr, now_ms: u64) {
        let mut map = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        // Keep the map bounded: forget windows that have ended.
        if map.len() > 10_000 {
            map.retain(|_, (start, _)| now_ms < *start + LOGIN_WINDOW.as_millis() as u64);
        }
        let e = map.entry(ip).or_insert((now_ms, 0));
        if now_ms >= e.0 + LOGIN_WINDOW.as_millis() as u64 {
            *e = (now_ms, 0);
        }
        e.1 += 1;
    }

    pub fn succeeded(&self, ip: IpAddr) {
        self.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&ip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SessionKey {
        SessionKey::new([7; 32])
    }

    #[test]
    fn a_hashed_password_verifies_and_a_wrong_one_does_not() {
        let users = Users::default().with("ops", hash_password("s3cret").expect("hash"));
        assert!(users.verify("ops", "s3cret"));
        assert!(!users.verify("ops", "s3cret "));
        assert!(!users.verify("nobody", "s3cret"));
        // Unknown names are checked against a real hash, so they cost the same time.
        assert!(PasswordHash::new(DUMMY_HASH).is_ok());
    }

    #[test]
    fn the_users_file_is_checked_line_by_line() {
        let h = hash_password("x").expect("hash");
        let users =
            Users::parse(&format!("# operators\n\nalice:{h}\nbob@ex.org:{h}\n")).expect("ok");
        assert_eq!(users.len(), 2);
        assert_eq!(
            Users::parse("alice").expect_err("no colon"),
            UsersLineError::NoColon { line: 1 }
        );
        assert_eq!(
            Users::parse("# ops\nal ice:$argon2id$x").expect_err("name"),
            UsersLineError::BadName {
                line: 2,
                name: "al ice".into()
            }
        );
        let e = Users::parse("alice:plaintext").expect_err("hash");
        assert!(e.to_string().contains("PHC"), "{e}");
    }

    #[test]
    fn a_session_verifies_until_it_expires_and_not_after_tampering() {
        let k = key();
        let c = k
            .issue("alice", 1_000, Duration::from_secs(10))
            .expect("issue");
        let s = k.verify(&c, 5_000).expect("valid");
        assert_eq!(s.user, "alice");
        assert!(k.verify(&c, 11_000).is_none(), "expired");
        assert!(key_other().verify(&c, 5_000).is_none(), "other key");
        let forged = c.replacen("alice", "admin", 1);
        assert!(k.verify(&forged, 5_000).is_none(), "renamed");
        let longer = c.replacen(":11000:", ":99999999:", 1);
        assert!(k.verify(&longer, 5_000).is_none(), "extended");
        assert!(k.verify("garbage", 5_000).is_none());
        assert!(k.verify("a:b:c:zz", 5_000).is_none());
    }

    fn key_other() -> SessionKey {
        SessionKey::new([8; 32])
    }

    #[test]
    fn a_csrf_token_belongs_to_its_session() {
        let k = key();
        let a = k
            .verify(
                &k.issue("alice", 0, Duration::from_secs(60)).expect("issue"),
                1,
            )
            .expect("a");
        let b = k
            .verify(
                &k.issue("alice", 0, Duration::from_secs(60)).expect("issue"),
                1,
            )
            .expect("b");
        assert!(k.csrf_ok(&a, &k.csrf(&a)));
        assert!(!k.csrf_ok(&b, &k.csrf(&a)), "another session's token");
        assert!(!k.csrf_ok(&a, ""));
        assert!(!k.csrf_ok(&a, "not hex"));
    }

    #[test]
    fn logins_are_limited_per_address_and_window() {
        let l = LoginLimiter::default();
        let ip: IpAddr = [127, 0, 0, 1].into();
        let other: IpAddr = [127, 0, 0, 2].into();
        for _ in 0..LOGIN_FAILURES_PER_WINDOW {
            assert!(l.allowed(ip, 0));
            l.failed(ip, 0);
        }
        assert!(!l.allowed(ip, 1));
        assert!(l.allowed(other, 1));
        assert!(
            l.allowed(ip, LOGIN_WINDOW.as_millis() as u64),
            "a new window"
        );
        l.succeeded(ip);
        assert!(l.allowed(ip, 1));
    }
}
