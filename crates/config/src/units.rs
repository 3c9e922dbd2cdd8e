//! Durations (`10s`, `30m`, `1h 30m`, or whole seconds) and byte sizes (`512MiB`, `64m`, bytes).

use serde::de::{self, Visitor};
use serde::Deserializer;
use std::fmt;

/// A size in bytes. `k`/`m`/`g` and `KiB`/`MiB`/`GiB` are powers of 1024 (as Docker reads `512m`);
/// `KB`/`MB`/`GB` are powers of 1000.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 3] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")];
        for (size, unit) in UNITS {
            if self.0 >= size && self.0.is_multiple_of(size) {
                return write!(f, "{}{unit}", self.0 / size);
            }
        }
        write!(f, "{}B", self.0)
    }
}

/// Why a text is no byte size.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ByteSizeError {
    #[error("{0:?} is not a size; write e.g. 512MiB, 64m or 1048576")]
    NotANumber(String),
    #[error("{input:?} has unknown size unit {unit:?}; use B, KiB, MiB, GiB, KB, MB, GB")]
    UnknownUnit { input: String, unit: String },
    #[error("{0:?} is out of range")]
    OutOfRange(String),
}

pub fn parse_bytes(s: &str) -> Result<ByteSize, ByteSizeError> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| ByteSizeError::NotANumber(s.to_owned()))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        other => {
            return Err(ByteSizeError::UnknownUnit {
                input: s.to_owned(),
                unit: other.to_owned(),
            })
        }
    };
    let bytes = num * mult as f64;
    if !bytes.is_finite() || bytes < 0.0 || bytes > u64::MAX as f64 {
        return Err(ByteSizeError::OutOfRange(s.to_owned()));
    }
    Ok(ByteSize(bytes as u64))
}

pub(crate) fn deserialize_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<ByteSize, D::Error> {
    struct V;
    impl Visitor<'_> for V {
        type Value = ByteSize;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a size such as 512MiB, 64m or a number of bytes")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<ByteSize, E> {
            Ok(ByteSize(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<ByteSize, E> {
            u64::try_from(v)
                .map(ByteSize)
                .map_err(|_| E::custom(format!("size {v} is negative")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<ByteSize, E> {
            parse_bytes(v).map_err(E::custom)
        }
    }
    d.deserialize_any(V)
}

/// An optional duration, written as [`duration`] writes one.
pub mod option_duration {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::duration")] Duration);
        Option::<Wrapped>::deserialize(d).map(|w| w.map(|Wrapped(d)| d))
    }
}

pub mod duration {
    use super::*;
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 10s, 250ms, 30m or a number of seconds")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
                Ok(Duration::from_secs(v))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
                u64::try_from(v)
                    .map(Duration::from_secs)
                    .map_err(|_| E::custom(format!("duration {v} is negative")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
                Duration::try_from_secs_f64(v)
                    .map_err(|_| E::custom(format!("duration {v} is out of range")))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
                humantime::parse_duration(v.trim()).map_err(|e| {
                    E::custom(format!(
                        "{v:?} is not a duration ({e}); write e.g. 10s, 250ms or 30m"
                    ))
                })
            }
        }
        d.deserialize_any(V)
    }
}
