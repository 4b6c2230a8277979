//! The fleet's throttled-tenant counts in Redis, for `GET /admin/v1/usage/throttled`
//! ([`ThrottledBoard`]).
//!
//! One hash, one field per replica holding `{"at": <unix secs>, "counts": [[tenant, n], …]}`.
//! One key keeps it on one slot of a Redis Cluster; a field older than [`STALE`] (a replica
//! gone) is ignored, and removed by every publisher and reader, so the hash holds only the
//! replicas of the last [`STALE`] even through a crash loop; the whole key expires when no
//! replica publishes. Publishing runs in the admin API's background task, never on the
//! request path.

use std::time::Duration;

use super::{BoardError, ThrottledBoard, PUBLISH_EVERY};
use async_trait::async_trait;
use portcullis_ratelimit::{Clock, SystemClock};
use portcullis_redis::{RedisClient, RedisConnection};
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;

/// The hash's key.
const KEY: &str = "portcullis:usage:throttled";
/// A publication older than three periods is a replica that stopped.
const STALE: Duration = Duration::from_secs(3 * PUBLISH_EVERY.as_secs());
/// Bound of each Redis exchange: the admin view degrades to this replica's counts after it.
const TIMEOUT: Duration = Duration::from_secs(1);

/// One replica's publication.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    at: u64,
    counts: Vec<(String, u64)>,
}

/// [`ThrottledBoard`] over the state store's Redis.
pub struct RedisBoard {
    client: RedisClient,
    conn: OnceCell<RedisConnection>,
}

impl RedisBoard {
    /// A board in the Redis (or Redis Cluster) `client` connects to, connecting on first use.
    pub fn new(client: RedisClient) -> Self {
        Self {
            client,
            conn: OnceCell::new(),
        }
    }

    async fn connection(&self) -> Result<RedisConnection, BoardError> {
        let conn = self
            .conn
            .get_or_try_init(|| self.client.connect())
            .await
            .map_err(unavailable)?;
        Ok(conn.clone())
    }
}

/// Wall time (replicas compare each other's publication times).
fn now_secs() -> u64 {
    SystemClock.unix_now().as_secs()
}

async fn bounded<T>(
    work: impl std::future::Future<Output = Result<T, BoardError>>,
) -> Result<T, BoardError> {
    tokio::time::timeout(TIMEOUT, work)
        .await
        .map_err(|_| BoardError::Timeout(TIMEOUT))?
}

fn unavailable(err: impl std::error::Error + Send + Sync + 'static) -> BoardError {
    BoardError::Unavailable(Box::new(err))
}

/// The live replicas' publications; the stale fields are removed on the way.
async fn live(conn: &mut RedisConnection) -> Result<Vec<(String, Vec<(String, u64)>)>, BoardError> {
    let all: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(KEY)
        .query_async(conn)
        .await
        .map_err(unavailable)?;
    let oldest = now_secs().saturating_sub(STALE.as_secs());
    let mut live = Vec::new();
    let mut stale = Vec::new();
    for (replica, json) in all {
        match serde_json::from_str::<Entry>(&json) {
            Ok(entry) if entry.at >= oldest => live.push((replica, entry.counts)),
            // Stale, or written by something else: never summed.
            _ => stale.push(replica),
        }
    }
    if !stale.is_empty() {
        let removed: Result<(), _> = redis::cmd("HDEL")
            .arg(KEY)
            .arg(&stale)
            .query_async(conn)
            .await;
        if let Err(err) = removed {
            tracing::debug!(%err, "removing stale throttled-tenant entries failed");
        }
    }
    Ok(live)
}

#[async_trait]
impl ThrottledBoard for RedisBoard {
    async fn publish(&self, replica: &str, counts: &[(String, u64)]) -> Result<(), BoardError> {
        let entry = Entry {
            at: now_secs(),
            counts: counts.to_vec(),
        };
        let json = serde_json::to_string(&entry).map_err(unavailable)?;
        bounded(async {
            let mut conn = self.connection().await?;
            redis::pipe()
                .atomic()
                .hset(KEY, replica, json)
                .ignore()
                .expire(KEY, i64::try_from(STALE.as_secs() * 4).unwrap_or(60))
                .ignore()
                .query_async::<()>(&mut conn)
                .await
                .map_err(unavailable)?;
            // Replicas that stopped publishing leave with the next publication of any other.
            live(&mut conn).await.map(drop)
        })
        .await
    }

    async fn read(&self) -> Result<Vec<(String, Vec<(String, u64)>)>, BoardError> {
        bounded(async {
            let mut conn = self.connection().await?;
            live(&mut conn).await
        })
        .await
    }
}
