//! [`connect`]: the engine named by a URL, as `storage.queue` gives it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::QueueError;
use crate::{PostgresQueue, Queue, RedisQueue, SqliteQueue};

/// How engines connect and how long one call may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Bound on one queue call, connection wait included (default 2 s; a SQLite commit
    /// with `synchronous = FULL` waits for the disk, so this is not tight).
    pub timeout: Duration,
    /// Connections of the SQL engines' pools (default 8): PostgreSQL's for everything,
    /// SQLite's for reads (it writes through one connection).
    pub pool_size: u32,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(2),
            pool_size: 8,
        }
    }
}

/// One engine call within `timeout` (every engine's [`ConnectOptions::timeout`]).
pub(crate) async fn bounded<T, E: Into<QueueError>>(
    timeout: Duration,
    call: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, QueueError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result.map_err(Into::into),
        Err(_) => Err(QueueError::Timeout(timeout)),
    }
}

/// Connects to the engine `url` names and creates its schema if missing:
/// `sqlite://PATH` (relative or absolute; `sqlite:///abs/path` too), `postgres://…` or
/// `postgresql://…`, `redis://…` / `rediss://…` (one server), `redis-cluster://h:p,h:p` /
/// `rediss-cluster://…` (seed nodes of a cluster; credentials before the first host apply
/// to all).
pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Arc<dyn Queue>, QueueError> {
    match parse(url)? {
        Target::Sqlite(path) => Ok(Arc::new(SqliteQueue::open(&path, options).await?)),
        Target::Postgres(url) => Ok(Arc::new(PostgresQueue::connect(&url, options).await?)),
        Target::Redis(url) => Ok(Arc::new(RedisQueue::connect(&url, options.timeout).await?)),
        Target::RedisCluster(nodes) => Ok(Arc::new(
            RedisQueue::connect_cluster(&nodes, options.timeout).await?,
        )),
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Target {
    Sqlite(PathBuf),
    Postgres(String),
    Redis(String),
    RedisCluster(Vec<String>),
}

fn parse(url: &str) -> Result<Target, QueueError> {
    let invalid = |reason: &str| QueueError::InvalidUrl {
        shown: redact(url),
        reason: reason.to_owned(),
    };
    if let Some(path) = url.strip_prefix("sqlite://") {
        let path = path.split('?').next().unwrap_or_default();
        if path.is_empty() {
            return Err(invalid(
                "a SQLite URL needs a file path (sqlite://queue.db)",
            ));
        }
        return Ok(Target::Sqlite(PathBuf::from(path)));
    }
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return Ok(Target::Postgres(url.to_owned()));
    }
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        return Ok(Target::Redis(url.to_owned()));
    }
    for (scheme, node_scheme) in [
        ("redis-cluster://", "redis://"),
        ("rediss-cluster://", "rediss://"),
    ] {
        if let Some(rest) = url.strip_prefix(scheme) {
            let rest = rest.trim_end_matches('/');
            let (auth, hosts) = match rest.rsplit_once('@') {
                Some((auth, hosts)) => (format!("{auth}@"), hosts),
                None => (String::new(), rest),
            };
            let nodes: Vec<String> = hosts
                .split(',')
                .map(|h| format!("{node_scheme}{auth}{h}"))
                .collect();
            let well_formed = hosts.split(',').all(|h| {
                h.rsplit_once(':')
                    .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
            });
            if hosts.is_empty() || !well_formed {
                return Err(invalid(
                    "a cluster URL lists seed nodes as host:port,host:port (no database number)",
                ));
            }
            return Ok(Target::RedisCluster(nodes));
        }
    }
    Err(invalid(
        "allowed \"sqlite://PATH\", \"postgres://…\", \"redis://…\", \"rediss://…\" or \
         \"redis-cluster://host:port,…\"",
    ))
}

/// `url` with the password (between `:` and `@` after the scheme) shown as `***`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.rsplit_once('@') {
        Some((auth, hosts)) => match auth.split_once(':') {
            Some((user, _)) => format!("{scheme}://{user}:***@{hosts}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(
            parse("sqlite://data/q.db").unwrap(),
            Target::Sqlite("data/q.db".into())
        );
        assert_eq!(
            parse("sqlite:///var/q.db").unwrap(),
            Target::Sqlite("/var/q.db".into())
        );
        assert!(matches!(
            parse("postgres://u@h/db").unwrap(),
            Target::Postgres(_)
        ));
        assert!(matches!(parse("rediss://h:1").unwrap(), Target::Redis(_)));
        assert_eq!(
            parse("redis-cluster://u:pw@h1:1,h2:2").unwrap(),
            Target::RedisCluster(vec!["redis://u:pw@h1:1".into(), "redis://u:pw@h2:2".into()])
        );
        for bad in [
            "memory",
            "sqlite://",
            "redis-cluster://",
            "redis-cluster://h1:x",
            "mysql://h",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        let e = parse("redis-cluster://u:hunter2@h1:x")
            .unwrap_err()
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
