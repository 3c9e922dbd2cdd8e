//! The checks between values that types alone cannot make, each naming the key it refuses.

use crate::{Config, ConfigError};

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
        // What one work item can carry must stay well inside NATS's default 1 MiB max_payload:
        // the message, the history and the attachment list, with room for the record around them.
        const PAYLOAD_BUDGET: u64 = 768 * 1024;
        if self.message_max_bytes.0 == 0
            || self.history_max_bytes.0 == 0
            || self.message_max_bytes.0 + self.history_max_bytes.0 > PAYLOAD_BUDGET
        {
            return Err(invalid(
                "history_max_bytes",
                format!("{} + message_max_bytes {}", self.history_max_bytes, self.message_max_bytes),
                "both must be non-zero and add up to at most 768 KiB, so every work item and record fits NATS's 1 MiB max_payload",
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
        if self.dedup_window.is_zero() {
            return Err(invalid(
                "dedup_window",
                "0s".into(),
                "must be longer than zero",
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
