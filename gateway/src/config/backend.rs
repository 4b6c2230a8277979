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
    /// A Redis/Valkey Cluster (`redis-cluster://h1:p1,h2:p2,…`): its seed nodes, each as
    /// `redis://[user:password@]host:port`.
    RedisCluster(Vec<String>),
}

/// Where idempotency records live.
#[derive(Clone, PartialEq, Eq)]
pub enum IdempotencyBackend {
    /// In this process, bounded by bytes.
    Memory,
    /// A Redis server.
    Redis(String),
    /// A Redis/Valkey Cluster: its seed nodes, as in [`StateBackend::RedisCluster`].
    RedisCluster(Vec<String>),
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
    /// Parses `"memory"`, `"redis://…"` or `"redis-cluster://host:port,host:port,…"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "memory" => Ok(Self::Memory),
            t if t.starts_with("redis://") || t.starts_with("rediss://") => {
                check_url(t)?;
                Ok(Self::Redis(t.to_owned()))
            }
            t if t.starts_with(TLS_CLUSTER_SCHEME) => {
                parse_cluster(t, TLS_CLUSTER_SCHEME, "rediss").map(Self::RedisCluster)
            }
            t if t.starts_with(CLUSTER_SCHEME) => {
                parse_cluster(t, CLUSTER_SCHEME, "redis").map(Self::RedisCluster)
            }
            _ => Err(format!(
                "= {:?}: allowed \"memory\", \"redis://host:port\" or \
                 \"redis-cluster://host:port,host:port,…\"",
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
            Self::RedisCluster(nodes) => f.write_str(&cluster_display(nodes)),
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
            Ok(state) => Ok(Self::from(&state)),
            // A cluster URL that is wrong says what is wrong with it.
            Err(reason)
                if text.starts_with(CLUSTER_SCHEME) || text.starts_with(TLS_CLUSTER_SCHEME) =>
            {
                Err(reason)
            }
            Err(_) => Err(format!(
                "= {:?}: allowed \"memory\", \"redis://…\", \"redis-cluster://…\" or \
                 \"postgres://…\"",
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
            StateBackend::RedisCluster(nodes) => Self::RedisCluster(nodes.clone()),
        }
    }
}

impl fmt::Debug for IdempotencyBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Memory => f.write_str("memory"),
            Self::Redis(url) | Self::Postgres(url) => write!(f, "{}", redact_url(url)),
            Self::RedisCluster(nodes) => f.write_str(&cluster_display(nodes)),
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

/// Where the messages of asynchronous routes live (docs/async-delivery.md).
#[derive(Clone, PartialEq, Eq)]
pub enum QueueBackend {
    /// A SQLite file (the embedded default).
    Sqlite(PathBuf),
    /// A PostgreSQL database.
    Postgres(String),
    /// A Redis server (Redis Streams).
    Redis(String),
    /// A Redis/Valkey Cluster: its seed nodes, as in [`StateBackend::RedisCluster`].
    RedisCluster(Vec<String>),
}

// === impl QueueBackend ===

impl QueueBackend {
    /// Parses `"sqlite://path"`, `"postgres://…"`, `"redis://…"` or `"redis-cluster://…"`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.starts_with("sqlite://") || is_postgres(text) {
            return DatabaseBackend::parse(text).map(|db| match db {
                DatabaseBackend::Sqlite(path) => Self::Sqlite(path),
                DatabaseBackend::Postgres(url) => Self::Postgres(url),
            });
        }
        match StateBackend::parse(text) {
            Ok(StateBackend::Redis(url)) => Ok(Self::Redis(url)),
            Ok(StateBackend::RedisCluster(nodes)) => Ok(Self::RedisCluster(nodes)),
            Ok(StateBackend::Memory) | Err(_) => Err(format!(
                "= {:?}: allowed \"sqlite://path\", \"postgres://…\", \"redis://host:port\" or \
                 \"redis-cluster://host:port,…\" (a queue must survive a restart: not \"memory\")",
                redact_url(text)
            )),
        }
    }

    /// The default beside `database`: a SQLite file next to a SQLite database
    /// (`portcullis.db` → `portcullis-queue.db`), else the same PostgreSQL database.
    pub fn default_for(database: &DatabaseBackend) -> Self {
        match database {
            DatabaseBackend::Sqlite(path) => {
                let stem = path
                    .file_stem()
                    .map_or_else(|| "portcullis".into(), |s| s.to_string_lossy().into_owned());
                Self::Sqlite(path.with_file_name(format!("{stem}-queue.db")))
            }
            DatabaseBackend::Postgres(url) => Self::Postgres(url.clone()),
        }
    }
}

impl fmt::Debug for QueueBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Self::Postgres(url) | Self::Redis(url) => write!(f, "{}", redact_url(url)),
            Self::RedisCluster(nodes) => f.write_str(&cluster_display(nodes)),
        }
    }
}

const CLUSTER_SCHEME: &str = "redis-cluster://";
const TLS_CLUSTER_SCHEME: &str = "rediss-cluster://";

/// `redis-cluster://[user[:password]@]host:port[,host:port…]` → one `redis://` URL per seed
/// node, each with the credentials (the redis crate uses the first node's for all);
/// `rediss-cluster://…` → `rediss://` URLs (TLS to every node, verified against the system's
/// roots or `SSL_CERT_FILE`).
fn parse_cluster(text: &str, prefix: &str, scheme: &str) -> Result<Vec<String>, String> {
    let shown = redact_url(text);
    let rest = text.get(prefix.len()..).unwrap_or_default();
    let (auth, hosts) = match rest.rsplit_once('@') {
        Some((auth, hosts)) => (Some(auth), hosts),
        None => (None, rest),
    };
    let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
    if hosts.contains(['/', '?', '#']) {
        return Err(format!(
            "= {shown:?}: a cluster URL is a list of seed nodes only \
             (redis-cluster://host:port,host:port,…): a cluster has no database number"
        ));
    }
    let mut nodes = Vec::new();
    for host in hosts.split(',') {
        let node = match auth {
            Some(auth) => format!("{scheme}://{auth}@{host}"),
            None => format!("{scheme}://{host}"),
        };
        match url::Url::parse(&node) {
            Ok(url) if url.host_str().is_some_and(|h| !h.is_empty()) => nodes.push(node),
            _ => {
                return Err(format!(
                    "= {shown:?}: seed node {:?} is not host:port",
                    host.trim()
                ))
            }
        }
    }
    Ok(nodes)
}

/// `redis-cluster://[user:***@]host:port,…` for logs: the password never shown.
fn cluster_display(nodes: &[String]) -> String {
    let urls: Vec<url::Url> = nodes
        .iter()
        .filter_map(|n| url::Url::parse(n).ok())
        .collect();
    let tls = urls.first().is_some_and(|u| u.scheme() == "rediss");
    let mut out = String::from(if tls {
        TLS_CLUSTER_SCHEME
    } else {
        CLUSTER_SCHEME
    });
    if let Some(first) = urls.first() {
        if !first.username().is_empty() || first.password().is_some() {
            out.push_str(first.username());
            if first.password().is_some() {
                out.push_str(":***");
            }
            out.push('@');
        }
    }
    let hosts: Vec<String> = urls
        .iter()
        .map(|u| match u.port() {
            Some(port) => format!("{}:{port}", u.host_str().unwrap_or_default()),
            None => u.host_str().unwrap_or_default().to_owned(),
        })
        .collect();
    out.push_str(&hosts.join(","));
    out
}

fn is_postgres(text: &str) -> bool {
    text.starts_with("postgres://") || text.starts_with("postgresql://")
}

fn check_url(text: &str) -> Result<(), String> {
    url::Url::parse(text)
        .map(|_| ())
        .map_err(|e| format!("= {:?}: not a valid URL ({e})", redact_url(text)))
}

/// Replaces the password of a URL with `***` so it can be logged or printed, also in text
/// that is not one valid URL (a cluster's `redis-cluster://u:pw@h1:1,h2:2`, a typo).
pub fn redact_url(text: &str) -> String {
    match url::Url::parse(text) {
        Ok(mut url) if url.password().is_some() => {
            let _ = url.set_password(Some("***"));
            url.to_string()
        }
        Ok(_) => text.to_owned(),
        Err(_) => redact_userinfo(text),
    }
}

/// `scheme://user:secret@rest` → `scheme://user:***@rest`, by position alone.
fn redact_userinfo(text: &str) -> String {
    let Some(start) = text.find("://").map(|i| i + 3) else {
        return text.to_owned();
    };
    let rest = &text[start..];
    let Some(at) = rest.rfind('@') else {
        return text.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!("{}{}:***{}", &text[..start], &rest[..colon], &rest[at..]),
        None => text.to_owned(),
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
    fn parses_cluster_seed_nodes() {
        assert_eq!(
            StateBackend::parse("redis-cluster://127.0.0.1:7000,127.0.0.1:7001").unwrap(),
            StateBackend::RedisCluster(vec![
                "redis://127.0.0.1:7000".into(),
                "redis://127.0.0.1:7001".into()
            ])
        );
        let with_auth = StateBackend::parse("redis-cluster://u:hunter2@h1:1,h2:2/").unwrap();
        assert_eq!(
            with_auth,
            StateBackend::RedisCluster(vec![
                "redis://u:hunter2@h1:1".into(),
                "redis://u:hunter2@h2:2".into()
            ])
        );
        let shown = format!("{with_auth:?}");
        assert_eq!(shown, "redis-cluster://u:***@h1:1,h2:2");
        assert!(matches!(
            IdempotencyBackend::parse("redis-cluster://h1:1"),
            Ok(IdempotencyBackend::RedisCluster(_))
        ));
        for bad in [
            "redis-cluster://",
            "redis-cluster://h1:1,,h2:2",
            "redis-cluster://h1:1/0",
            "redis-cluster://h1:notaport",
        ] {
            assert!(StateBackend::parse(bad).is_err(), "{bad}");
            assert!(IdempotencyBackend::parse(bad).is_err(), "{bad}");
        }
        let tls = StateBackend::parse("rediss-cluster://u:hunter2@h1:1,h2:2").unwrap();
        assert_eq!(
            tls,
            StateBackend::RedisCluster(vec![
                "rediss://u:hunter2@h1:1".into(),
                "rediss://u:hunter2@h2:2".into()
            ])
        );
        let shown = format!("{tls:?}");
        assert_eq!(shown, "rediss-cluster://u:***@h1:1,h2:2");
        assert!(IdempotencyBackend::parse("rediss-cluster://h1:1").is_ok());
        let bad = StateBackend::parse("redis-cluster://u:hunter2@h1:1/0").unwrap_err();
        assert!(!bad.contains("hunter2"), "{bad}");
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
