//! Turnpike's JetStream plumbing, shared by every role: connecting, the topology (streams,
//! consumers, KV buckets, object store, defined once in the repository's `nats/` folder), typed
//! publishing and decoding with the codec named by `Content-Type`, and dead letters.

#![warn(missing_docs)]

pub mod accounts;
mod connect;
pub mod consume;
mod error;
pub mod local;
mod publish;
pub mod topology;

pub use connect::{connect, describe_servers};
pub use error::{dedup_in_process, lost_cas, persistence, BusError, Persistence, Source};
pub use publish::{
    dead_letter, dead_letter_message, decode, decode_kv, encode_headers, header_str, kv_delete,
    kv_put, now, publish, publish_inbound, refuse, skew_clock_for_tests, ttl_secs, Publish,
};

/// This machine's (or container's) host name: runner ids, presence, and health checks use it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_owned())
}
