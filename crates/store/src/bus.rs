//! The connection every role holds, with the buckets opened once.

use async_nats::jetstream::{self, kv, object_store};
use turnpike_config::Config;
use turnpike_core::backoff::Backoff;
use turnpike_core::codec::Codec;
use turnpike_core::subjects;
use turnpike_jetstream::{connect, topology, BusError};

/// A connection with every handle a role needs. Cheap to clone.
///
/// The connection and the JetStream context are public (roles publish to and consume from the
/// streams); the KV buckets and the object store are this crate's alone: every read and write of
/// stored state goes through `turnpike-store`'s modules, which is where its rules are kept.
#[derive(Clone)]
pub struct Bus {
    /// The NATS connection (plain subjects: kills, ops requests, chat output to watch).
    pub client: async_nats::Client,
    /// JetStream on it (publishing to and consuming from the streams).
    pub js: jetstream::Context,
    /// The codec this process writes with.
    pub codec: Codec,
    pub(crate) turns: kv::Store,
    pub(crate) chats: kv::Store,
    pub(crate) claims: kv::Store,
    pub(crate) live: kv::Store,
    pub(crate) runners: kv::Store,
    pub(crate) attachments: object_store::ObjectStore,
    pub(crate) workspaces: object_store::ObjectStore,
    /// Does any profile give chats a workspace (so a dispatch says which one to restore)?
    pub(crate) workspaces_used: bool,
    /// History kept per chat (`history_limit`, `history_max_bytes`).
    pub(crate) history: turnpike_core::history::Budget,
    /// Turns a chat may have waiting (`chat_queue_max`).
    pub(crate) chat_queue: usize,
    /// How long an ended turn's record (`retention_turns`), and an idle chat's record
    /// (`retention_chat`), are kept after their last write: their own TTL, so that a turn or a
    /// chat still waiting never expires.
    pub(crate) keep: Keep,
}

/// How long records are kept once nothing waits on them.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Keep {
    pub(crate) ended_turns: std::time::Duration,
    pub(crate) idle_chats: std::time::Duration,
}

impl Bus {
    /// Connect, make sure the topology exists (idempotent; unless `manage_topology` is off),
    /// and open every bucket. Fails at once if no server answers: for commands a person runs.
    pub async fn connect(config: &Config, client_name: &str) -> Result<Bus, BusError> {
        let client = connect(config, client_name).await?;
        let js = jetstream::new(client.clone());
        if config.manage_topology {
            topology::ensure(&js, config).await?;
        }
        Bus::open(client, js, config).await
    }

    /// `connect` for long-running roles: while no server answers, the cluster is still electing
    /// its leaders, or the topology is not there yet (`turnpike setup` creates it when
    /// `manage_topology` is off), wait and try again rather than exit. Only a bad setting or
    /// definition, which no wait can fix, is returned.
    pub async fn connect_patiently(config: &Config, client_name: &str) -> Result<Bus, BusError> {
        let mut waits = Backoff::doubling(
            std::time::Duration::from_millis(250),
            std::time::Duration::from_secs(5),
        );
        loop {
            match Bus::connect(config, client_name).await {
                Ok(bus) => return Ok(bus),
                Err(e @ (BusError::Setting(_) | BusError::Definition { .. })) => return Err(e),
                Err(e) => {
                    let wait = waits.wait();
                    tracing::warn!(error = %e, retry_in = ?wait, "NATS not ready for {client_name}");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Open the buckets of an existing topology (for clients that may not create it).
    pub async fn open(
        client: async_nats::Client,
        js: jetstream::Context,
        config: &Config,
    ) -> Result<Bus, BusError> {
        let kv = |name: &'static str| {
            let js = js.clone();
            async move {
                js.get_key_value(name)
                    .await
                    .map_err(|e| BusError::bucket(name, e))
            }
        };
        Ok(Bus {
            codec: config.codec,
            turns: kv(subjects::BUCKET_TURNS).await?,
            chats: kv(subjects::BUCKET_CHATS).await?,
            claims: kv(subjects::BUCKET_CLAIMS).await?,
            live: kv(subjects::BUCKET_LIVE).await?,
            runners: kv(subjects::BUCKET_RUNNERS).await?,
            attachments: js
                .get_object_store(subjects::OBJECTS_ATTACHMENTS)
                .await
                .map_err(|e| BusError::bucket(subjects::OBJECTS_ATTACHMENTS, e))?,
            workspaces: js
                .get_object_store(subjects::OBJECTS_WORKSPACES)
                .await
                .map_err(|e| BusError::bucket(subjects::OBJECTS_WORKSPACES, e))?,
            workspaces_used: config.workspaces(),
            history: turnpike_core::history::Budget {
                entries: config.history_limit,
                bytes: config.history_max_bytes.0 as usize,
            },
            chat_queue: config.chat_queue_max,
            keep: Keep {
                ended_turns: config.retention_turns,
                idle_chats: config.retention_chat,
            },
            client,
            js,
        })
    }
}

/// Every key of `bucket` (`what` it holds, for the error), as the server lists them.
pub(crate) async fn keys(bucket: &kv::Store, what: &str) -> Result<Vec<String>, BusError> {
    use futures::StreamExt;
    let err = |e: &dyn std::fmt::Display| BusError::kv(format!("list {what}"), e.to_string());
    let mut keys = bucket.keys().await.map_err(|e| err(&e))?;
    let mut out = Vec::new();
    while let Some(k) = keys.next().await {
        out.push(k.map_err(|e| err(&e))?);
    }
    Ok(out)
}
