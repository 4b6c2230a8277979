//! Configuration errors: each names the field path and what is allowed.

use std::fmt;

/// One problem found in the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Field path, e.g. `routes[2].retry.max_retries`.
    pub path: String,
    /// What is wrong and what is allowed, e.g. `= 7: allowed 0..=5`.
    pub reason: String,
}

/// The configuration could not be used; the gateway refuses to start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read configuration file {path}: {source}")]
    Read {
        /// File path.
        path: String,
        /// Underlying error.
        source: std::io::Error,
    },
    /// TOML syntax, type errors or unknown fields.
    #[error("{path}: {message}")]
    Parse {
        /// Field path where parsing failed (or `<root>`).
        path: String,
        /// The parser's message.
        message: String,
    },
    /// Values that parse but are out of range or inconsistent; all of them are listed.
    #[error("{}", display_issues(.0))]
    Invalid(Vec<ConfigIssue>),
}

// === impl ConfigError ===

impl ConfigError {
    /// The field paths this error names (for tests and tooling).
    pub fn paths(&self) -> Vec<String> {
        match self {
            Self::Read { .. } => Vec::new(),
            Self::Parse { path, .. } => vec![path.clone()],
            Self::Invalid(issues) => issues.iter().map(|i| i.path.clone()).collect(),
        }
    }
}

fn display_issues(issues: &[ConfigIssue]) -> String {
    let mut out = String::from("invalid configuration:");
    for issue in issues {
        out.push_str(&format!("\n  {issue}"));
    }
    out
}

impl fmt::Display for ConfigIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.path, self.reason)
    }
}

/// Collects issues while validating, so one run reports every problem, not just the first.
#[derive(Debug, Default)]
pub(crate) struct Issues(Vec<ConfigIssue>);

impl Issues {
    /// No issue recorded (tests).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The paths of the issues recorded, in order (tests).
    #[cfg(test)]
    pub(crate) fn paths(&self) -> Vec<&str> {
        self.0.iter().map(|i| i.path.as_str()).collect()
    }

    pub(crate) fn push(&mut self, path: impl Into<String>, reason: impl Into<String>) {
        self.0.push(ConfigIssue {
            path: path.into(),
            reason: reason.into(),
        });
    }

    /// Checks `lo <= value <= hi` and records `path = value: allowed lo..=hi` otherwise.
    pub(crate) fn range<T>(&mut self, path: impl Into<String>, value: T, lo: T, hi: T)
    where
        T: PartialOrd + fmt::Display,
    {
        if value < lo || value > hi {
            self.push(path, format!("= {value}: allowed {lo}..={hi}"));
        }
    }

    /// The same for a duration, written back as the config spells durations (`"250ms"`).
    pub(crate) fn duration_range(
        &mut self,
        path: &str,
        value: std::time::Duration,
        lo: std::time::Duration,
        hi: std::time::Duration,
    ) {
        use super::duration::HumanDuration;
        if value < lo || value > hi {
            self.push(
                path,
                format!(
                    "= {}: allowed {}..={}",
                    HumanDuration(value),
                    HumanDuration(lo),
                    HumanDuration(hi)
                ),
            );
        }
    }

    pub(crate) fn finish(self) -> Result<(), ConfigError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(self.0))
        }
    }
}
