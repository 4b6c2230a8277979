//! Storage backends named in configuration. `build` functions elsewhere hold the only `match`
//! on these; the request pipeline never branches on the backend.

use std::fmt;
use std::path::PathBuf;

/// Where rate-limit state (and by default idempotency records) live.
#[derive(Clone, PartialEq, Eq)]
pub enum StateBackend {
    /// In this process.
    Memory,
    /// A Redis server (`redis://…`).
    Redis(String),
}

/// Where idempotency records live.
#[derive(Clone, PartialEq, Eq)]
pub enum IdempotencyBackend {
    /// In this process, bounded by bytes.
    Memory,
    /// A Redis server.
    Redis(String),
    /// A PostgreSQL database.
    Postgres(String),
}

/// Where tenants, keys, quotas and the audit log live.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseBackend {
    /// A SQLite file (embedded default).
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres(String),
}

// === impl StateBackend ===

impl StateBackend {
    /// Parses `"memory"` or `"redis://…"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "memory" => Ok(Self::Memory),
            t if t.starts_with("redis://") || t.starts_with("rediss://") => {
                check_url(t)?;
                Ok(Self::Redis(t.to_owned()))
            }
            _ => Err(format!(
                "= {:?}: allowed \"memory\" or \"redis://host:port\"",
                redact_url(text)
            )),
        }
    }
}

impl fmt::Debug for StateBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Redis(url) => write!(f, "{}", redact_url(url)),
        }
    }
}

// === impl IdempotencyBackend ===

impl IdempotencyBackend {
    /// Parses `"memory"`, `"redis://…"` or `"postgres://…"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if is_postgres(text) {
            check_url(text)?;
            return Ok(Self::Postgres(text.to_owned()));
        }
        match StateBackend::parse(text) {
            Ok(StateBackend::Memory) => Ok(Self::Memory),
            Ok(StateBackend::Redis(url)) => Ok(Self::Redis(url)),
            Err(_) => Err(format!(
                "= {:?}: allowed \"memory\", \"redis://…\" or \"postgres://…\"",
                redact_url(text)
            )),
        }
    }
}

impl From<&StateBackend> for IdempotencyBackend {
    fn from(state: &StateBackend) -> Self {
        match state {
            StateBackend::Memory => Self::Memory,
            StateBackend::Redis(url) => Self::Redis(url.clone()),
        }
    }
}

impl fmt::Debug for IdempotencyBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Redis(url) | Self::Postgres(url) => write!(f, "{}", redact_url(url)),
        }
    }
}

// === impl DatabaseBackend ===

impl DatabaseBackend {
    /// Parses `"sqlite://path"` or `"postgres://…"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(
                    "= \"sqlite://\": a file path is required, e.g. \"sqlite://portcullis.db\""
                        .into(),
                );
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if is_postgres(text) {
            check_url(text)?;
            return Ok(Self::Postgres(text.to_owned()));
        }
        Err(format!(
            "= {:?}: allowed \"sqlite://path\" or \"postgres://user@host:port/db\"",
            redact_url(text)
        ))
    }
}

impl fmt::Debug for DatabaseBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Self::Postgres(url) => write!(f, "{}", redact_url(url)),
        }
    }
}

fn is_postgres(text: &str) -> bool {
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

fn check_url(text: &str) -> Result<(), String> {
    url::Url::parse(text)
        .map(|_| ())
        .map_err(|e| format!("= {:?}: not a valid URL ({e})", redact_url(text)))
}

/// Replaces the password of a URL with `***` so it can be logged or printed.
pub fn redact_url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        _ => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_backends() {
        assert_eq!(StateBackend::parse("memory").unwrap(), StateBackend::Memory);
        assert!(matches!(
            StateBackend::parse("redis://127.0.0.1:6379"),
            Ok(StateBackend::Redis(_))
        ));
        assert!(StateBackend::parse("mongodb://x").is_err());
        assert!(matches!(
            DatabaseBackend::parse("sqlite://a.db"),
            Ok(DatabaseBackend::Sqlite(_))
        ));
        assert!(DatabaseBackend::parse("sqlite://").is_err());
        assert!(matches!(
            IdempotencyBackend::parse("postgres://u@h/db"),
            Ok(IdempotencyBackend::Postgres(_))
        ));
    }

    #[test]
    fn redacts_passwords() {
        let shown = format!(
            "{:?}",
            DatabaseBackend::parse("postgres://u:hunter2@h/db").unwrap()
        );
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("***"));
    }
}
