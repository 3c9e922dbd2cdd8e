use std::fmt::Display;

/// What went wrong talking to NATS, with what Turnpike was doing at the time.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("cannot reach NATS at {servers}: {source} — is `turnpike up` (or nats-server) running, and is TURNPIKE_NATS_URL right?")]
    Connect {
        servers: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("bad NATS setting: {0}")]
    Setting(String),
    #[error("definition {file} in nats/ is invalid: {source}")]
    Definition {
        file: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("could not create or update {what}: {message}")]
    Topology { what: String, message: String },
    #[error(
        "could not open {name}: {message} — run `turnpike setup` (or any role with manage_topology on) to create the topology"
    )]
    Bucket { name: &'static str, message: String },
    #[error("publish to {subject} failed: {message}")]
    Publish { subject: String, message: String },
    #[error("publish to {subject} refused: the attempt was superseded (fence moved)")]
    Fenced { subject: String },
    #[error("{what} failed: {message}")]
    Kv { what: String, message: String },
    #[error("could not encode payload: {0}")]
    Encode(#[from] turnpike_core::codec::CodecError),
}

impl BusError {
    pub(crate) fn bucket(name: &'static str, e: impl Display) -> Self {
        BusError::Bucket {
            name,
            message: e.to_string(),
        }
    }

    pub fn kv(what: impl Into<String>, e: impl Display) -> Self {
        BusError::Kv {
            what: what.into(),
            message: e.to_string(),
        }
    }

    pub fn publish(subject: impl Into<String>, e: impl Display) -> Self {
        BusError::Publish {
            subject: subject.into(),
            message: e.to_string(),
        }
    }
}

/// Did a conditional write lose its compare-and-set (the subject's last sequence was not the one
/// expected)? nats-server says so with error 10071, naming the sequence, or, in a cluster while
/// other writes to the subject are still being proposed, with 10164 and a fixed text — which
/// async-nats does not map to a kind of its own (it reaches a KV update as "failed getting
/// entry"). Both mean the same: another writer was first; re-read and try again.
pub fn lost_cas(e: &(dyn std::error::Error + 'static)) -> bool {
    use async_nats::jetstream::ErrorCode;
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(js) = err.downcast_ref::<async_nats::jetstream::Error>() {
            let code = js.error_code();
            return code == ErrorCode::STREAM_WRONG_LAST_SEQUENCE
                || code == ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT;
        }
        next = err.source();
    }
    false
}
