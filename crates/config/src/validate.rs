//! The checks between values that types alone cannot make, each naming the key it refuses.

use crate::{Config, ConfigError};
use std::time::Duration;

/// The most attempts a turn may be given: its record holds every one.
pub const MAX_TURN_RETRY_MAX: u32 = 100;
/// The smallest `message_max_bytes`: a message's id, sender and structure count too.
pub const MESSAGE_MAX_BYTES_MIN: u64 = 1024;
/// The shortest duplicate window: what once-only notices need (see `dedup_window`).
pub const DEDUP_WINDOW_MIN: Duration = Duration::from_secs(60);

/// A refusal of `key`'s `value`, saying why.
fn invalid(key: &'static str, value: String, why: &str) -> ConfigError {
    ConfigError::Invalid {
        key,
        value,
        why: why.to_owned(),
    }
}

impl Config {
    /// Check relations between values that types alone cannot.
    pub fn validate(self) -> Result<Config, ConfigError> {
        self.check_connection()?;
        self.check_sizes()?;
        self.check_agents()?;
        self.check_times()?;
        self.check_identity()?;
        self.check_profiles()?;
        Ok(self)
    }

    /// The servers and how to log in to them.
    fn check_connection(&self) -> Result<(), ConfigError> {
        if self.nats_url.split(',').all(|s| s.trim().is_empty()) {
            return Err(invalid(
                "nats_url",
                self.nats_url.clone(),
                "name at least one server",
            ));
        }
        if self.nats_password.is_some() && self.nats_password_file.is_some() {
            return Err(invalid(
                "nats_password_file",
                self.nats_password_file
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                "set nats_password or nats_password_file, not both",
            ));
        }
        if let Some(prefix) = &self.nats_inbox_prefix {
            if prefix.is_empty()
                || prefix
                    .chars()
                    .any(|c| c.is_whitespace() || matches!(c, '.' | '*' | '>'))
            {
                return Err(invalid(
                    "nats_inbox_prefix",
                    prefix.clone(),
                    "one subject token: no dots, wildcards or white space",
                ));
            }
        }
        Ok(())
    }

    /// Limits, and that every payload Turnpike builds fits `max_payload` with them.
    fn check_sizes(&self) -> Result<(), ConfigError> {
        if self.max_turn_retry > MAX_TURN_RETRY_MAX {
            return Err(invalid(
                "max_turn_retry",
                self.max_turn_retry.to_string(),
                &format!("at most {MAX_TURN_RETRY_MAX}: the turn record holds every attempt"),
            ));
        }
        if self.message_max_bytes.0 < MESSAGE_MAX_BYTES_MIN {
            return Err(invalid(
                "message_max_bytes",
                self.message_max_bytes.to_string(),
                &format!(
                    "at least {MESSAGE_MAX_BYTES_MIN} bytes: the limit counts the whole message, its id and sender too"
                ),
            ));
        }
        if self.history_max_bytes.0 == 0 {
            return Err(invalid("history_max_bytes", "0".into(), "must be non-zero"));
        }
        if self.attempt_messages_max == 0 {
            return Err(invalid(
                "attempt_messages_max",
                "0".into(),
                "an attempt must be able to land a message",
            ));
        }
        if self.attempt_bytes_max.0 < self.message_max_bytes.0 {
            return Err(invalid(
                "attempt_bytes_max",
                self.attempt_bytes_max.to_string(),
                "must hold at least one message of message_max_bytes",
            ));
        }
        if self.chat_queue_max == 0 {
            return Err(invalid(
                "chat_queue_max",
                "0".into(),
                "a chat must be able to queue a message behind its running turn",
            ));
        }
        // Every payload Turnpike builds must fit the servers' max_payload by construction: the
        // record with every attempt, the work item, the chat record with its whole queue.
        if let Err(e) = self.budgets().check() {
            // Blame the attempts only if one attempt would fit, the queue only if an empty one.
            let one_attempt = turnpike_core::sizes::Budgets {
                attempts: 1,
                chat_queue: 0,
                ..self.budgets()
            };
            let key = match e.what {
                _ if one_attempt.check().is_err() => "history_max_bytes",
                "the turn record" => "max_turn_retry",
                "the chat record" => "chat_queue_max",
                _ => "history_max_bytes",
            };
            let value = match key {
                "max_turn_retry" => self.max_turn_retry.to_string(),
                "chat_queue_max" => self.chat_queue_max.to_string(),
                _ => format!(
                    "{} + message_max_bytes {}",
                    self.history_max_bytes, self.message_max_bytes
                ),
            };
            return Err(invalid(
                key,
                value,
                &format!("{e}; lower the limits or raise max_payload (the servers' too)"),
            ));
        }
        if self.attachments_store_max_bytes.0 < self.attachments_max_total_bytes.0 {
            return Err(invalid(
                "attachments_store_max_bytes",
                self.attachments_store_max_bytes.to_string(),
                "must hold at least one message's attachments (attachments_max_total_bytes)",
            ));
        }
        if self.workspace_max_bytes.0 > self.workspaces_store_max_bytes.0 {
            return Err(invalid(
                "workspace_max_bytes",
                self.workspace_max_bytes.to_string(),
                "a workspace must fit the workspace store (workspaces_store_max_bytes)",
            ));
        }
        if self.attachments_max > 256 {
            return Err(invalid(
                "attachments_max",
                self.attachments_max.to_string(),
                "at most 256 attachments per message",
            ));
        }
        Ok(())
    }

    /// What agent containers may do, and how many a runner runs.
    fn check_agents(&self) -> Result<(), ConfigError> {
        // Agent containers run someone's code: never as root, never on the host's network or
        // in another container's namespaces, never without a process limit.
        if let Err(why) = agent_user(&self.agent_user) {
            return Err(invalid(
                "agent_user",
                format!("{:?}", self.agent_user),
                &format!(
                    "{why}; agent containers must run as a numeric non-root user, e.g. 65534:65534"
                ),
            ));
        }
        if let Err(why) = network_mode(&self.network_mode) {
            return Err(invalid("network_mode", self.network_mode.clone(), why));
        }
        let egress = crate::egress::Allowlist::parse(&self.egress_allow)
            .map_err(|why| invalid("egress_allow", self.egress_allow.clone(), &why))?;
        if !egress.is_empty() && self.network_mode != "none" {
            return Err(invalid(
                "egress_allow",
                self.egress_allow.clone(),
                &format!(
                    "an egress list gives the agent a network of its own; network_mode must be none, not {}",
                    self.network_mode
                ),
            ));
        }
        if let Err(why) = network_mode(&self.egress_network) {
            return Err(invalid("egress_network", self.egress_network.clone(), why));
        }
        if self.pids_limit <= 0 {
            return Err(invalid(
                "pids_limit",
                self.pids_limit.to_string(),
                "agent containers need a positive process limit",
            ));
        }
        if !self.agent_secrets()?.is_empty() && self.secrets_dir.is_none() {
            return Err(invalid(
                "agent_secrets",
                self.agent_secrets.clone(),
                "set secrets_dir, the directory the secrets are read from",
            ));
        }
        let secrets = self.agent_secrets()?;
        for (name, value) in &self.agent_env {
            crate::secrets::check_env(name)
                .map_err(|why| invalid("agent_env", name.clone(), &why))?;
            if secrets
                .iter()
                .any(|s| s.env.as_deref() == Some(name.as_str()))
            {
                return Err(invalid(
                    "agent_env",
                    name.clone(),
                    "is also a secret's variable (agent_secrets)",
                ));
            }
            if value.len() > 4096 || value.contains('\0') {
                return Err(invalid(
                    "agent_env",
                    name.clone(),
                    "a value is at most 4096 bytes, without NUL",
                ));
            }
        }
        if self.runner_slots == 0 {
            return Err(invalid(
                "runner_slots",
                "0".into(),
                "a runner needs at least one slot",
            ));
        }
        Ok(())
    }

    /// Replicas, heartbeats, time limits and how long things are kept.
    fn check_times(&self) -> Result<(), ConfigError> {
        if !(1..=5).contains(&self.replicas) {
            return Err(invalid(
                "replicas",
                self.replicas.to_string(),
                "JetStream allows 1 to 5 replicas",
            ));
        }
        if self.heartbeat.is_zero() || self.heartbeat * 2 > self.lease {
            return Err(invalid(
                "heartbeat",
                humantime::format_duration(self.heartbeat).to_string(),
                &format!(
                    "must be non-zero and at most half of lease ({}), so one missed renewal does not lose a claim",
                    humantime::format_duration(self.lease)
                ),
            ));
        }
        if self.event_batch_wait > std::time::Duration::from_secs(10) {
            return Err(invalid(
                "event_batch_wait",
                humantime::format_duration(self.event_batch_wait).to_string(),
                "at most 10s: longer would hide a running turn from operators",
            ));
        }
        if self.run_timeout.is_zero() {
            return Err(invalid(
                "run_timeout",
                "0s".into(),
                "must be longer than zero",
            ));
        }
        if self.memory_limit.0 < 6 * 1024 * 1024 {
            return Err(invalid(
                "memory_limit",
                self.memory_limit.to_string(),
                "Docker refuses limits under 6MiB",
            ));
        }
        if !(self.cpus > 0.0 && self.cpus.is_finite()) {
            return Err(invalid(
                "cpus",
                self.cpus.to_string(),
                "must be a positive number",
            ));
        }
        // An attempt's claim (kept retention_turns) must outlive the longest run.
        let longest_run = self.run_timeout + self.stop_grace + self.lease;
        if self.retention_turns <= longest_run {
            return Err(invalid(
                "retention_turns",
                humantime::format_duration(self.retention_turns).to_string(),
                &format!(
                    "must be longer than the longest run (run_timeout + stop_grace + lease = {})",
                    humantime::format_duration(longest_run)
                ),
            ));
        }
        // A turn's notice is sent once because its dedup id holds for this long. Whoever carries
        // out an ended turn's effects first checks that the turn is still listed as owing them;
        // the window must outlast the few requests (each up to the 10 s request time-out)
        // between that check and the publish, with room for two processes doing it at once.
        if self.dedup_window < DEDUP_WINDOW_MIN {
            return Err(invalid(
                "dedup_window",
                humantime::format_duration(self.dedup_window).to_string(),
                &format!(
                    "at least {}: a turn's notice is sent once only within it",
                    humantime::format_duration(DEDUP_WINDOW_MIN)
                ),
            ));
        }
        Ok(())
    }

    /// This process's own names.
    fn check_identity(&self) -> Result<(), ConfigError> {
        // The same rule as every runner id on the wire (core's), length included.
        if let Some(id) = &self.runner_id {
            if let Err(e) = turnpike_core::RunnerId::new(id.as_str()) {
                return Err(invalid("runner_id", id.clone(), &e.to_string()));
            }
        }
        Ok(())
    }
}

/// A number as the Docker Engine reads one in a `user` setting (Go's `strconv.Atoi`: an optional
/// sign, then decimal digits, leading zeros allowed), or `None` if it is not one.
fn engine_number(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: i64 = digits.trim_start_matches('0').parse().unwrap_or(0);
    Some(if s.starts_with('-') { -n } else { n })
}

/// `agent_user` as the engine would read it: `uid[:gid]`, both numbers, neither root's. A name
/// is refused: the engine looks it up in the agent's image, where any name may be uid 0 (and a
/// scratch image has no names at all).
fn agent_user(user: &str) -> Result<(), String> {
    let (uid, gid) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let uid = engine_number(uid).ok_or_else(|| format!("user {uid:?} is not a number"))?;
    if uid <= 0 {
        return Err(format!("uid {uid} is root (or not a user)"));
    }
    if let Some(gid) = gid {
        let gid = engine_number(gid).ok_or_else(|| format!("group {gid:?} is not a number"))?;
        if gid <= 0 {
            return Err(format!("gid {gid} is root's group (or not a group)"));
        }
    }
    Ok(())
}

/// `network_mode`: `none`, `bridge`, or the name of a network, never `host` or a join of another
/// container's network namespace (`container:<id>`), which would share what that one reaches.
fn network_mode(mode: &str) -> Result<(), &'static str> {
    if mode == "host" {
        return Err(
            "agent containers may not share the host's network; use none, bridge or a network name",
        );
    }
    let name_ok = mode
        .bytes()
        .enumerate()
        .all(|(i, b)| b.is_ascii_alphanumeric() || (i > 0 && matches!(b, b'_' | b'.' | b'-')));
    if mode.is_empty() || !name_ok {
        return Err("none, bridge or a network name ([A-Za-z0-9][A-Za-z0-9_.-]*); never host or container:<id>, which share another's network");
    }
    Ok(())
}

#[cfg(test)]
mod checks {
    use super::*;

    /// The engine reads `00`, `+0` and `-0` as uid 0: each is root.
    #[test]
    fn agent_users_are_read_as_the_engine_reads_them() {
        for root in [
            "0",
            "00",
            "+0",
            "-0",
            "000:1000",
            "1000:0",
            "1000:+00",
            "-5",
            "root",
            "",
            " 1000",
            "1000 ",
            "0x10",
            "1000:root",
            "nobody",
        ] {
            assert!(agent_user(root).is_err(), "{root:?} accepted");
        }
        for ok in ["65534:65534", "1000", "1000:1000", "01000", "+1000:1000"] {
            assert_eq!(agent_user(ok), Ok(()), "{ok:?}");
        }
        assert_eq!(engine_number("+007"), Some(7));
        assert_eq!(engine_number("-0"), Some(0));
        assert_eq!(engine_number("1e3"), None);
    }

    #[test]
    fn network_modes_never_share_anothers_namespace() {
        for bad in [
            "host",
            "container:abc",
            "container:",
            "ns:/proc/1/ns/net",
            "",
            " none",
            "-x",
        ] {
            assert!(network_mode(bad).is_err(), "{bad:?} accepted");
        }
        for ok in ["none", "bridge", "turnpike-agents", "my_net.1"] {
            assert_eq!(network_mode(ok), Ok(()), "{ok:?}");
        }
    }
}
