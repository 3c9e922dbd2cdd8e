/// An underlying error (async-nats', serde's, or a sentence of ours), kept as the source.
pub type Source = Box<dyn std::error::Error + Send + Sync>;

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
    #[error("could not create or update {what}: {source}")]
    Topology {
        what: String,
        #[source]
        source: Source,
    },
    #[error(
        "could not open {name}: {source} — run `turnpike setup` (or any role with manage_topology on) to create the topology"
    )]
    Bucket {
        name: &'static str,
        #[source]
        source: Source,
    },
    #[error("publish to {subject} failed: {source}")]
    Publish {
        subject: String,
        #[source]
        source: Source,
    },
    #[error("publish to {subject} refused: the attempt was superseded (fence moved)")]
    Fenced { subject: String },
    #[error("{what} failed: {source}")]
    Kv {
        what: String,
        #[source]
        source: Source,
    },
    #[error("could not encode payload: {0}")]
    Encode(#[from] turnpike_core::codec::CodecError),
}

impl BusError {
    pub(crate) fn bucket(name: &'static str, e: impl Into<Source>) -> Self {
        BusError::Bucket {
            name,
            source: e.into(),
        }
    }

    pub fn kv(what: impl Into<String>, e: impl Into<Source>) -> Self {
        BusError::Kv {
            what: what.into(),
            source: e.into(),
        }
    }

    pub fn publish(subject: impl Into<String>, e: impl Into<Source>) -> Self {
        BusError::Publish {
            subject: subject.into(),
            source: e.into(),
        }
    }

    pub fn topology(what: impl Into<String>, e: impl Into<Source>) -> Self {
        BusError::Topology {
            what: what.into(),
            source: e.into(),
        }
    }

    /// May the same request succeed if tried again later? NATS unreachable, a time-out, a lost
    /// race: yes (a consumer naks the message and it comes back). A bad setting or definition,
    /// a payload that cannot be encoded, a fence that moved: no, trying again changes nothing.
    pub fn is_transient(&self) -> bool {
        match self {
            BusError::Connect { .. }
            | BusError::Bucket { .. }
            | BusError::Publish { .. }
            | BusError::Kv { .. } => true,
            BusError::Setting(_)
            | BusError::Definition { .. }
            | BusError::Topology { .. }
            | BusError::Fenced { .. }
            | BusError::Encode(_) => false,
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
    api_error_code(e).is_some_and(|code| {
        code == ErrorCode::STREAM_WRONG_LAST_SEQUENCE
            || code == ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT
    })
}

/// The JetStream API error code somewhere in `e`'s source chain, if any.
fn api_error_code(
    e: &(dyn std::error::Error + 'static),
) -> Option<async_nats::jetstream::ErrorCode> {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(js) = err.downcast_ref::<async_nats::jetstream::Error>() {
            return Some(js.error_code());
        }
        next = err.source();
    }
    None
}

/// Was a publish refused because another publish with the same dedup id (`Nats-Msg-Id`) is still
/// being proposed? A replicated stream answers so (10158) instead of with the duplicate's ack;
/// once the other is stored, the same publish is acknowledged as a duplicate.
pub fn dedup_in_process(e: &(dyn std::error::Error + 'static)) -> bool {
    api_error_code(e) == Some(async_nats::jetstream::ErrorCode::STREAM_DUPLICATE_MESSAGE_CONFLICT)
}

#[cfg(test)]
mod tests {
    use super::{dedup_in_process, lost_cas};
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

    /// NAK (try again) or refuse: a NATS failure may pass; a fence that moved or a bad setting
    /// never will, and a message that keeps failing that way must not loop forever.
    #[test]
    fn transient_failures_are_the_ones_that_may_pass() {
        use super::BusError;
        assert!(BusError::kv("update turn t", "timed out").is_transient());
        assert!(BusError::publish("turnpike.chat.out.c", "no responders").is_transient());
        assert!(!BusError::Fenced {
            subject: "turnpike.chat.out.c".into()
        }
        .is_transient());
        assert!(!BusError::Setting("nats_url is empty".into()).is_transient());
    }

    /// The underlying error is kept as the source, not flattened into text: `lost_cas` and
    /// operators' cause chains can see it.
    #[test]
    fn the_source_is_kept() {
        use super::BusError;
        let update = UpdateError::from(PublishError::with_source(
            PublishErrorKind::Other,
            api_error(10164, "wrong last sequence constant"),
        ));
        let e = BusError::kv("update turn t", update);
        assert!(std::error::Error::source(&e).is_some());
        assert!(lost_cas(&e));
    }

    /// As the fault suite's cluster answered a kill's final status, published at once by the
    /// operator's kill and by the coordinator finishing the turn's effects.
    #[test]
    fn a_dedup_id_still_in_process_is_told_apart() {
        use super::BusError;
        let ack = PublishError::with_source(
            PublishErrorKind::Other,
            api_error(10158, "duplicate message id is in process"),
        );
        let e = BusError::publish("turnpike.chat.out.c", ack);
        assert!(dedup_in_process(&e));
        assert!(!lost_cas(&e));
        let other = PublishError::with_source(
            PublishErrorKind::Other,
            api_error(10047, "insufficient resources"),
        );
        assert!(!dedup_in_process(&BusError::publish("s", other)));
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
