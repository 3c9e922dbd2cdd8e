//! The watchdog protocol between a runner and `turnpike-agent-init`, the PID 1 of every agent
//! container: what the runner writes on the container's stdin, and what the init's exit codes
//! mean. Pure: encoding and parsing only; the binary (`main.rs`) does the IO.
//!
//! Why it exists: a container does not freeze with its runner. A runner paused past its lease (a
//! VM stall, `SIGSTOP`, `docker pause`) cannot stop its agent, while the coordinator declares the
//! attempt lost and retries it elsewhere: two agents of one turn would run at once. The init
//! stops the agent by itself when the runner's heartbeats stop coming.
//!
//! The stream, in order:
//! 1. `turnpike-agent-init/1 <len>\n`, then exactly `<len>` bytes: the agent's input document,
//!    passed to the agent's stdin, which is then closed (the agent sees end of input as before);
//! 2. one line per lease renewal, `<ms>\n`: stop the agent if nothing more is heard within `<ms>`
//!    milliseconds of reading this line.
//!
//! The agent starts only once the document and the first heartbeat have come, with time left:
//! a runner that froze between starting the container and speaking, or woke too late, never
//! has its agent started. Until then the deadline is the one on the command line,
//! `turnpike-agent-init <ms> <program> [args...]`. End of stream (the runner died or let go of
//! the container) stops the agent at once.

use std::time::Duration;

/// The first line's tag, with the protocol's version.
pub const MAGIC: &str = "turnpike-agent-init/1";

/// The init's exit code when it stopped the agent itself: no heartbeat in time, the runner let
/// go, or the runner broke the protocol. The runner reads it as a lost lease (a retryable death).
pub const EXIT_WATCHDOG: i32 = 251;
/// The agent's program could not be found (as a shell says it; the runner classifies exit 127
/// with no output as "could not start", which no retry can change).
pub const EXIT_NOT_FOUND: i32 = 127;
/// The agent's program was found but could not be run (permissions, format).
pub const EXIT_CANNOT_RUN: i32 = 126;
/// Longest line the init accepts from the runner (the header is the longest).
pub const MAX_LINE: usize = 64;

/// The variable that tells the init which secrets the agent also gets as variables:
/// `VAR=name;VAR2=name2`, each `name` a file of [`SECRETS_DIR`]. Names only: a secret's value is
/// never in the container's configuration, where `docker inspect` would show it. The init reads
/// the files, sets the variables for the agent, and does not pass this one on.
pub const SECRET_ENV: &str = "TURNPIKE_SECRET_ENV";
/// Where an agent's secrets are, one file each, in its container.
pub const SECRETS_DIR: &str = "/run/secrets";

/// [`SECRET_ENV`]'s value for these (variable, secret name) pairs.
pub fn secret_env<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    pairs
        .into_iter()
        .map(|(var, name)| format!("{var}={name}"))
        .collect::<Vec<_>>()
        .join(";")
}

/// The (variable, secret name) pairs of [`SECRET_ENV`]'s value; `None` if it is malformed.
pub fn parse_secret_env(value: &str) -> Option<Vec<(String, String)>> {
    value
        .split(';')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (var, name) = pair.split_once('=')?;
            let plain =
                |s: &str| !s.is_empty() && !s.contains(['/', '\0']) && s != "." && s != "..";
            (plain(var) && plain(name)).then(|| (var.to_owned(), name.to_owned()))
        })
        .collect()
}

/// The header that announces the input document.
pub fn header(len: usize) -> Vec<u8> {
    format!("{MAGIC} {len}\n").into_bytes()
}

/// One heartbeat: the agent may live `left` more without another.
pub fn beat(left: Duration) -> Vec<u8> {
    format!("{}\n", left.as_millis()).into_bytes()
}

/// What the runner wrote that the init cannot accept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The first line is not `turnpike-agent-init/1 <len>`.
    BadHeader(String),
    /// A heartbeat line is not a number of milliseconds.
    BadBeat(String),
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProtocolError::BadHeader(l) => write!(f, "bad header from the runner: {l:?}"),
            ProtocolError::BadBeat(l) => write!(f, "bad heartbeat from the runner: {l:?}"),
        }
    }
}

impl std::error::Error for ProtocolError {}

/// The document's length, from the first line (without its newline).
pub fn parse_header(line: &[u8]) -> Result<u64, ProtocolError> {
    let bad = || ProtocolError::BadHeader(String::from_utf8_lossy(line).into_owned());
    let text = std::str::from_utf8(line).map_err(|_| bad())?;
    let (magic, len) = text.split_once(' ').ok_or_else(bad)?;
    if magic != MAGIC {
        return Err(bad());
    }
    len.parse().map_err(|_| bad())
}

/// How long the agent may live without another heartbeat, from a heartbeat line.
pub fn parse_beat(line: &[u8]) -> Result<Duration, ProtocolError> {
    std::str::from_utf8(line)
        .ok()
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_millis)
        .ok_or_else(|| ProtocolError::BadBeat(String::from_utf8_lossy(line).into_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strip(mut v: Vec<u8>) -> Vec<u8> {
        assert_eq!(v.pop(), Some(b'\n'), "every line ends in a newline");
        v
    }

    #[test]
    fn what_the_runner_writes_the_init_reads() {
        for len in [0, 1, 4096, usize::MAX] {
            let line = strip(header(len));
            assert!(line.len() <= MAX_LINE);
            assert_eq!(parse_header(&line), Ok(len as u64));
        }
        for ms in [0, 1, 3_999, u32::MAX as u64] {
            let line = strip(beat(Duration::from_millis(ms)));
            assert!(line.len() <= MAX_LINE);
            assert_eq!(parse_beat(&line), Ok(Duration::from_millis(ms)));
        }
    }

    #[test]
    fn anything_else_is_refused() {
        for bad in [
            &b""[..],
            b"turnpike-agent-init/1",
            b"turnpike-agent-init/2 10",
            b"turnpike-agent-init/1 -1",
            b"turnpike-agent-init/1 ten",
            b"turnpike-agent-init/1  10",
            b"\xff 10",
        ] {
            assert!(parse_header(bad).is_err(), "{bad:?}");
        }
        for bad in [&b""[..], b"-5", b"1.5", b"5 ", b"\xff"] {
            assert!(parse_beat(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_secret_variables_the_runner_names_the_init_reads() {
        let pairs = [("OPENAI_API_KEY", "openai_key"), ("GH", "gh.token")];
        let value = secret_env(pairs);
        assert_eq!(value, "OPENAI_API_KEY=openai_key;GH=gh.token");
        let parsed = parse_secret_env(&value).expect("parsed");
        assert_eq!(
            parsed,
            pairs.map(|(v, n)| (v.to_owned(), n.to_owned())).to_vec()
        );
        assert_eq!(parse_secret_env(""), Some(vec![]));
        for bad in ["X", "X=", "=n", "X=../etc/passwd", "X=..", "X=a/b"] {
            assert_eq!(parse_secret_env(bad), None, "{bad:?}");
        }
    }
}
