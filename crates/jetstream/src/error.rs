/// An underlying error (async-nats', serde's, or a sentence of ours), kept as the source.
pub type Source = Box<dyn std::error::Error + Send + Sync>;

/// What went wrong talking to NATS, with what Turnpike was doing at the time.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// No server answered at the configured address(es).
    #[error("cannot reach NATS at {servers}: {source} — is `turnpike up` (or nats-server) running, and is TURNPIKE_NATS_URL right?")]
    Connect {
        /// The servers tried, as configured.
        servers: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A connection setting that cannot work (credentials, TLS files).
    #[error("bad NATS setting: {0}")]
    Setting(String),
    /// A stream, consumer or bucket definition in `nats/` that does not parse.
    #[error("definition {file} in nats/ is invalid: {source}")]
    Definition {
        /// The definition's file name.
        file: &'static str,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// Creating or updating the topology failed.
    #[error("could not create or update {what}: {source}")]
    Topology {
        /// The stream, consumer or bucket.
        what: String,
        /// The underlying error.
        #[source]
        source: Source,
    },
    /// A bucket or object store that is not there (or cannot be opened).
    #[error(
        "could not open {name}: {source} — run `turnpike setup` (or any role with manage_topology on) to create the topology"
    )]
    Bucket {
        /// The bucket's name.
        name: &'static str,
        /// The underlying error.
        #[source]
        source: Source,
    },
    /// A publish the server did not acknowledge.
    #[error("publish to {subject} failed: {source}")]
    Publish {
        /// Where it was published.
        subject: String,
        /// The underlying error.
        #[source]
        source: Source,
    },
    /// A compare-and-set publish refused: the subject's last sequence was not the one expected
    /// (for an attempt's output, its fence moved).
    #[error("publish to {subject} refused: the attempt was superseded (fence moved)")]
    Fenced {
        /// Where it was published.
        subject: String,
    },
    /// A key-value, object store or stream request that failed.
    #[error("{what} failed: {source}")]
    Kv {
        /// What was being done, for the log.
        what: String,
        /// The underlying error.
        #[source]
        source: Source,
    },
    /// A payload that cannot be encoded.
    #[error("could not encode payload: {0}")]
    Encode(#[from] turnpike_core::codec::CodecError),
    /// A failure of our own finding that no retry can change (e.g. more messages to read than
    /// any reader may).
    #[error("{what} failed for good: {why}")]
    Unrecoverable {
        /// What was being done.
        what: String,
        /// Why it can never succeed.
        why: String,
    },
}

/// Would the same request succeed if it were made again later?
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Persistence {
    /// Perhaps: NATS unreachable, a time-out, a leader being elected, a lost race, a store that
    /// is full until retention frees it. Try again (a consumer naks the message, it comes back).
    Transient,
    /// Never: a payload over `max_payload` (the client's check, or the stream's limit), a request
    /// NATS refuses as invalid, a value that cannot be encoded, a fence that moved, a bad setting.
    /// Trying again would loop forever: the turn ends, or the message is refused.
    Permanent,
}

/// JetStream API errors that the same request will always get again: the message or its
/// headers over a limit, a request NATS finds malformed or not allowed on the stream.
const PERMANENT_API_ERRORS: [u64; 19] = [
    10003, // bad request
    10025, // invalid JSON
    10054, // message size exceeds maximum allowed
    10056, // stream name in subject does not match request
    10060, // expected stream does not match
    10070, // wrong last msg id
    10097, // header size exceeds maximum allowed of 64k
    10109, // invalid operation on sealed stream
    10165, // invalid per-message TTL
    10166, // per-message TTL is disabled
    10188, // message schedules is disabled
    10189, // message schedules pattern is invalid
    10190, // message schedules target is invalid
    10191, // message schedules invalid per-message TTL
    10192, // message schedules invalid rollup
    10193, // missing sequence for expected last sequence per subject
    10203, // message schedules source is invalid
    10212, // message schedules invalid scheduler
    10223, // message schedules time zone is invalid
];

/// Classify an error by its source chain: the first cause that says it for good decides;
/// everything else (a time-out, no responders, a closed connection, a server busy electing a
/// leader, storage full) may pass.
pub fn persistence(e: &(dyn std::error::Error + 'static)) -> Persistence {
    use async_nats::jetstream::context::PublishErrorKind as JsPublish;
    let mut next = Some(e);
    while let Some(err) = next {
        let permanent = if let Some(js) = err.downcast_ref::<async_nats::jetstream::Error>() {
            PERMANENT_API_ERRORS.contains(&js.error_code().0)
        } else if let Some(p) = err.downcast_ref::<async_nats::jetstream::context::PublishError>() {
            p.kind() == JsPublish::MaxPayloadExceeded
        } else if let Some(p) = err.downcast_ref::<async_nats::client::PublishError>() {
            p.kind() == async_nats::client::PublishErrorKind::MaxPayloadExceeded
        } else if let Some(r) = err.downcast_ref::<async_nats::RequestError>() {
            r.kind() == async_nats::RequestErrorKind::MaxPayloadExceeded
        } else if let Some(c) = err.downcast_ref::<turnpike_core::codec::CodecError>() {
            // Our own payload that will not encode; a decode error is the caller's to judge.
            matches!(
                c,
                turnpike_core::codec::CodecError::MsgpackEncode(_)
                    | turnpike_core::codec::CodecError::Json(_)
            )
        } else {
            false
        };
        if permanent {
            return Persistence::Permanent;
        }
        next = err.source();
    }
    Persistence::Transient
}

impl BusError {
    /// A bucket or object store that could not be opened.
    pub fn bucket(name: &'static str, e: impl Into<Source>) -> Self {
        BusError::Bucket {
            name,
            source: e.into(),
        }
    }

    /// A failed key-value, object store or stream request, saying what it was for.
    pub fn kv(what: impl Into<String>, e: impl Into<Source>) -> Self {
        BusError::Kv {
            what: what.into(),
            source: e.into(),
        }
    }

    /// A publish to `subject` that failed.
    pub fn publish(subject: impl Into<String>, e: impl Into<Source>) -> Self {
        BusError::Publish {
            subject: subject.into(),
            source: e.into(),
        }
    }

    /// Creating or updating `what` in the topology failed.
    pub fn topology(what: impl Into<String>, e: impl Into<Source>) -> Self {
        BusError::Topology {
            what: what.into(),
            source: e.into(),
        }
    }

    /// May the same request succeed if tried again later ([`persistence`] of its cause)? NATS
    /// unreachable, a time-out, a lost race: yes (a consumer naks the message and it comes
    /// back). A payload too large, a request NATS refuses as invalid, a bad setting or
    /// definition, a payload that cannot be encoded, a fence that moved: no.
    pub fn persistence(&self) -> Persistence {
        match self {
            BusError::Connect { .. } | BusError::Bucket { .. } => Persistence::Transient,
            BusError::Publish { source, .. } | BusError::Kv { source, .. } => {
                persistence(source.as_ref())
            }
            BusError::Setting(_)
            | BusError::Definition { .. }
            | BusError::Topology { .. }
            | BusError::Fenced { .. }
            | BusError::Encode(_)
            | BusError::Unrecoverable { .. } => Persistence::Permanent,
        }
    }

    /// [`BusError::persistence`] is transient.
    pub fn is_transient(&self) -> bool {
        self.persistence() == Persistence::Transient
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

    /// Issue 32: the classification, case by case, as async-nats builds each error. A payload
    /// over the limit (the client's check, or the stream's `max_msg_size` answer 10054) and a
    /// request NATS refuses as invalid are permanent; what a wait may cure is transient.
    #[test]
    fn errors_are_classified_by_what_a_retry_could_change() {
        use super::{persistence, BusError, Persistence::*};
        use async_nats::jetstream::kv::{CreateError, CreateErrorKind};
        let acked = |code: u64, text: &str| {
            PublishError::with_source(PublishErrorKind::Other, api_error(code, text))
        };
        let too_large_here = || {
            PublishError::with_source(
                PublishErrorKind::MaxPayloadExceeded,
                "Payload size limit of 1048576 exceeded by message size of 1080572",
            )
        };
        let table: Vec<(&str, BusError, super::Persistence)> = vec![
            (
                "a KV update over max_payload (client check)",
                BusError::kv("update turn t", UpdateError::from(too_large_here())),
                Permanent,
            ),
            (
                "a KV create over max_payload",
                BusError::kv(
                    "create turn t",
                    CreateError::with_source(
                        CreateErrorKind::Other,
                        UpdateError::from(too_large_here()),
                    ),
                ),
                Permanent,
            ),
            (
                "a publish over the stream's max_msg_size (10054)",
                BusError::publish(
                    "turnpike.work.run.t",
                    acked(10054, "message size exceeds maximum allowed"),
                ),
                Permanent,
            ),
            (
                "headers over 64k (10097)",
                BusError::publish(
                    "s",
                    acked(10097, "header size exceeds maximum allowed of 64k"),
                ),
                Permanent,
            ),
            (
                "an invalid schedule (10190)",
                BusError::publish("s", acked(10190, "message schedules target is invalid")),
                Permanent,
            ),
            (
                "a core publish over max_payload",
                BusError::publish(
                    "turnpike.control.kill.t",
                    async_nats::client::PublishError::new(
                        async_nats::client::PublishErrorKind::MaxPayloadExceeded,
                    ),
                ),
                Permanent,
            ),
            (
                "a payload that will not encode",
                BusError::Encode(turnpike_core::codec::CodecError::Json(
                    serde_json::from_str::<u8>("x").expect_err("not a number"),
                )),
                Permanent,
            ),
            (
                "a moved fence",
                BusError::Fenced {
                    subject: "s".into(),
                },
                Permanent,
            ),
            ("a bad setting", BusError::Setting("x".into()), Permanent),
            (
                "more to read than any reader may",
                BusError::Unrecoverable {
                    what: "count".into(),
                    why: "too many".into(),
                },
                Permanent,
            ),
            (
                "a time-out",
                BusError::kv("update turn t", UpdateError::new(UpdateErrorKind::TimedOut)),
                Transient,
            ),
            (
                "storage full (10047)",
                BusError::publish(
                    "s",
                    acked(10047, "insufficient storage resources available"),
                ),
                Transient,
            ),
            (
                "no leader yet (10008)",
                BusError::publish(
                    "s",
                    acked(10008, "JetStream system temporarily unavailable"),
                ),
                Transient,
            ),
            (
                "a lost compare-and-set (10071)",
                BusError::kv(
                    "update",
                    UpdateError::from(acked(10071, "wrong last sequence: 7")),
                ),
                Transient,
            ),
            (
                "a duplicate still in process (10158)",
                BusError::publish("s", acked(10158, "duplicate message id is in process")),
                Transient,
            ),
            (
                "a dropped connection",
                BusError::kv("read", std::io::Error::other("connection reset")),
                Transient,
            ),
            (
                "NATS unreachable",
                BusError::Connect {
                    servers: "nats://x".into(),
                    source: "refused".into(),
                },
                Transient,
            ),
        ];
        for (case, err, expected) in table {
            assert_eq!(err.persistence(), expected, "{case}: {err}");
            assert_eq!(err.is_transient(), expected == Transient, "{case}");
        }
        // The same judgement on a bare cause, for callers holding async-nats' own error.
        assert_eq!(persistence(&UpdateError::from(too_large_here())), Permanent);
        assert_eq!(
            persistence(&UpdateError::new(UpdateErrorKind::TimedOut)),
            Transient
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
