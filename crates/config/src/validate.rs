//! The checks between values that types alone cannot make, each naming the key it refuses.

use crate::{Config, ConfigError};
use std::time::Duration;

/// The most attempts a turn may be given: its record holds every one.
pub const MAX_TURN_RETRY_MAX: u32 = 100;
/// The smallest `message_max_bytes`: a message's id, sender and structure count too.
pub const MESSAGE_MAX_BYTES_MIN: u64 = 1024;
/// The shortest duplicate window: what once-only notices need (see `dedup_window`).
pub const DEDUP_WINDOW_MIN: Duration = Duration::from_secs(60);

impl Config {
    /// Check relations between values that types alone cannot.
    pub fn validate(self) -> Result<Config, ConfigError> {
        let invalid = |key, value: String, why: &str| ConfigError::Invalid {
            key,
            value,
            why: why.to_owned(),
        };
        if self.nats_url.split(',').all(|s| s.trim().is_empty()) {
            return Err(invalid(
                "nats_url",
                self.nats_url,
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
        if self.attachments_max > 256 {
            return Err(invalid(
                "attachments_max",
                self.attachments_max.to_string(),
                "at most 256 attachments per message",
            ));
        }
        // Agent containers run someone's code: never as root, never on the host's network,
        // never without a process limit.
        let user = self.agent_user.trim();
        let uid = user.split(':').next().unwrap_or("");
        if uid.is_empty() || uid == "0" || uid == "root" {
            return Err(invalid(
                "agent_user",
                format!("{:?}", self.agent_user),
                "agent containers must run as a non-root user, e.g. 65534:65534",
            ));
        }
        if self.network_mode.trim() == "host" {
            return Err(invalid(
                "network_mode",
                "host".into(),
                "agent containers may not share the host's network; use none, bridge or a network name",
            ));
        }
        if self.pids_limit <= 0 {
            return Err(invalid(
                "pids_limit",
                self.pids_limit.to_string(),
                "agent containers need a positive process limit",
            ));
        }
        if self.runner_slots == 0 {
            return Err(invalid(
                "runner_slots",
                "0".into(),
                "a runner needs at least one slot",
            ));
        }
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
        // The same rule as every runner id on the wire (core's), length included.
        if let Some(id) = &self.runner_id {
            if let Err(e) = turnpike_core::RunnerId::new(id.as_str()) {
                return Err(invalid("runner_id", id.clone(), &e.to_string()));
            }
        }
        Ok(self)
    }
}
