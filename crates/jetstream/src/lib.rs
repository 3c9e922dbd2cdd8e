//! Turnpike's JetStream plumbing, shared by every role: connecting, the topology (streams,
//! consumers, KV buckets, object store, defined once in the repository's `nats/` folder), typed
//! publishing and decoding with the codec named by `Content-Type`, and dead letters.

pub mod chats;
mod connect;
pub mod consume;
mod error;
mod publish;
pub mod topology;
pub mod turns;

pub use connect::{connect, describe_servers};
pub use error::BusError;
pub use publish::{
    dead_letter, decode, decode_kv, encode_headers, header_str, now, publish, Publish,
};

use async_nats::jetstream::{self, kv, object_store};
use turnpike_config::Config;
use turnpike_core::codec::Codec;
use turnpike_core::subjects;

/// A connection with every handle a role needs. Cheap to clone.
#[derive(Clone)]
pub struct Bus {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    /// The codec this process writes with.
    pub codec: Codec,
    pub turns: kv::Store,
    pub chats: kv::Store,
    pub claims: kv::Store,
    pub leases: kv::Store,
    pub live: kv::Store,
    pub runners: kv::Store,
    pub attachments: object_store::ObjectStore,
    /// History entries kept per chat (`history_limit`).
    pub history_limit: usize,
}

impl Bus {
    /// Connect, make sure the topology exists (idempotent), and open every bucket.
    pub async fn connect(config: &Config, client_name: &str) -> Result<Bus, BusError> {
        let client = connect(config, client_name).await?;
        let js = jetstream::new(client.clone());
        topology::ensure(&js, config).await?;
        Bus::open(client, js, config).await
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
            codec: match config.codec {
                turnpike_config::PayloadCodec::Json => Codec::Json,
                turnpike_config::PayloadCodec::Msgpack => Codec::Msgpack,
            },
            turns: kv(subjects::BUCKET_TURNS).await?,
            chats: kv(subjects::BUCKET_CHATS).await?,
            claims: kv(subjects::BUCKET_CLAIMS).await?,
            leases: kv(subjects::BUCKET_LEASES).await?,
            live: kv(subjects::BUCKET_LIVE).await?,
            runners: kv(subjects::BUCKET_RUNNERS).await?,
            attachments: js
                .get_object_store(subjects::OBJECTS_ATTACHMENTS)
                .await
                .map_err(|e| BusError::bucket(subjects::OBJECTS_ATTACHMENTS, e))?,
            history_limit: config.history_limit,
            client,
            js,
        })
    }
}
