//! Who may use the dashboard: operators from a users file (argon2 password hashes), sessions in a
//! signed cookie, a CSRF token bound to the session, and a login rate limit per client address.
//!
//! The session is the cookie: `<user>:<expires-ms>:<nonce>:<fingerprint>:<hmac>`, HMAC-SHA256
//! over the first four fields with the dashboard's session key; the fingerprint is a digest of
//! the operator's password hash when the session began. No session table, so any number of
//! dashboard processes sharing one key accept each other's sessions, and a restart logs nobody
//! out; a session ends early when its operator is removed or gets a new password (the
//! fingerprint no longer matches the users file) or logs out (its nonce is put in the
//! `turnpike_sessions` bucket, which every dashboard watches).

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

    /// A short digest of `name`'s password hash, `None` for no such operator. A session carries
    /// the one its operator had when it began: removed, or given a new password, the operator's
    /// sessions end at once.
    pub fn fingerprint(&self, name: &str) -> Option<String> {
        use sha2::Digest;
        let phc = self.by_name.get(name)?;
        Some(hex(&Sha256::digest(phc.as_bytes())[..8]))
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
    /// Unique to this session: what a logout revokes.
    pub nonce: String,
    /// The operator's [`Users::fingerprint`] when the session began.
    pub fingerprint: String,
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

    /// A new session cookie value for `user` (whose [`Users::fingerprint`] is `fingerprint`),
    /// valid for `ttl` from `now_ms`.
    pub fn issue(
        &self,
        user: &str,
        fingerprint: &str,
        now_ms: u64,
        ttl: Duration,
    ) -> Result<String, DashboardError> {
        let expires = now_ms.saturating_add(ttl.as_millis() as u64);
        let payload = format!("{user}:{expires}:{}:{fingerprint}", hex(&random::<12>()?));
        let tag = hex(&self.mac("session", &payload).finalize().into_bytes());
        Ok(format!("{payload}:{tag}"))
    }

    /// The session a cookie value proves, if its signature holds and it has not expired.
    pub fn verify(&self, cookie: &str, now_ms: u64) -> Option<Session> {
        let (payload, tag) = cookie.rsplit_once(':')?;
        let tag = unhex(tag)?;
        self.mac("session", payload).verify_slice(&tag).ok()?;
        let mut parts = payload.splitn(4, ':');
        let user = parts.next()?;
        let expires_ms: u64 = parts.next()?.parse().ok()?;
        let nonce = parts.next()?;
        let fingerprint = parts.next()?;
        if !valid_name(user) || expires_ms <= now_ms {
            return None;
        }
        Some(Session {
            user: user.to_owned(),
            expires_ms,
            nonce: nonce.to_owned(),
            fingerprint: fingerprint.to_owned(),
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
/// Failed logins allowed per operator name in one window, from any addresses: an attacker with
/// many addresses guesses no faster than this.
pub const LOGIN_NAME_FAILURES_PER_WINDOW: u32 = 20;
pub const LOGIN_WINDOW: Duration = Duration::from_secs(60);
/// Passwords checked at once (each argon2 check takes ~19 MiB and tens of milliseconds); more
/// logins at the same moment are refused at once, before any work.
pub const LOGIN_CHECKS_AT_ONCE: usize = 2;
/// Windows remembered per map: past this many live ones, further logins are refused until the
/// oldest end (a flood of addresses or names cannot grow memory).
const LOGIN_WINDOWS_MAX: usize = 10_000;

/// Why a login was refused before its password was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoginRefused {
    /// Too many failures from this address, or for this name, in the window.
    TooMany,
    /// Too many password checks under way right now.
    Busy,
}

/// One window of counted attempts: when it began, and how many failed (or may yet).
type Window = (u64, u32);

/// Login attempts per client address and per operator name (in memory: a restart forgets
/// them, which only resets the windows). Every attempt counts as a failure *before* its password
/// is checked, and only a success takes it back: attempts made at the same moment cannot all
/// pass the limit together.
pub struct LoginLimiter {
    by_address: Mutex<HashMap<IpAddr, Window>>,
    by_name: Mutex<HashMap<String, Window>>,
    checks: std::sync::Arc<tokio::sync::Semaphore>,
}

impl Default for LoginLimiter {
    fn default() -> Self {
        LoginLimiter {
            by_address: Mutex::default(),
            by_name: Mutex::default(),
            checks: std::sync::Arc::new(tokio::sync::Semaphore::new(LOGIN_CHECKS_AT_ONCE)),
        }
    }
}

/// A login attempt counted as failed until [`Attempt::succeeded`]; it holds one of the few
/// password-check slots while it lives.
pub struct Attempt<'a> {
    limiter: &'a LoginLimiter,
    ip: IpAddr,
    name: String,
    _check: tokio::sync::OwnedSemaphorePermit,
}

impl Attempt<'_> {
    /// The password was right: this attempt, and the address's earlier failures, are forgotten.
    pub fn succeeded(self) {
        lock(&self.limiter.by_address).remove(&self.ip);
        if let Some(w) = lock(&self.limiter.by_name).get_mut(&self.name) {
            w.1 = w.1.saturating_sub(1);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Count one more attempt in `key`'s window of `map`, if it stays within `max`.
fn count<K: std::hash::Hash + Eq + Clone>(
    map: &Mutex<HashMap<K, Window>>,
    key: &K,
    max: u32,
    now_ms: u64,
) -> Result<(), LoginRefused> {
    let window = LOGIN_WINDOW.as_millis() as u64;
    let mut map = lock(map);
    if map.len() >= LOGIN_WINDOWS_MAX && !map.contains_key(key) {
        map.retain(|_, (start, _)| now_ms < *start + window);
        if map.len() >= LOGIN_WINDOWS_MAX {
            return Err(LoginRefused::TooMany);
        }
    }
    let w = map.entry(key.clone()).or_insert((now_ms, 0));
    if now_ms >= w.0 + window {
        *w = (now_ms, 0);
    }
    if w.1 >= max {
        return Err(LoginRefused::TooMany);
    }
    w.1 += 1;
    Ok(())
}

impl LoginLimiter {
    /// Count an attempt by `ip` for operator `name` before its password is checked; refused if
    /// the address or the name has used up its window, or too many checks are under way.
    pub fn begin(&self, ip: IpAddr, name: &str, now_ms: u64) -> Result<Attempt<'_>, LoginRefused> {
        let check = self
            .checks
            .clone()
            .try_acquire_owned()
            .map_err(|_| LoginRefused::Busy)?;
        // Unknown and invalid names share one window: what is not a name is not remembered.
        let name = if valid_name(name) { name } else { "" };
        count(&self.by_address, &ip, LOGIN_FAILURES_PER_WINDOW, now_ms)?;
        if let Err(e) = count(
            &self.by_name,
            &name.to_owned(),
            LOGIN_NAME_FAILURES_PER_WINDOW,
            now_ms,
        ) {
            // Not counted against the address after all: it was the name that was full.
            if let Some(w) = lock(&self.by_address).get_mut(&ip) {
                w.1 = w.1.saturating_sub(1);
            }
            return Err(e);
        }
        Ok(Attempt {
            limiter: self,
            ip,
            name: name.to_owned(),
            _check: check,
        })
    }
}

/// Proxies whose `X-Forwarded-For` is believed (`dashboard_trusted_proxies`): addresses or
/// networks (`10.0.0.0/8`, `fd00::/8`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<(IpAddr, u8)>);

impl TrustedProxies {
    /// A comma-separated list of addresses and networks.
    pub fn parse(list: &str) -> Result<TrustedProxies, String> {
        let mut nets = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (addr, bits) = match item.split_once('/') {
                Some((a, b)) => (a, Some(b)),
                None => (item, None),
            };
            let ip: IpAddr = addr
                .parse()
                .map_err(|_| format!("{item:?} is not an address or a network"))?;
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits = match bits {
                Some(b) => b
                    .parse::<u8>()
                    .ok()
                    .filter(|b| *b <= max)
                    .ok_or_else(|| format!("{item:?}: a prefix length is 0 to {max}"))?,
                None => max,
            };
            nets.push((ip, bits));
        }
        Ok(TrustedProxies(nets))
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        self.0.iter().any(|(net, bits)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix(&n.octets(), &a.octets(), *bits),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix(&n.octets(), &a.octets(), *bits),
            _ => false,
        })
    }

    /// The client's address: the peer's, unless the peer is a trusted proxy; then the
    /// nearest address in `X-Forwarded-For` (read from the right) that is not one.
    pub fn client(&self, peer: IpAddr, forwarded_for: Option<&str>) -> IpAddr {
        if !self.contains(peer) {
            return peer;
        }
        let Some(chain) = forwarded_for else {
            return peer;
        };
        for hop in chain.rsplit(',').map(str::trim) {
            let Ok(ip) = hop.parse::<IpAddr>() else {
                // Unreadable: the proxy's own report ends here.
                return peer;
            };
            if !self.contains(ip) {
                return ip;
            }
        }
        peer
    }
}

/// Do `a` and `b` share their first `bits` bits?
fn prefix(a: &[u8], b: &[u8], bits: u8) -> bool {
    let (whole, rest) = ((bits / 8) as usize, bits % 8);
    if a[..whole] != b[..whole] {
        return false;
    }
    rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0
}

#[cfg(test)]
mod tests;
