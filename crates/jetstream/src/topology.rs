//! The streams, consumers, KV buckets and object store, defined once as JSON files in the
//! repository's `nats/` folder (the format `nats stream add --config` and `nats consumer add
//! --config` accept). Turnpike embeds those files and creates the same topology idempotently at
//! start-up; only replicas, retention, the duplicate window and the attachment store's size come
//! from the config.

use crate::BusError;
use async_nats::jetstream::{consumer, stream, Context};
use std::time::Duration;
use turnpike_config::Config;

/// Which config setting bounds a stream's storage.
#[derive(Debug, Clone, Copy)]
enum Retention {
    Chat,
    Work,
    Events,
    DeadLetters,
    Turns,
    Attachments,
    /// A chat's workspaces: kept as long as an idle chat's record, bounded by
    /// `workspaces_store_max_bytes`.
    Workspaces,
    /// No age limit on the stream: each key's writer gives it a TTL once nothing waits on it
    /// (an ended turn's record, an idle chat's, an ended turn's place in the live index), so
    /// what is still waiting never expires, however long it waits.
    PerKey,
}

impl Retention {
    fn max_age(self, c: &Config) -> Duration {
        match self {
            Retention::Chat | Retention::Workspaces => c.retention_chat,
            Retention::Work | Retention::Turns => c.retention_turns,
            Retention::Events => c.retention_events,
            Retention::DeadLetters => c.retention_dead_letters,
            Retention::Attachments => c.retention_attachments,
            Retention::PerKey => Duration::ZERO,
        }
    }
}

/// One stream definition file.
pub struct StreamFile {
    /// Its path in the repository.
    pub file: &'static str,
    /// Its contents, built in.
    pub json: &'static str,
    retention: Retention,
}

macro_rules! stream_file {
    ($name:literal, $ret:expr) => {
        StreamFile {
            file: concat!("nats/streams/", $name, ".json"),
            json: include_str!(concat!("../../../nats/streams/", $name, ".json")),
            retention: $ret,
        }
    };
}

/// One consumer definition file (`<stream>.<durable>.json`).
pub struct ConsumerFile {
    /// Its path in the repository.
    pub file: &'static str,
    /// The stream it reads.
    pub stream: &'static str,
    /// Its contents, built in.
    pub json: &'static str,
}

macro_rules! consumer_file {
    ($stream:literal, $durable:literal) => {
        ConsumerFile {
            file: concat!("nats/consumers/", $stream, ".", $durable, ".json"),
            stream: $stream,
            json: include_str!(concat!(
                "../../../nats/consumers/",
                $stream,
                ".",
                $durable,
                ".json"
            )),
        }
    };
}

/// Every stream of the topology (the KV buckets' and the object store's included), as defined in
/// `nats/streams/`, with how its retention is set from the configuration.
pub const STREAM_FILES: [StreamFile; 15] = [
    stream_file!("TURNPIKE_CHAT_IN", Retention::Chat),
    stream_file!("TURNPIKE_CHAT_OUT", Retention::Chat),
    stream_file!("TURNPIKE_WORK", Retention::Work),
    stream_file!("TURNPIKE_EVENTS", Retention::Events),
    stream_file!("TURNPIKE_DEAD", Retention::DeadLetters),
    stream_file!("KV_turnpike_turns", Retention::PerKey),
    stream_file!("KV_turnpike_chats", Retention::PerKey),
    stream_file!("KV_turnpike_claims", Retention::Turns),
    stream_file!("KV_turnpike_leases", Retention::Turns),
    stream_file!("KV_turnpike_live", Retention::PerKey),
    stream_file!("KV_turnpike_runners", Retention::Events),
    stream_file!("KV_turnpike_sessions", Retention::PerKey),
    stream_file!("KV_turnpike_profiles", Retention::PerKey),
    stream_file!("OBJ_turnpike_attachments", Retention::Attachments),
    stream_file!("OBJ_turnpike_workspaces", Retention::Workspaces),
];

/// Every durable consumer, as defined in `nats/consumers/`.
pub const CONSUMER_FILES: [ConsumerFile; 3] = [
    consumer_file!("TURNPIKE_CHAT_IN", "dispatcher"),
    consumer_file!("TURNPIKE_WORK", "runners"),
    consumer_file!("TURNPIKE_EVENTS", "coordinator"),
];

/// The stream configs as the files define them, with this config's replicas, retention and
/// duplicate window applied.
pub fn stream_configs(config: &Config) -> Result<Vec<stream::Config>, BusError> {
    STREAM_FILES
        .iter()
        .map(|f| {
            let mut s: stream::Config =
                serde_json::from_str(f.json).map_err(|source| BusError::Definition {
                    file: f.file,
                    source,
                })?;
            s.num_replicas = config.replicas;
            s.max_age = f.retention.max_age(config);
            let max_bytes = match f.retention {
                Retention::Attachments => Some(config.attachments_store_max_bytes),
                Retention::Workspaces => Some(config.workspaces_store_max_bytes),
                _ => None,
            };
            if let Some(max) = max_bytes {
                s.max_bytes = i64::try_from(max.0).unwrap_or(i64::MAX);
            }
            // The duplicate window may not exceed max_age.
            s.duplicate_window = if s.max_age.is_zero() {
                config.dedup_window
            } else {
                config.dedup_window.min(s.max_age)
            };
            Ok(s)
        })
        .collect()
}

/// The consumers' configurations, each with its stream, their replicas as configured.
pub fn consumer_configs(
    config: &Config,
) -> Result<Vec<(&'static str, consumer::pull::Config)>, BusError> {
    CONSUMER_FILES
        .iter()
        .map(|f| {
            let mut c: consumer::pull::Config =
                serde_json::from_str(f.json).map_err(|source| BusError::Definition {
                    file: f.file,
                    source,
                })?;
            c.num_replicas = config.replicas;
            Ok((f.stream, c))
        })
        .collect()
}

/// Create or update every stream and consumer. Safe to run from every process at every start.
pub async fn ensure(js: &Context, config: &Config) -> Result<(), BusError> {
    for s in stream_configs(config)? {
        let name = s.name.clone();
        let reserves = s.max_bytes;
        js.create_or_update_stream(s).await.map_err(|e| {
            // A stream with a byte limit reserves it on the server, which refuses what its store
            // (by default ¾ of the disk's free space) cannot hold: say which setting to change.
            let full = e.to_string().contains("10047");
            if full && reserves > 0 {
                let setting = if name.contains("workspaces") {
                    "workspaces_store_max_bytes"
                } else {
                    "attachments_store_max_bytes"
                };
                BusError::topology(
                    format!("stream {name}"),
                    format!(
                        "{e} — the server cannot reserve its {} ({setting}): \
                         lower that setting, or give the server more storage (free disk, or \
                         jetstream max_file_store)",
                        turnpike_config::ByteSize(u64::try_from(reserves).unwrap_or(0))
                    ),
                )
            } else {
                BusError::topology(format!("stream {name}"), e)
            }
        })?;
    }
    for (stream_name, c) in consumer_configs(config)? {
        let durable = c.durable_name.clone().unwrap_or_default();
        let what = || format!("consumer {stream_name}/{durable}");
        let stream = js
            .get_stream(stream_name)
            .await
            .map_err(|e| BusError::topology(what(), e))?;
        let created = stream.create_consumer(c.clone()).await;
        if let Err(create_err) = created {
            // Exists with other settings (an older release): update it in place.
            stream.update_consumer(c).await.map_err(|e| {
                BusError::topology(what(), format!("{create_err}; then update: {e}"))
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_definition_parses_and_picks_up_settings() {
        let config = Config {
            replicas: 3,
            retention_events: Duration::from_secs(3600),
            ..Config::default()
        };
        let streams = stream_configs(&config).expect("definitions parse");
        assert_eq!(streams.len(), STREAM_FILES.len());
        // Bounded storage: by age, or (what may wait for a long time: live turns, their chats)
        // by a TTL each key is given once nothing waits on it.
        let per_key = [
            "KV_turnpike_turns",
            "KV_turnpike_chats",
            "KV_turnpike_live",
            "KV_turnpike_sessions",
            // One key per chat an operator moved: small, and removed when moved back.
            "KV_turnpike_profiles",
        ];
        for s in &streams {
            assert_eq!(s.num_replicas, 3, "{}", s.name);
            if per_key.contains(&s.name.as_str()) {
                assert!(s.max_age.is_zero() && s.allow_message_ttl, "{}", s.name);
            } else {
                assert!(!s.max_age.is_zero(), "{} has bounded storage", s.name);
            }
        }
        let events = streams
            .iter()
            .find(|s| s.name == "TURNPIKE_EVENTS")
            .expect("events stream");
        assert_eq!(events.max_age, Duration::from_secs(3600));
        let store = streams
            .iter()
            .find(|s| s.name == "OBJ_turnpike_attachments")
            .expect("attachment store");
        assert_eq!(
            store.max_bytes as u64,
            Config::default().attachments_store_max_bytes.0
        );
        let work = streams
            .iter()
            .find(|s| s.name == "TURNPIKE_WORK")
            .expect("work stream");
        assert!(work.allow_message_schedules);
        assert_eq!(work.retention, stream::RetentionPolicy::WorkQueue);
        let consumers = consumer_configs(&config).expect("consumers parse");
        let runners = consumers
            .iter()
            .find(|(s, _)| *s == "TURNPIKE_WORK")
            .expect("runners consumer");
        assert_eq!(runners.1.filter_subject, "turnpike.work.run.>");
        // Buckets whose reads feed compare-and-set decisions are read from the stream leader:
        // a direct get may be answered by a replica that has not applied the last write yet, and
        // a turn just created would read as missing (seen in the fault suite's R3 cluster).
        for name in ["KV_turnpike_turns", "KV_turnpike_chats"] {
            let s = streams.iter().find(|s| s.name == name).expect(name);
            assert!(!s.allow_direct, "{name} must not allow direct gets");
        }
        // File names match the names inside them.
        for (f, s) in STREAM_FILES.iter().zip(&streams) {
            assert_eq!(f.file, format!("nats/streams/{}.json", s.name));
        }
    }
}
