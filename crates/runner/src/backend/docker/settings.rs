//! The container every attempt gets: its settings from the config, its body, its entrypoint.

use super::*;
use bollard::models::{ContainerCreateBody, HostConfig, HostConfigLogConfig, Mount, MountType};
use bollard::query_parameters::{AttachContainerOptions, AttachContainerOptionsBuilder};
use std::collections::HashMap;
use std::time::Duration;
use turnpike_config::{Config, Profile};
use turnpike_core::wire::WorkItem;
use turnpike_core::RunnerId;

/// The entrypoint of an agent container: the watchdog, the time it may wait for the runner's
/// first word, then the agent's own command (the image's entrypoint and command).
pub fn watchdog_command(first: Duration, agent: impl IntoIterator<Item = String>) -> Vec<String> {
    [INIT_PATH.to_owned(), first.as_millis().to_string()]
        .into_iter()
        .chain(agent)
        .collect()
}

/// The container every attempt of a runner gets: from its config, the numeric user, labels and
/// a read-only root; from the attempt's resource profile, the image, limits, network and
/// secrets. Public for review (`turnpike runner container-spec` prints it) and so the
/// benchmarks time a bare run of exactly this container.
#[derive(Debug, Clone)]
pub struct ContainerSettings {
    pub(super) runner: RunnerId,
    pub(super) instance: super::super::tree::Instance,
    pub(super) deployment: String,
    pub(super) user: String,
}

impl ContainerSettings {
    pub fn new(config: &Config, runner: RunnerId) -> Self {
        ContainerSettings {
            runner,
            instance: super::super::tree::Instance::new(),
            deployment: String::new(),
            user: config.agent_user.clone(),
        }
    }

    /// The name of an attempt's container (its network and egress proxy are named after it).
    pub fn name(&self, turn: &turnpike_core::TurnId, attempt: u32) -> String {
        // Docker names: [a-zA-Z0-9][a-zA-Z0-9_.-]*; our ids already fit.
        format!("turnpike-{}-{turn}-{attempt}", self.runner)
    }

    /// The agent's user id, owner of its secret files (`agent_user` is numeric, checked at load).
    pub(super) fn uid(&self) -> u64 {
        let uid = self.user.split(':').next().unwrap_or_default();
        uid.trim_start_matches('+').parse().unwrap_or(65534)
    }

    /// What an attempt's container is created with: the image, the numeric user, stdin for the
    /// input document, the limits, the network and the labels; `command` replaces the image's
    /// entrypoint and command (the watchdog in front of them, [`watchdog_command`]), `None`
    /// keeps the image's own.
    pub fn body(
        &self,
        work: &WorkItem,
        profile: &Profile,
        deadline: turnpike_core::Timestamp,
        command: Option<Vec<String>>,
    ) -> ContainerCreateBody {
        let memory = i64::try_from(profile.memory_limit.0).unwrap_or(i64::MAX);
        // With an egress list, the attempt's own internal network, its proxy the way out.
        let egress = !profile.egress_allow.is_empty();
        let network = if egress {
            super::egress::network_of(&self.name(&work.turn, work.attempt))
        } else {
            profile.network_mode.clone()
        };
        let mut env = env(work, profile, deadline);
        if egress {
            env.extend(super::egress::proxy_env());
        }
        let cmd = command.as_ref().map(|_| Vec::new());
        ContainerCreateBody {
            image: Some(profile.agent_image.clone()),
            entrypoint: command,
            cmd,
            user: Some(self.user.clone()),
            attach_stdin: Some(true),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            open_stdin: Some(true),
            stdin_once: Some(true),
            tty: Some(false),
            env: Some(env),
            labels: Some(HashMap::from([
                (LABEL_MANAGED.to_owned(), "true".to_owned()),
                (LABEL_RUNNER.to_owned(), self.runner.to_string()),
                (LABEL_INSTANCE.to_owned(), self.instance.as_str().to_owned()),
                (LABEL_DEPLOYMENT.to_owned(), self.deployment.clone()),
                (LABEL_TURN.to_owned(), work.turn.to_string()),
                (LABEL_ATTEMPT.to_owned(), work.attempt.to_string()),
                (LABEL_CHAT.to_owned(), work.chat.to_string()),
            ])),
            host_config: Some(HostConfig {
                memory: Some(memory),
                memory_swap: Some(memory),
                pids_limit: Some(profile.pids_limit),
                nano_cpus: Some((profile.cpus * 1e9) as i64),
                network_mode: Some(network),
                cap_drop: Some(vec!["ALL".to_owned()]),
                security_opt: Some(vec!["no-new-privileges".to_owned()]),
                // Nothing of the image can be changed: the agent writes to a small /tmp in
                // memory (counted against its memory limit), and reads its attachments (and
                // runs behind the watchdog) from an anonymous volume (the engine copies into a
                // volume even on a read-only root; it goes with the container, which is removed
                // with its volumes).
                readonly_rootfs: Some(true),
                tmpfs: Some(HashMap::from([(
                    "/tmp".to_owned(),
                    format!("rw,noexec,nosuid,size={TMP_BYTES}"),
                )])),
                // Secrets, when there are any, in a volume of their own at the path agents
                // expect (`/run/secrets`), filled before the agent starts.
                mounts: Some(
                    std::iter::once(RUN_DIR)
                        .chain((!profile.agent_secrets.is_empty()).then_some(SECRETS_DIR))
                        .map(|target| Mount {
                            target: Some(target.to_owned()),
                            typ: Some(MountType::VOLUME),
                            ..Default::default()
                        })
                        .collect(),
                ),
                // The engine keeps what the agent prints in the container's log too: bounded.
                log_config: Some(HostConfigLogConfig {
                    typ: Some("json-file".to_owned()),
                    config: Some(HashMap::from([
                        ("max-size".to_owned(), "10m".to_owned()),
                        ("max-file".to_owned(), "1".to_owned()),
                    ])),
                }),
                auto_remove: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        }
    }
}

/// The run's environment: which attempt it is, its deadline, and where its secrets are (names
/// only: the init sets the variables from the files, so no value is in the container's
/// configuration).
fn env(work: &WorkItem, profile: &Profile, deadline: turnpike_core::Timestamp) -> Vec<String> {
    // The operator's configuration first: the run's own variables are named apart (checked at
    // load), and come last.
    let mut env: Vec<String> = profile
        .agent_env
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    env.extend([
        format!("TURNPIKE_TURN={}", work.turn),
        format!("TURNPIKE_ATTEMPT={}", work.attempt),
        format!("TURNPIKE_DEADLINE={deadline}"),
    ]);
    if profile.workspace_max_bytes.0 > 0 {
        env.push(format!("TURNPIKE_WORKSPACE={RUN_DIR}/workspace"));
    }
    if !profile.agent_secrets.is_empty() {
        env.push(format!("TURNPIKE_SECRETS={SECRETS_DIR}"));
        let vars = profile
            .agent_secrets
            .iter()
            .filter_map(|s| Some((s.env.as_deref()?, s.name.as_str())));
        let vars = turnpike_agent_init::secret_env(vars);
        if !vars.is_empty() {
            env.push(format!("{}={vars}", turnpike_agent_init::SECRET_ENV));
        }
    }
    env
}

/// How an attempt's container is attached, before start: stdin for the input document and both
/// output streams. Public so that the benchmarks' bare run attaches alike.
pub fn attach_options() -> AttachContainerOptions {
    AttachContainerOptionsBuilder::new()
        .stdin(true)
        .stdout(true)
        .stderr(true)
        .stream(true)
        .build()
}
