//! Resource profiles: named sets of the limits an agent runs with (memory, CPUs, processes, run
//! time limit, image, secrets, network, egress list). Chats are mapped to profiles at run time (the
//! coordinators keep the mapping in JetStream); a chat not mapped runs with `default_profile`.
//! Each setting a profile leaves out is the top-level one: the top-level settings are the
//! profile `default` unless `[profiles.default]` changes some of them.

use crate::{units, AgentSecret, ByteSize, Config, ConfigError};
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The profile every deployment has: the top-level settings.
pub const DEFAULT_PROFILE: &str = "default";
/// The longest profile name (what a work item carries).
pub use turnpike_core::wire::PROFILE_NAME_MAX;

/// What one `[profiles.<name>]` table sets; the rest is the top-level settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<ByteSize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_limit: Option<i64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "units::option_duration"
    )]
    pub run_timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_secrets: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress_allow: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_max_bytes: Option<ByteSize>,
    /// Replaces the top-level `agent_env` as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_env: Option<std::collections::BTreeMap<String, String>>,
}

/// A profile, every setting resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub memory_limit: ByteSize,
    pub cpus: f64,
    pub pids_limit: i64,
    pub run_timeout: Duration,
    pub agent_image: String,
    pub agent_secrets: Vec<AgentSecret>,
    pub network_mode: String,
    /// Where the agent may connect (empty: `network_mode` alone decides).
    pub egress_allow: crate::egress::Allowlist,
    /// Variables the agent gets (configuration, not secrets).
    pub agent_env: std::collections::BTreeMap<String, String>,
    /// The chat's workspace size (0: no workspace).
    pub workspace_max_bytes: ByteSize,
}

/// Is `name` a profile name (letters, digits, `_`, `-`, `.`, not starting with `.`; 1 to 64)?
pub fn check_profile_name(name: &str) -> Result<(), String> {
    crate::secrets::plain_name("profile", name, PROFILE_NAME_MAX)
}

impl Config {
    /// Profile `name` (`None`: `default_profile`), resolved; `None` if this configuration does
    /// not define it.
    pub fn profile(&self, name: Option<&str>) -> Option<Profile> {
        let name = name.unwrap_or(&self.default_profile);
        let settings = match self.profiles.get(name) {
            Some(s) => s.clone(),
            None if name == DEFAULT_PROFILE => ProfileSettings::default(),
            None => return None,
        };
        Some(Profile {
            name: name.to_owned(),
            memory_limit: settings.memory_limit.unwrap_or(self.memory_limit),
            cpus: settings.cpus.unwrap_or(self.cpus),
            pids_limit: settings.pids_limit.unwrap_or(self.pids_limit),
            run_timeout: settings.run_timeout.unwrap_or(self.run_timeout),
            agent_image: settings
                .agent_image
                .unwrap_or_else(|| self.agent_image.clone()),
            // Checked when the config was loaded.
            agent_secrets: crate::parse_agent_secrets(
                settings
                    .agent_secrets
                    .as_deref()
                    .unwrap_or(&self.agent_secrets),
            )
            .unwrap_or_default(),
            network_mode: settings
                .network_mode
                .unwrap_or_else(|| self.network_mode.clone()),
            // Checked when the config was loaded.
            egress_allow: crate::egress::Allowlist::parse(
                settings
                    .egress_allow
                    .as_deref()
                    .unwrap_or(&self.egress_allow),
            )
            .unwrap_or_default(),
            agent_env: settings.agent_env.unwrap_or_else(|| self.agent_env.clone()),
            workspace_max_bytes: settings
                .workspace_max_bytes
                .unwrap_or(self.workspace_max_bytes),
        })
    }

    /// Does any profile give chats a workspace?
    pub fn workspaces(&self) -> bool {
        self.profile_names()
            .iter()
            .filter_map(|p| self.profile(Some(p)))
            .any(|p| p.workspace_max_bytes.0 > 0)
    }

    /// The names of the profiles this configuration defines, `default` among them.
    pub fn profile_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.profiles.keys().cloned().collect();
        if !self.profiles.contains_key(DEFAULT_PROFILE) {
            names.push(DEFAULT_PROFILE.to_owned());
        }
        names.sort();
        names
    }

    /// Each profile's settings checked as the top-level ones are.
    pub(crate) fn check_profiles(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, value: String, why: String| ConfigError::Invalid {
            key,
            value,
            why,
        };
        for (name, s) in &self.profiles {
            check_profile_name(name).map_err(|why| invalid("profiles", name.clone(), why))?;
            let as_top = Config {
                memory_limit: s.memory_limit.unwrap_or(self.memory_limit),
                cpus: s.cpus.unwrap_or(self.cpus),
                pids_limit: s.pids_limit.unwrap_or(self.pids_limit),
                run_timeout: s.run_timeout.unwrap_or(self.run_timeout),
                agent_image: s.agent_image.clone().unwrap_or(self.agent_image.clone()),
                agent_secrets: s
                    .agent_secrets
                    .clone()
                    .unwrap_or(self.agent_secrets.clone()),
                network_mode: s.network_mode.clone().unwrap_or(self.network_mode.clone()),
                egress_allow: s.egress_allow.clone().unwrap_or(self.egress_allow.clone()),
                agent_env: s.agent_env.clone().unwrap_or(self.agent_env.clone()),
                workspace_max_bytes: s.workspace_max_bytes.unwrap_or(self.workspace_max_bytes),
                profiles: Default::default(),
                default_profile: DEFAULT_PROFILE.into(),
                ..self.clone()
            };
            as_top.validate().map_err(|e| match e {
                ConfigError::Invalid { key, value, why } => {
                    invalid("profiles", format!("{name}.{key} = {value}"), why)
                }
                other => other,
            })?;
        }
        if self.profile(None).is_none() {
            return Err(invalid(
                "default_profile",
                self.default_profile.clone(),
                format!(
                    "no such profile; defined: {}",
                    self.profile_names().join(", ")
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_is_its_settings_over_the_top_level_ones() {
        let mut c = Config {
            secrets_dir: Some("/run/secrets".into()),
            ..Config::default()
        };
        c.profiles.insert(
            "big".into(),
            ProfileSettings {
                memory_limit: Some(ByteSize(2 << 30)),
                run_timeout: Some(Duration::from_secs(900)),
                agent_secrets: Some("key:API_KEY".into()),
                ..Default::default()
            },
        );
        let big = c.profile(Some("big")).expect("big");
        assert_eq!(big.memory_limit, ByteSize(2 << 30));
        assert_eq!(big.run_timeout, Duration::from_secs(900));
        assert_eq!(big.cpus, c.cpus);
        assert_eq!(big.agent_image, c.agent_image);
        assert_eq!(big.agent_secrets.len(), 1);
        let default = c.profile(None).expect("default");
        assert_eq!(default.name, DEFAULT_PROFILE);
        assert_eq!(default.memory_limit, c.memory_limit);
        assert_eq!(c.profile(Some("nope")), None);
        assert_eq!(c.profile_names(), vec!["big", "default"]);
        assert!(c.clone().validate().is_ok());
        c.default_profile = "big".into();
        assert!(c.clone().validate().is_ok());
        c.default_profile = "huge".into();
        let e = c
            .clone()
            .validate()
            .expect_err("no such profile")
            .to_string();
        assert!(
            e.contains("default_profile") && e.contains("big, default"),
            "{e}"
        );
        c.default_profile = "big".into();
        c.profiles.insert(
            "bad".into(),
            ProfileSettings {
                pids_limit: Some(0),
                ..Default::default()
            },
        );
        let e = c.validate().expect_err("pids 0").to_string();
        assert!(
            e.contains("profiles") && e.contains("bad.pids_limit"),
            "{e}"
        );
    }
}
