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

#[cfg(test)]
mod tests {
    use super::lost_cas;
    use async_nats::jetstream::context::{PublishError, PublishErrorKind};
    use async_nats::jetstream::kv::{UpdateError, UpdateErrorKind};

    /// The server's API error as it comes back in a publish acknowledgement.
    fn api_error(err_code: u64, description: &str) -> async_nats::jetstream::Error {
        serde_json::from_value(serde_json::json!({
            "code": 400, "err_code": err_code, "description": description
        }))
        .expect("the API error shape")
    }

    /// A KV update that lost its compare-and-set in an R3 stream, as async-nats builds it: the
    /// acknowledgement's error 10164 becomes a publish error of kind Other, then an update error
    /// of kind Other. The kind alone does not say "conflict" (what the CAS loops checked before
    /// `lost_cas`, so a kill racing a claim was refused); `lost_cas` does.
    #[test]
    fn a_lost_cas_in_a_replicated_stream_is_a_conflict_not_a_failure() {
        let ack = PublishError::with_source(
            PublishErrorKind::Other,
            api_error(10164, "wrong last sequence constant"),
        );
        let update = UpdateError::from(ack);
        assert_eq!(update.kind(), UpdateErrorKind::Other);
        assert!(lost_cas(&update));

        let single = PublishError::with_source(
            PublishErrorKind::WrongLastSequence,
            api_error(10071, "wrong last sequence: 7"),
        );
        assert!(lost_cas(&single));
        assert_eq!(
            UpdateError::from(single).kind(),
            UpdateErrorKind::WrongLastRevision
        );
    }

    #[test]
    fn other_failures_are_not_conflicts() {
        let full = UpdateError::from(PublishError::with_source(
            PublishErrorKind::Other,
            api_error(10047, "insufficient resources"),
        ));
        assert!(!lost_cas(&full));
        let io = UpdateError::with_source(
            UpdateErrorKind::Other,
            std::io::Error::other("connection reset"),
        );
        assert!(!lost_cas(&io));
        assert!(!lost_cas(&UpdateError::new(UpdateErrorKind::TimedOut)));
    }
}
