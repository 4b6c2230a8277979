//! Human-readable durations in configuration (`"250ms"`, `"1s"`, `"24h"`).

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as a string such as `"250ms"`, `"1s"` or `"24h"`.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct HumanDuration(pub Duration);

// === impl HumanDuration ===

impl HumanDuration {
    /// `secs` seconds.
    pub const fn secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// `ms` milliseconds.
    pub const fn millis(ms: u64) -> Self {
        Self(Duration::from_millis(ms))
    }

    /// The wrapped duration.
    pub fn get(self) -> Duration {
        self.0
    }
}

impl fmt::Debug for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", humantime::format_duration(self.0))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        humantime::parse_duration(text.trim())
            .map(HumanDuration)
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid duration {text:?} ({e}); write e.g. \"250ms\", \"1s\", \"24h\""
                ))
            })
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

/// `attempt_timeout`: a duration, or `"auto"` (learned from the upstream's measured p99).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptTimeout {
    /// A fixed timeout.
    Fixed(HumanDuration),
    /// 3 × the measured p99, within `attempt_timeout_floor` and `attempt_timeout_max`.
    Auto,
}

impl<'de> Deserialize<'de> for AttemptTimeout {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.trim().eq_ignore_ascii_case("auto") {
            return Ok(Self::Auto);
        }
        humantime::parse_duration(text.trim())
            .map(|d| Self::Fixed(HumanDuration(d)))
            .map_err(|e| {
                serde::de::Error::custom(format!(
                    "invalid attempt timeout {text:?} ({e}); write \"auto\" or a duration such as \"2s\""
                ))
            })
    }
}

impl Serialize for AttemptTimeout {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Fixed(d) => d.serialize(serializer),
            Self::Auto => serializer.serialize_str("auto"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Holder {
        d: HumanDuration,
    }

    #[test]
    fn parses_common_forms() {
        for (text, expected) in [
            ("250ms", Duration::from_millis(250)),
            ("1s", Duration::from_secs(1)),
            ("24h", Duration::from_secs(86_400)),
        ] {
            let holder: Holder = toml::from_str(&format!("d = \"{text}\"")).unwrap();
            assert_eq!(holder.d.get(), expected);
        }
    }

    #[test]
    fn rejects_garbage() {
        assert!(toml::from_str::<Holder>("d = \"soon\"").is_err());
        assert!(toml::from_str::<Holder>("d = 5").is_err());
    }
}
