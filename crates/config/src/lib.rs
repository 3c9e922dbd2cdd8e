//! Turnpike's configuration: one typed struct, read from defaults < `turnpike.toml` < environment.
//!
//! The file is `turnpike.toml` in the working directory, or the one named by `--config FILE` or
//! `$TURNPIKE_CONFIG`. Every key can be set in the file by its field name (`runner_slots = 4`) and
//! in the environment as `TURNPIKE_<FIELD>` in upper case (`TURNPIKE_RUNNER_SLOTS=4`). The retry
//! budget is also read from `MAX_TURN_RETRY`, by that exact name, which wins over
//! `TURNPIKE_MAX_TURN_RETRY`.
//!
//! Durations are written like `10s`, `250ms`, `30m`, `1h 30m` (or whole seconds); sizes like
//! `512MiB`, `64m` (k/m/g and KiB/MiB/GiB are powers of 1024, KB/MB/GB of 1000). A bad value stops
//! the program with one error naming the key and the value.
//!
//! `docs/configuration.md` is generated from this file's doc comments (`tests/doc.rs` checks it
//! is current; `TURNPIKE_BLESS=1 cargo test -p turnpike-config --test doc` rewrites it).

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub mod egress;
mod profiles;
mod secrets;
mod units;
mod validate;
pub use profiles::{
    check_profile_name, Profile, ProfileSettings, DEFAULT_PROFILE, PROFILE_NAME_MAX,
};
pub use secrets::{parse_agent_secrets, AgentSecret, SECRET_NAME_MAX};
pub use units::{parse_bytes, ByteSize, ByteSizeError};

/// The file read when no other is named (in the working directory).
pub const DEFAULT_FILE: &str = "turnpike.toml";
/// Names a different config file.
pub const FILE_ENV: &str = "TURNPIKE_CONFIG";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// One container per attempt through the local Docker Engine.
    Docker,
    /// One child process per attempt (`agent_command`), for machines without Docker and fast tests.
    Process,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Docker => "docker",
            Backend::Process => "process",
        })
    }
}

/// The payload codec: core's, so config and the wire can never disagree on the names.
use turnpike_core::codec::Codec;

/// Every setting, with its default. Each field's doc comment is its documentation
/// (`docs/configuration.md` is generated from them), so every field has one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Config {
    // --- NATS ---------------------------------------------------------------------------------
    /// One server or a comma-separated list (`nats://a:4222,nats://b:4222`).
    pub nats_url: String,
    /// A `.creds` file (JWT + nkey seed).
    pub nats_creds: Option<PathBuf>,
    /// User name, with `nats_password` or `nats_password_file`.
    pub nats_user: Option<String>,
    /// Password of `nats_user`.
    pub nats_password: Option<String>,
    /// A file holding the password (credentials mounted as files, e.g. Docker secrets);
    /// trailing white space is ignored.
    pub nats_password_file: Option<PathBuf>,
    /// Token authentication.
    pub nats_token: Option<String>,
    /// Prefix of this client's reply subjects (default `_INBOX`; `_INBOX_<role>` in the cluster),
    /// so NATS permissions can give each role only its own replies.
    pub nats_inbox_prefix: Option<String>,
    /// Require TLS; with `nats_tls_ca` to trust a private CA, and cert + key for mutual TLS.
    pub nats_tls: bool,
    /// A CA certificate (PEM) to trust for the servers.
    pub nats_tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM), for mutual TLS; with `nats_tls_key`.
    pub nats_tls_cert: Option<PathBuf>,
    /// This client's private key (PEM), for mutual TLS.
    pub nats_tls_key: Option<PathBuf>,
    /// Replicas of every stream and bucket: 1 on one server, 3 in a cluster.
    pub replicas: usize,
    /// Create or update the streams, consumers and buckets at start-up. Roles that run with
    /// least-privilege credentials set it to false and wait for `turnpike setup` to do it.
    pub manage_topology: bool,
    /// Codec for payloads Turnpike writes: `json` or `msgpack` (readers accept both).
    pub codec: Codec,

    // --- Retries ------------------------------------------------------------------------------
    /// Attempts a turn may get, the first included; **0 and 1 both mean one attempt, no
    /// retries**. Also read as `MAX_TURN_RETRY`. Stored in each turn when it is created, so
    /// changing it never alters a turn in flight. At most 100 (the turn record holds every
    /// attempt, and must fit `max_payload`).
    pub max_turn_retry: u32,
    /// Flat delay between a death and the next attempt.
    #[serde(with = "units::duration")]
    pub retry_delay: Duration,

    // --- Runs ---------------------------------------------------------------------------------
    /// Run time limit of one attempt.
    #[serde(with = "units::duration")]
    pub run_timeout: Duration,
    /// Memory limit of one attempt (swap disabled).
    pub memory_limit: ByteSize,
    /// Process limit of one attempt's container.
    pub pids_limit: i64,
    /// CPUs of one attempt's container (fractions allowed).
    pub cpus: f64,
    /// Docker network mode of agent containers: `none`, `bridge`, or a network name (never
    /// `host`, nor `container:<id>`, which would share another container's network).
    pub network_mode: String,
    /// Where agents may connect, comma-separated `host:port` (e.g. `api.openai.com:443`;
    /// `*.example.com:443` for every name below example.com). Empty: no list, the network is
    /// `network_mode`'s. With a list (docker backend), each attempt's container is on an
    /// internal network of its own with no route out, beside a proxy container the runner
    /// starts (`egress_proxy_image`) that opens HTTP CONNECT tunnels and plain HTTP requests
    /// to the listed destinations only; the agent gets `HTTPS_PROXY`/`HTTP_PROXY`. Names are
    /// matched as written, never by the address they resolve to. Needs `network_mode = "none"`.
    /// The process backend sets the same proxy variables but cannot stop a direct connection.
    pub egress_allow: String,
    /// Size of each chat's workspace (0: none): a directory the agent finds at
    /// `$TURNPIKE_WORKSPACE` that persists between the chat's turns, on any runner. It is
    /// restored into every attempt and saved only when an attempt ends its turn cleanly while
    /// it holds the turn's fence; a killed, dead or superseded attempt's writes are discarded,
    /// so a retry starts from the workspace its first attempt saw. A workspace over this size
    /// at the end of a run is not saved. Kept in JetStream's object store
    /// (`turnpike_workspaces`): the current version and the one before; a workspace not saved
    /// for `retention_chat` expires.
    pub workspace_max_bytes: ByteSize,
    /// Bytes the workspace store may hold (per replica), every chat's together.
    pub workspaces_store_max_bytes: ByteSize,
    /// Image of the egress proxy (docker backend; runs `egress-proxy` with the attempt's list).
    pub egress_proxy_image: String,
    /// The Docker network the egress proxy reaches the allowed destinations through (`bridge`,
    /// or a network of yours where the agent's endpoints live).
    pub egress_network: String,
    /// Directory of the secrets agents may be given, one file each, named as the secret: e.g.
    /// `/run/secrets` in a runner's container, where Docker and compose put secrets. Read at
    /// every attempt, so a rotated file is used from the next attempt on. A value never enters
    /// a record, a stream, a log line or an error; the runner takes every value out of what an
    /// agent prints (values under 8 bytes excepted: too likely to occur by chance).
    pub secrets_dir: Option<PathBuf>,
    /// The secrets each agent gets, comma-separated: `name` (the file `/run/secrets/<name>` in
    /// its container; `$TURNPIKE_SECRETS/<name>` with the process backend) or `name:ENV_VAR`
    /// (also the variable `ENV_VAR`, holding the file without its trailing newline), e.g.
    /// `openai_key:OPENAI_API_KEY`. Needs `secrets_dir`; an attempt whose secret is missing
    /// could not start.
    pub agent_secrets: String,
    /// Variables every agent gets, e.g. `{ LLM_URL = "http://llm:8080/v1", LLM_MODEL = "small" }`
    /// (in the environment: `TURNPIKE_AGENT_ENV='{LLM_URL="http://llm:8080/v1"}'`): how an
    /// operator configures an agent without rebuilding its image. Names are upper case, not
    /// `TURNPIKE_*` nor one the run sets; values are plain configuration, visible in
    /// `turnpike runner container-spec` and to `docker inspect`: keys go in `agent_secrets`.
    pub agent_env: std::collections::BTreeMap<String, String>,
    /// Named resource profiles, each a table of any of `memory_limit`, `cpus`, `pids_limit`,
    /// `run_timeout`, `agent_image`, `agent_secrets`, `agent_env`, `network_mode`, `egress_allow` and `workspace_max_bytes` (the rest: the settings
    /// above), e.g. `[profiles.big]` `memory_limit = "2GiB"`. Chats are moved between profiles
    /// at run time (`turnpike chats profile <chat> <profile>`); a turn's attempt runs with its
    /// chat's profile as it was when the attempt was dispatched. The retry budget is not a
    /// profile's: it is the same for every chat. Every runner needs every profile. In the
    /// environment: `TURNPIKE_PROFILES='{big={memory_limit="2GiB"}}'`.
    pub profiles: std::collections::BTreeMap<String, ProfileSettings>,
    /// The profile of chats not moved to one (`default`: the settings above).
    pub default_profile: String,
    /// User agent containers run as: `uid[:gid]`, numbers, neither 0 (read as the engine reads
    /// them: `00` and `+0` are root too; a name is refused, since the image decides what it is).
    pub agent_user: String,
    /// Time between the polite stop and the kill, for time limits, drains and operator kills.
    #[serde(with = "units::duration")]
    pub stop_grace: Duration,

    // --- Limits (every payload fits max_payload) ----------------------------------------------
    /// The largest message the NATS servers accept (their `max_payload`). Every payload
    /// Turnpike builds is budgeted to fit it (the limits here are checked against it at start),
    /// and a role refuses to start against servers that accept less.
    pub max_payload: ByteSize,
    /// Largest inbound message accepted, counted whole and encoded (text, sender, attachment
    /// list, as JSON or MessagePack writes them, escapes included); larger ones are refused with
    /// a notice. Also the longest bot message or status line landed (longer ones are cut, with
    /// a marker).
    pub message_max_bytes: ByteSize,
    /// Bot messages one attempt may land; the agent's further messages are not delivered, the
    /// chat is told once that the reply was cut, and the turn counts as replied.
    pub attempt_messages_max: u32,
    /// Encoded bytes of bot messages one attempt may land (as `attempt_messages_max`).
    pub attempt_bytes_max: ByteSize,
    /// Inbound and bot messages kept as history for a new turn.
    pub history_limit: usize,
    /// Encoded bytes of history given to a turn (each entry as JSON writes it, escapes
    /// included): the oldest entries are left out first (with a note saying so), so a chat of
    /// long replies can never outgrow what NATS carries.
    pub history_max_bytes: ByteSize,
    /// Messages a chat may have waiting behind its running turn; more are refused with a notice
    /// (the chat's record, which holds its queue, must fit `max_payload`).
    pub chat_queue_max: usize,
    /// Attachments one inbound message may list.
    pub attachments_max: usize,
    /// Largest attachment accepted.
    pub attachment_max_bytes: ByteSize,
    /// Bytes all of one message's attachments may add up to.
    pub attachments_max_total_bytes: ByteSize,
    /// Bytes the attachment store may hold (per replica); when full, uploads are refused by
    /// NATS, so a flood of attachments cannot fill the servers' disks.
    pub attachments_store_max_bytes: ByteSize,

    // --- Runner -------------------------------------------------------------------------------
    /// Stable id of this runner (default: the host name). A host name with characters an id
    /// cannot hold is cleaned and gets a short hash of the original, so two names never share
    /// an id.
    pub runner_id: Option<String>,
    /// Attempts this runner runs at once.
    pub runner_slots: u32,
    /// `docker` (one container per attempt) or `process` (one child process per attempt);
    /// `turnpike up` uses `process` unless this is set.
    pub runner_backend: Backend,
    /// Image of agent containers (docker backend).
    pub agent_image: String,
    /// Image holding the watchdog, `/turnpike-agent-init` (docker backend): a runner copies it
    /// into every agent container as its PID 1, which stops the agent when the runner stops
    /// renewing the attempt's lease. Built by deploy/build-images.sh; a runner refuses to start
    /// without it.
    pub agent_init_image: String,
    /// The Docker Engine's socket (docker backend), e.g. `unix:///run/user/1000/docker.sock`
    /// (default: `$DOCKER_HOST`, else the local socket).
    pub docker_host: Option<String>,
    /// Agent command line (process backend), split on whitespace.
    pub agent_command: Option<String>,
    /// Where the process backend makes each attempt's fresh working directory (default: the
    /// system's temporary directory, `$TMPDIR` or `/tmp`). A tmpfs here (e.g. `/dev/shm`) saves a
    /// journalled `mkdir` and `rmdir` per attempt on disk-backed file systems.
    pub scratch_dir: Option<PathBuf>,
    /// A claim not renewed for this long is dead (runner lost).
    #[serde(with = "units::duration")]
    pub lease: Duration,
    /// How often a runner renews its claims and presence (at most half of `lease`).
    #[serde(with = "units::duration")]
    pub heartbeat: Duration,

    // --- Coordinator --------------------------------------------------------------------------
    /// How long the coordinator holds an attempt's start for more of its events, so that a short
    /// run's start and exit reach the turn record in one write instead of two (`0s`: a start is
    /// written at once; events that arrive together are still written together). The turn shows
    /// "running", and names its runner, up to this much later: a reply may be visible before
    /// the record says who runs the attempt. At most `10s`.
    #[serde(with = "units::duration")]
    pub event_batch_wait: Duration,

    // --- Retention (storage stays bounded) ----------------------------------------------------
    /// Ended turns' records, claims and work items are kept this long after their last write. A
    /// turn that has not ended is kept however long it waits (its record has no TTL until it
    /// ends). Longer than the longest run (`run_timeout` + `stop_grace` + `lease`).
    #[serde(with = "units::duration")]
    pub retention_turns: Duration,
    /// Runner events and runner presence.
    #[serde(with = "units::duration")]
    pub retention_events: Duration,
    /// Inbound and outbound chat streams, and chat records once idle (a chat with a live or
    /// waiting turn is kept however long that takes).
    #[serde(with = "units::duration")]
    pub retention_chat: Duration,
    /// Attachments in the object store.
    #[serde(with = "units::duration")]
    pub retention_attachments: Duration,
    /// Dead letters.
    #[serde(with = "units::duration")]
    pub retention_dead_letters: Duration,
    /// JetStream duplicate window (dedup by `Nats-Msg-Id`). At least `1m`: a turn's notice is
    /// sent once because its dedup id holds this long, while one process may carry out the
    /// turn's last effects and another find them still owed.
    #[serde(with = "units::duration")]
    pub dedup_window: Duration,

    // --- Dashboard -----------------------------------------------------------------------------
    /// Where `turnpike dashboard` listens (`turnpike up` starts it here too).
    pub dashboard_listen: String,
    /// Operators who may log in: one `name:hash` per line (`turnpike dashboard hash-password`
    /// prints a hash). Required: the dashboard does not start without operators.
    pub dashboard_users_file: Option<PathBuf>,
    /// A secret (32 bytes or more) that signs sessions; dashboards sharing it accept each other's
    /// sessions. Default: a random key per process (a restart logs everyone out).
    pub dashboard_session_key_file: Option<PathBuf>,
    /// How long a login lasts.
    #[serde(with = "units::duration")]
    pub dashboard_session_ttl: Duration,
    /// Mark the session cookie `Secure` (set it when the dashboard is reached over HTTPS, e.g.
    /// behind a TLS-terminating proxy).
    pub dashboard_secure_cookie: bool,
    /// Proxies in front of the dashboard whose `X-Forwarded-For` is believed: comma-separated
    /// addresses or networks (`10.0.0.0/8`). Logins are limited per client address: without
    /// this, operators behind one proxy share one address and one limit; a header from anyone
    /// else is ignored.
    pub dashboard_trusted_proxies: Option<String>,
    /// Serve the dashboard over HTTPS with this certificate chain and key (PEM files); both or
    /// neither. With TLS, the session cookie is `Secure`.
    pub dashboard_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of `dashboard_tls_cert`.
    pub dashboard_tls_key: Option<PathBuf>,
    /// Where a role serves its own `/metrics` (Prometheus text format), e.g. `0.0.0.0:9464`;
    /// off when unset. `turnpike up` serves all its roles' there.
    pub metrics_listen: Option<String>,

    // --- Local pipeline (`turnpike up`) -------------------------------------------------------
    /// Where `turnpike up` keeps nats-server's store (default: `~/.local/state/turnpike`).
    pub state_dir: Option<PathBuf>,
    /// Log filter (`info`, `turnpike=debug`, … as for `RUST_LOG`, which wins when set). Logs are
    /// coloured only on a terminal, and never with `NO_COLOR` set.
    pub log: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nats_url: "nats://127.0.0.1:4222".into(),
            nats_creds: None,
            nats_user: None,
            nats_password: None,
            nats_password_file: None,
            nats_token: None,
            nats_inbox_prefix: None,
            nats_tls: false,
            nats_tls_ca: None,
            nats_tls_cert: None,
            nats_tls_key: None,
            replicas: 1,
            manage_topology: true,
            codec: Codec::Json,
            max_payload: ByteSize(turnpike_core::sizes::NATS_DEFAULT_MAX_PAYLOAD as u64),
            max_turn_retry: 3,
            retry_delay: Duration::from_secs(10),
            run_timeout: Duration::from_secs(30 * 60),
            memory_limit: ByteSize(512 * 1024 * 1024),
            pids_limit: 256,
            cpus: 1.0,
            network_mode: "none".into(),
            egress_allow: String::new(),
            workspace_max_bytes: ByteSize(0),
            workspaces_store_max_bytes: ByteSize(1024 * 1024 * 1024),
            egress_proxy_image: "turnpike:latest".into(),
            egress_network: "bridge".into(),
            agent_user: "65534:65534".into(),
            stop_grace: Duration::from_secs(10),
            secrets_dir: None,
            agent_secrets: String::new(),
            agent_env: Default::default(),
            profiles: Default::default(),
            default_profile: profiles::DEFAULT_PROFILE.into(),
            attachment_max_bytes: ByteSize(10 * 1024 * 1024),
            history_limit: 50,
            history_max_bytes: ByteSize(256 * 1024),
            message_max_bytes: ByteSize(64 * 1024),
            attempt_messages_max: 1000,
            attempt_bytes_max: ByteSize(8 * 1024 * 1024),
            chat_queue_max: 1000,
            attachments_max: 16,
            attachments_max_total_bytes: ByteSize(64 * 1024 * 1024),
            attachments_store_max_bytes: ByteSize(1024 * 1024 * 1024),
            runner_id: None,
            runner_slots: 2,
            runner_backend: Backend::Docker,
            agent_image: "turnpike-test-agent:latest".into(),
            agent_init_image: "turnpike-agent-init:latest".into(),
            docker_host: None,
            agent_command: None,
            scratch_dir: None,
            lease: Duration::from_secs(15),
            heartbeat: Duration::from_secs(5),
            event_batch_wait: Duration::ZERO,
            retention_turns: Duration::from_secs(7 * 24 * 3600),
            retention_events: Duration::from_secs(7 * 24 * 3600),
            retention_chat: Duration::from_secs(30 * 24 * 3600),
            retention_attachments: Duration::from_secs(7 * 24 * 3600),
            retention_dead_letters: Duration::from_secs(30 * 24 * 3600),
            dedup_window: Duration::from_secs(120),
            dashboard_listen: "127.0.0.1:8080".into(),
            dashboard_users_file: None,
            dashboard_session_key_file: None,
            dashboard_session_ttl: Duration::from_secs(12 * 3600),
            dashboard_secure_cookie: false,
            dashboard_trusted_proxies: None,
            dashboard_tls_cert: None,
            dashboard_tls_key: None,
            metrics_listen: None,
            state_dir: None,
            log: "info".into(),
        }
    }
}

/// A configuration that could not be read or makes no sense. The message names the key and value.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid configuration: {0}")]
    Extract(#[from] Box<figment::Error>),
    #[error("invalid configuration: {key} = {value:?}: {why}")]
    Invalid {
        key: &'static str,
        value: String,
        why: String,
    },
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
}

impl Config {
    /// Defaults < `file` (or `$TURNPIKE_CONFIG`, or `./turnpike.toml` if present) < environment.
    pub fn load(file: Option<&Path>) -> Result<Config, ConfigError> {
        let file = match file {
            Some(f) => Some(f.to_path_buf()),
            None => std::env::var_os(FILE_ENV).map(PathBuf::from),
        };
        if let Some(f) = &file {
            if !f.exists() {
                return Err(ConfigError::MissingFile(f.clone()));
            }
        }
        let file = file.unwrap_or_else(|| PathBuf::from(DEFAULT_FILE));
        Self::figment(&file).extract_config()
    }

    /// The layered sources, for callers (and tests) that add their own on top.
    pub fn figment(file: &Path) -> Figment {
        Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::file(file))
            .merge(Env::prefixed("TURNPIKE_").ignore(&["config"]))
            .merge(Env::raw().only(&["MAX_TURN_RETRY"]))
    }

    /// The server list of `nats_url`.
    pub fn nats_servers(&self) -> Vec<String> {
        self.nats_url
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Attempts a turn gets with this `max_turn_retry` (core's rule: 0 and 1 both mean one).
    pub fn attempt_limit(&self) -> u32 {
        turnpike_core::lifecycle::attempt_limit(self.max_turn_retry)
    }

    /// What each growing part of a payload may take, for core's size checks.
    pub fn budgets(&self) -> turnpike_core::sizes::Budgets {
        let usize_of = |b: ByteSize| usize::try_from(b.0).unwrap_or(usize::MAX);
        turnpike_core::sizes::Budgets {
            max_payload: usize_of(self.max_payload),
            message: usize_of(self.message_max_bytes),
            history: usize_of(self.history_max_bytes),
            attempts: self.attempt_limit(),
            chat_queue: self.chat_queue_max,
        }
    }

    /// The secrets each agent gets (`agent_secrets`).
    pub fn agent_secrets(&self) -> Result<Vec<AgentSecret>, ConfigError> {
        parse_agent_secrets(&self.agent_secrets).map_err(|why| ConfigError::Invalid {
            key: "agent_secrets",
            value: self.agent_secrets.clone(),
            why,
        })
    }

    /// The limits an inbound message is checked against.
    pub fn inbound_limits(&self) -> turnpike_core::wire::InboundLimits {
        turnpike_core::wire::InboundLimits {
            message_max: usize::try_from(self.message_max_bytes.0).unwrap_or(usize::MAX),
            attachments_max: self.attachments_max,
        }
    }
}

/// Extraction plus validation, shared by `load` and tests that build their own figment.
pub trait ExtractConfig {
    fn extract_config(&self) -> Result<Config, ConfigError>;
}

impl ExtractConfig for Figment {
    fn extract_config(&self) -> Result<Config, ConfigError> {
        let config: Config = self.extract().map_err(Box::new)?;
        config.validate()
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        units::deserialize_bytes(d)
    }
}

#[cfg(test)]
mod tests;
