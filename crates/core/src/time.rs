//! Wall-clock instants as plain values. The core never reads a clock: callers pass `now`.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, UTC. Serialised as RFC 3339 so `nats kv get` is readable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// From milliseconds since the Unix epoch.
    pub fn from_millis(ms: u64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the Unix epoch.
    pub fn millis(self) -> u64 {
        self.0
    }

    /// From a system time (before the epoch: the epoch).
    pub fn from_system_time(t: SystemTime) -> Self {
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        Timestamp(ms)
    }

    /// As a system time.
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0)
    }

    /// `d` later, saturating.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(d.as_millis() as u64))
    }

    /// `self - earlier`, or zero if `earlier` is later.
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// The last instant RFC 3339 can write, 9999-12-31T23:59:59.999Z.
    pub const LAST: Timestamp = Timestamp(253_402_300_799_999);

    /// RFC 3339 with millisecond precision, e.g. `2026-12-02T14:00:00.123Z`. An instant past
    /// [`Timestamp::LAST`] (a sum that ran over) is written as `LAST`, never a panic.
    pub fn to_rfc3339(self) -> String {
        humantime::format_rfc3339_millis(self.min(Self::LAST).to_system_time()).to_string()
    }

    /// From RFC 3339 text.
    pub fn parse_rfc3339(s: &str) -> Result<Self, humantime::TimestampError> {
        humantime::parse_rfc3339_weak(s).map(Self::from_system_time)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_rfc3339())
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_rfc3339())
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Timestamp::parse_rfc3339(&s)
            .map_err(|e| serde::de::Error::custom(format!("bad timestamp {s:?}: {e}")))
    }
}

/// Durations in payloads are whole milliseconds: simple in every language.
pub mod duration_ms {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Serialize as milliseconds.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    /// Deserialize from milliseconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trip() {
        let t = Timestamp(1_796_000_000_123);
        let s = t.to_rfc3339();
        assert!(s.ends_with(".123Z"), "{s}");
        assert_eq!(Timestamp::parse_rfc3339(&s).expect("parses"), t);
        let json = serde_json::to_string(&t).expect("serialises");
        assert_eq!(serde_json::from_str::<Timestamp>(&json).expect("parses"), t);
    }

    #[test]
    fn arithmetic_saturates() {
        let t = Timestamp(1000);
        assert_eq!(t.saturating_add(Duration::from_secs(10)), Timestamp(11_000));
        assert_eq!(Timestamp(5).since(Timestamp(10)), Duration::ZERO);
        assert_eq!(Timestamp(10).since(Timestamp(4)), Duration::from_millis(6));
    }
}
