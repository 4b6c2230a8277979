//! One Redis connection for the stores: a single server or a Redis/Valkey Cluster.
//!
//! The rate limiter (`portcullis-ratelimit`) and the idempotency store
//! (`portcullis-idempotency`) run Lua scripts and a few plain commands. Both kinds of
//! deployment speak the same commands, so each store keeps one code path over
//! [`RedisConnection`], which implements [`redis::aio::ConnectionLike`] for both:
//!
//! - **single server** (`redis://host:port`): a [`ConnectionManager`], which reconnects in the
//!   background after a failure;
//! - **cluster** (`redis-cluster://h1:p1,h2:p2,…` in the gateway's configuration, seed nodes):
//!   the redis crate's async [`ClusterConnection`]. It learns the slot map from any reachable
//!   seed, sends each command to the master of its key's slot, follows `MOVED` (and refreshes
//!   the map) and `ASK` redirections by itself, and reconnects to a node that comes back.
//!   A script whose keys share one hash tag runs on one node: still one round trip.
//!
//! Where this sits: below the stores, never seen by the request pipeline, which does not
//! know which deployment it talks to.
//!
//! ```no_run
//! # async fn demo() -> redis::RedisResult<()> {
//! use portcullis_redis::{ConnectOptions, RedisClient};
//! let client = RedisClient::cluster(
//!     &["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"],
//!     &ConnectOptions::default(),
//! )?;
//! let mut conn = client.connect().await?;
//! let _: String = redis::cmd("PING").query_async(&mut conn).await?;
//! # Ok(()) }
//! ```
//!
//! # Failures in a cluster
//!
//! A dead master makes the commands for its slots fail (connection refused, then
//! `CLUSTERDOWN` once the others mark it failed, unless a replica takes over); the other
//! slots keep working. The client retries a failed command at most
//! [`ConnectOptions::retries`] times, quickly, and every caller here also bounds each call
//! with its own timeout, so a dead node costs a request at most that timeout, never a hang.

use std::sync::OnceLock;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// How connections are made and how long one answer may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Bound on establishing one TCP connection (default 250 ms).
    pub connection_timeout: Duration,
    /// Bound on one answer, on each node (default 250 ms).
    pub response_timeout: Duration,
    /// Single server: background reconnection attempts after a failure. Cluster: retries of a
    /// command that failed on a connection error or redirection (default 2).
    pub retries: u32,
    /// First wait between two of those attempts, in milliseconds; each later wait doubles
    /// (default 100, the redis crate's own default).
    pub retry_factor_ms: u64,
    /// Longest wait between two of those attempts (default 1 s).
    pub max_retry_delay: Duration,
}

/// A Redis deployment to connect to. Does no I/O until [`RedisClient::connect`].
#[derive(Clone)]
pub enum RedisClient {
    /// One server.
    Single(redis::Client, ConnectOptions),
    /// A cluster, through its seed nodes.
    Cluster(ClusterClient),
}

/// An open connection to either kind of deployment. Cheap to clone (both variants are
/// handles to one multiplexed connection).
#[derive(Clone)]
// The manager is ~240 bytes, the cluster handle a pointer: boxing it would add an
// allocation to every per-call clone, to save bytes in a handle that exists once per store.
#[allow(clippy::large_enum_variant)]
pub enum RedisConnection {
    /// One server, reconnecting in the background.
    Single(ConnectionManager),
    /// A cluster; commands go to their slot's master.
    Cluster(ClusterConnection),
}

// === impl ConnectOptions ===

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            connection_timeout: Duration::from_millis(250),
            response_timeout: Duration::from_millis(250),
            retries: 2,
            retry_factor_ms: 100,
            max_retry_delay: Duration::from_secs(1),
        }
    }
}

impl ConnectOptions {
    /// The same bound for connecting and for each answer.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            connection_timeout: timeout,
            response_timeout: timeout,
            ..Self::default()
        }
    }

    fn max_retry_delay_ms(&self) -> u64 {
        u64::try_from(self.max_retry_delay.as_millis()).unwrap_or(u64::MAX)
    }
}

// === impl RedisClient ===

impl RedisClient {
    /// One server at `url` (`redis://[:password@]host:port[/db]`).
    pub fn single(url: &str, options: &ConnectOptions) -> RedisResult<Self> {
        Ok(Self::Single(redis::Client::open(url)?, *options))
    }

    /// A cluster through its seed nodes (`redis://[user:password@]host:port` each; the
    /// credentials of the first apply to every node, as in the redis crate).
    pub fn cluster<T: AsRef<str>>(nodes: &[T], options: &ConnectOptions) -> RedisResult<Self> {
        let nodes: Vec<&str> = nodes.iter().map(AsRef::as_ref).collect();
        let client = ClusterClient::builder(nodes)
            .connection_timeout(options.connection_timeout)
            .response_timeout(options.response_timeout)
            .retries(options.retries)
            .retry_wait_formula(options.retry_factor_ms, 2)
            // Jittered from 1 ms up: a retry after the caller's own timeout is wasted.
            .min_retry_wait(1)
            .max_retry_wait(options.max_retry_delay_ms())
            .build()?;
        Ok(Self::Cluster(client))
    }

    /// True for a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// Connects: a single server's connection manager, or the cluster's slot map and its
    /// masters' connections (from the first seed that answers). Callers bound this with
    /// their own timeout.
    pub async fn connect(&self) -> RedisResult<RedisConnection> {
        match self {
            Self::Single(client, options) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(options.connection_timeout)
                    .set_response_timeout(options.response_timeout)
                    .set_number_of_retries(usize::try_from(options.retries).unwrap_or(usize::MAX))
                    .set_factor(options.retry_factor_ms)
                    .set_max_delay(options.max_retry_delay_ms());
                let conn = ConnectionManager::new_with_config(client.clone(), config).await?;
                Ok(RedisConnection::Single(conn))
            }
            Self::Cluster(client) => Ok(RedisConnection::Cluster(
                client.get_async_connection().await?,
            )),
        }
    }
}

impl std::fmt::Debug for RedisClient {
    // The connection info holds the password: only the kind is printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Single(..) => f.write_str("RedisClient::Single(..)"),
            Self::Cluster(_) => f.write_str("RedisClient::Cluster(..)"),
        }
    }
}

// === impl RedisConnection ===

impl RedisConnection {
    /// `PING`: on a cluster, every master must answer (the redis crate routes `PING` to all
    /// masters), so a readiness probe fails while any slot is unserved.
    pub async fn ping(&mut self) -> RedisResult<()> {
        redis::cmd("PING").query_async::<()>(self).await
    }

    /// The server's eviction rule as `(maxmemory, maxmemory-policy)`, from `CONFIG GET` (on a
    /// cluster, of the node the command is routed to). A server whose `maxmemory` is set
    /// and whose policy is not `noeviction` may drop keys before their TTL under memory
    /// pressure, whatever tenant's load caused it.
    pub async fn eviction_policy(&mut self) -> RedisResult<(u64, String)> {
        let maxmemory: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory")
            .query_async(self)
            .await?;
        let policy: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg("maxmemory-policy")
            .query_async(self)
            .await?;
        let bytes = maxmemory
            .get(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_default();
        Ok((bytes, policy.get(1).cloned().unwrap_or_default()))
    }
}

/// Why a deployment refuses writes ([`RedisConnection::check_writes`]). The message names
/// the part that refuses: the server, or a cluster's slot range and its master.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WriteCheckError {
    /// The single server refused or failed the probe write (down, `READONLY` replica,
    /// `OOM`, `MISCONF`, …).
    #[error("refuses writes: {0}")]
    Server(#[source] redis::RedisError),
    /// The cluster's slot map could not be read.
    #[error("cluster slot map unreadable: {0}")]
    SlotMap(#[source] redis::RedisError),
    /// Some slots are assigned to no node.
    #[error("cluster slots {start}-{end} have no master")]
    Unassigned {
        /// First unserved slot.
        start: u16,
        /// Last unserved slot.
        end: u16,
    },
    /// A master refused or failed the probe write for its slots (dead, `CLUSTERDOWN`, …).
    #[error("cluster slots {start}-{end} (master {master}) refuse writes: {source}")]
    Master {
        /// First slot of the range.
        start: u16,
        /// Last slot of the range.
        end: u16,
        /// `host:port` of the master the slot map names.
        master: String,
        /// What the write answered.
        #[source]
        source: redis::RedisError,
    },
}

/// Prefix of the keys the write probe sets (each with [`PROBE_TTL_MS`]).
const PROBE_PREFIX: &str = "portcullis:readyz:";
/// The probe keys expire on their own: no cleanup, no growth.
const PROBE_TTL_MS: u64 = 10_000;
/// Number of cluster slots.
const SLOTS: usize = 16384;

impl RedisConnection {
    /// Writes one short-lived key the way the stores write theirs: on a single server one
    /// `SET … PX`; on a cluster one per master (a key hash-tagged into each slot range of
    /// `CLUSTER SLOTS`), so a dead master, `CLUSTERDOWN`, a `READONLY` node or unassigned
    /// slots are found even while every other node answers `PING`. Callers bound it with
    /// their own timeout.
    pub async fn check_writes(&mut self) -> Result<(), WriteCheckError> {
        match self {
            Self::Single(_) => probe_write(self, &format!("{PROBE_PREFIX}single"))
                .await
                .map_err(WriteCheckError::Server),
            Self::Cluster(_) => self.check_cluster_writes().await,
        }
    }

    async fn check_cluster_writes(&mut self) -> Result<(), WriteCheckError> {
        let map: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(self)
            .await
            .map_err(WriteCheckError::SlotMap)?;
        let mut ranges: Vec<(u16, u16, String)> = map.iter().filter_map(slot_range).collect();
        ranges.sort_by_key(|r| r.0);
        let mut next = 0usize;
        for (start, end, _) in &ranges {
            if usize::from(*start) > next {
                return Err(unassigned(next, usize::from(*start) - 1));
            }
            next = next.max(usize::from(*end) + 1);
        }
        if next < SLOTS {
            return Err(unassigned(next, SLOTS - 1));
        }
        let tags = slot_tags();
        let checks = ranges.into_iter().map(|(start, end, master)| {
            let mut conn = self.clone();
            async move {
                let tag = tags.get(usize::from(start)).copied().unwrap_or_default();
                let key = format!("{PROBE_PREFIX}{{{tag}}}");
                probe_write(&mut conn, &key)
                    .await
                    .map_err(|source| WriteCheckError::Master {
                        start,
                        end,
                        master,
                        source,
                    })
            }
        });
        for result in futures_util::future::join_all(checks).await {
            result?;
        }
        Ok(())
    }
}

fn unassigned(start: usize, end: usize) -> WriteCheckError {
    WriteCheckError::Unassigned {
        start: u16::try_from(start).unwrap_or(u16::MAX),
        end: u16::try_from(end).unwrap_or(u16::MAX),
    }
}

async fn probe_write(conn: &mut RedisConnection, key: &str) -> RedisResult<()> {
    redis::cmd("SET")
        .arg(key)
        .arg("1")
        .arg("PX")
        .arg(PROBE_TTL_MS)
        .query_async::<()>(conn)
        .await
}

/// `(start, end, "host:port")` of one `CLUSTER SLOTS` entry.
fn slot_range(entry: &Value) -> Option<(u16, u16, String)> {
    let Value::Array(items) = entry else {
        return None;
    };
    let number = |v: &Value| match v {
        Value::Int(n) => u16::try_from(*n).ok(),
        _ => None,
    };
    let start = number(items.first()?)?;
    let end = number(items.get(1)?)?;
    let master = match items.get(2)? {
        Value::Array(node) => {
            let host = match node.first()? {
                Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                Value::SimpleString(s) => s.clone(),
                _ => String::new(),
            };
            let port = node.get(1).and_then(number).unwrap_or_default();
            format!("{host}:{port}")
        }
        _ => String::new(),
    };
    Some((start, end, master))
}

/// For each slot, a number whose decimal text hashes to it: `{n}` as a hash tag puts a key
/// in that slot. Computed once (about 170 000 CRC16s of short strings, bounded).
fn slot_tags() -> &'static [u32] {
    static TAGS: OnceLock<Vec<u32>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; SLOTS];
        let mut missing = SLOTS;
        for n in 0..4_000_000u32 {
            let slot = usize::from(slot(n.to_string().as_bytes()));
            if let Some(t) = tags.get_mut(slot) {
                if *t == u32::MAX {
                    *t = n;
                    missing -= 1;
                    if missing == 0 {
                        break;
                    }
                }
            }
        }
        tags
    })
}

impl std::fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Single(_) => f.write_str("RedisConnection::Single(..)"),
            Self::Cluster(_) => f.write_str("RedisConnection::Cluster(..)"),
        }
    }
}

impl From<ConnectionManager> for RedisConnection {
    fn from(conn: ConnectionManager) -> Self {
        Self::Single(conn)
    }
}

impl From<ClusterConnection> for RedisConnection {
    fn from(conn: ClusterConnection) -> Self {
        Self::Cluster(conn)
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// The cluster slot (0..16384) of `key`: CRC16 of its hash tag (the text between the first
/// `{` and the next `}`, when not empty), else of the whole key. Keys of one slot may be
/// used together in one script.
pub fn slot(key: &[u8]) -> u16 {
    redis::cluster_routing::get_slot(key)
}

/// True when the same command may succeed later: the connection failed or timed out, the
/// server is loading, read-only or down, or (cluster) a resharding or failover outlasted the
/// client's retries, or a slot has no reachable node. Every store that answers 503 and
/// flips readiness on a Redis failure classifies it here.
pub fn is_transient(err: &redis::RedisError) -> bool {
    use redis::ErrorKind as K;
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(
            err.kind(),
            K::TryAgain
                | K::BusyLoadingError
                | K::ClusterDown
                | K::MasterDown
                | K::ReadOnly
                | K::IoError
                | K::Moved
                | K::Ask
                | K::ClusterConnectionNotFound
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_tags_decide_the_slot() {
        assert_eq!(slot(b"rl:{tenant:acme}:tenant"), slot(b"tenant:acme"));
        assert_eq!(
            slot(b"rl:{tenant:acme}:tenant"),
            slot(b"rl:{tenant:acme}:quota:day:20261121")
        );
        // Known value from the Redis Cluster specification's CRC16 (`CLUSTER KEYSLOT foo`).
        assert_eq!(slot(b"foo"), 12182);
    }

    #[test]
    fn client_debug_hides_credentials() {
        let client = RedisClient::cluster(
            &["redis://:hunter2@127.0.0.1:7000"],
            &ConnectOptions::default(),
        )
        .unwrap();
        assert!(client.is_cluster());
        assert!(!format!("{client:?}").contains("hunter2"));
    }
}
