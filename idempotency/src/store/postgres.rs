//! PostgreSQL store: records in the `idempotency_records` table of
//! `migrations/postgres/0002_idempotency.sql` (the caller runs the migrations).
//!
//! - Each decision is **one statement**, on the server's `now()`: `try_lock` is an
//!   `INSERT … ON CONFLICT DO UPDATE … WHERE <lease or retention expired> RETURNING` joined
//!   with a read of the conflicting row; `complete`/`release` are an `UPDATE`/`DELETE`
//!   guarded by `fencing_token = $n AND lease_until > now()`. No explicit transaction, so
//!   one round trip each (plus, rarely, one retry of `try_lock`: see [`sql::TRY_LOCK`]).
//! - **One exchange per statement.** The store keeps its own connections ([`pool`]): a
//!   statement is prepared once per connection (sqlx's statement cache), then every call is
//!   a single `Bind`/`Execute`/`Close`/`Sync` write and one reply. `sqlx::PgPool` would add a
//!   `Sync` ping each time a connection goes back to it (4 segments per first execution
//!   instead of 2, BENCHMARKS.md).
//! - **Pool size**: [`PostgresSettings::pool_size`], by default [`default_pool_size`] (eight
//!   per core, 16–64). A call that finds every connection busy waits for one for at most
//!   half its timeout, then fails with [`StoreError::PoolExhausted`] (503 +
//!   `Retry-After`), never hangs.
//! - Queries are runtime-checked (`sqlx::query`), so building never needs a database; the
//!   conformance suite checks them against a real server.
//! - Expired rows are invisible to every statement (`expires_at > now()`), and deleted in
//!   batches by [`PostgresStore::reap_expired`] or the task from
//!   [`PostgresStore::spawn_reaper`].
//! - Every call is bounded by a timeout (default 1 s) so a stalled database gives a
//!   transient [`StoreError::Timeout`] (503) instead of a hung request.
//!
//! # Durability: why every commit is synchronous
//!
//! Both statements commit with the server's `synchronous_commit` (by default `on`): the
//! answer to a statement is sent only once its WAL is flushed. Throughput comes from
//! PostgreSQL's own group commit instead: while one backend flushes the WAL, the commits
//! of the other connections queue behind the same flush and are made durable by it, so
//! with `pool_size` statements in flight one `fdatasync` serves up to `pool_size` commits.
//! That is why the pool is sized by concurrency and not kept small.
//!
//! - **The completion must be durable before the response is released.** A crash of the
//!   *gateway* loses nothing PostgreSQL acknowledged, whatever `synchronous_commit` says;
//!   but a crash of the *database* (or its host) loses an asynchronous commit of the last
//!   ≈ 3 × `wal_writer_delay` (600 ms by default). A lost completion turns the row back
//!   into an in-flight lock held by nobody: after its lease, the next duplicate takes it
//!   over and, on an upstream that does not dedupe, gets the stored 502
//!   `idempotency-previous-attempt-interrupted` instead of the response the client was
//!   already given. So `complete` stays synchronous.
//! - **`synchronous_commit = off` for the lock row is not safe either**, so it is not used.
//!   If the database crashes while a request is in flight and the lock's commit was among
//!   the lost ones, the row is gone: a retry of the same key then finds *no* record,
//!   acquires it as new (not a takeover) and executes the request a second time while the
//!   first copy may still be running upstream — the duplicate execution the store exists
//!   to prevent. It also breaks fencing: the sequence advance (`nextval`) of an unflushed
//!   transaction can be lost with it, so the same token can be issued twice. With a
//!   synchronous lock, the worst a database crash does is keep the key in flight until its
//!   lease ends (then the takeover rule applies: no key stuck forever, nothing run twice).
//!   A deployment that accepts that window can still set `synchronous_commit` for the
//!   gateway's database role; the store does not choose it.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use http::StatusCode;
use sqlx::postgres::{PgArguments, PgConnectOptions, PgQueryResult, PgRow};
use sqlx::{Postgres, Row};
use tokio::time::Instant;

use super::{LockOutcome, RecordKey, Store, StoreError};
use crate::fingerprint::Fingerprint;
use crate::record::{
    headers_from_json, headers_to_json, Completion, RecordInfo, RecordState, StoredResponse,
};

mod pool;
mod sql;

pub use pool::default_pool_size;

/// Default bound on one database call, pool acquisition included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// How often `try_lock` re-runs when a concurrent insert hid the row from its snapshot.
const SNAPSHOT_RETRIES: usize = 3;

/// The `application_name` of the store's connections (visible in `pg_stat_activity`).
pub const APPLICATION_NAME: &str = "portcullis-idempotency";

type PgQuery<'q> = sqlx::query::Query<'q, Postgres, PgArguments>;

/// How a [`PostgresStore`] connects.
#[derive(Debug, Clone)]
pub struct PostgresSettings {
    /// Connections the store may open; calls beyond that wait (within `timeout`).
    pub pool_size: usize,
    /// Bound on one call, waiting for a connection included.
    pub timeout: Duration,
}

/// [`Store`] on PostgreSQL through its own pool of `sqlx` connections.
#[derive(Clone)]
pub struct PostgresStore {
    pool: std::sync::Arc<pool::Pool>,
    timeout: Duration,
}

// === impl PostgresSettings ===

impl Default for PostgresSettings {
    fn default() -> Self {
        Self {
            pool_size: default_pool_size(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

// === impl PostgresStore ===

impl PostgresStore {
    /// Connects to `url` (a `postgres://` URL) whose database has the `migrations/postgres`
    /// migrations applied. One connection is opened at once, so a wrong URL fails here;
    /// the others are opened when the load needs them.
    pub async fn connect(url: &str, settings: PostgresSettings) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse()?;
        Self::connect_with(options, settings).await
    }

    /// As [`PostgresStore::connect`], from parsed options.
    pub async fn connect_with(
        options: PgConnectOptions,
        settings: PostgresSettings,
    ) -> Result<Self, StoreError> {
        let options = options.application_name(APPLICATION_NAME);
        let store = Self {
            pool: std::sync::Arc::new(pool::Pool::new(options, settings.pool_size)),
            timeout: settings.timeout,
        };
        let lease = store.pool.acquire(store.deadline()).await?;
        lease.release::<()>(&Ok(()));
        Ok(store)
    }

    /// Sets the per-call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Number of connections the store may open.
    pub fn pool_size(&self) -> usize {
        self.pool.size()
    }

    /// Deletes at most `batch` expired rows; returns how many went. Small batches keep each
    /// delete's locks and WAL burst short.
    pub async fn reap_expired(&self, batch: i64) -> Result<u64, StoreError> {
        let q = sqlx::query(sql::REAP).bind(batch.max(1));
        Ok(self.execute(q).await?.rows_affected())
    }

    /// Spawns a task that, every `every`, reaps expired rows in batches of `batch` until a
    /// batch comes back short. Errors are logged and retried next period. Abort the handle
    /// to stop it.
    pub fn spawn_reaper(&self, every: Duration, batch: i64) -> tokio::task::JoinHandle<()> {
        let store = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                loop {
                    match store.reap_expired(batch).await {
                        Ok(n) if n >= batch.max(1) as u64 => continue,
                        Ok(_) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "idempotency reaper failed");
                            break;
                        }
                    }
                }
            }
        })
    }

    fn deadline(&self) -> Instant {
        Instant::now() + self.timeout
    }

    /// A connection for one call ending at `deadline`. Waiting for one may take at most half
    /// the call's timeout: a call that waited longer would rarely have time left for its
    /// statement, and `PoolExhausted` tells the operator the pool (not the database) is
    /// what is short, where a plain timeout would not.
    async fn lease(&self, deadline: Instant) -> Result<pool::Lease<'_>, StoreError> {
        let wait_until = (Instant::now() + self.timeout / 2).min(deadline);
        self.pool.acquire(wait_until).await
    }

    /// Runs one row-returning statement on a pooled connection, within the call timeout.
    async fn fetch_optional(&self, q: PgQuery<'_>) -> Result<Option<PgRow>, StoreError> {
        let deadline = self.deadline();
        let mut lease = self.lease(deadline).await?;
        let conn = lease.conn()?;
        // On timeout the lease is dropped mid-statement, which closes that connection.
        let r = tokio::time::timeout_at(deadline, q.fetch_optional(conn))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?;
        lease.release(&r);
        Ok(r?)
    }

    /// As `fetch_optional`, for a statement that always reports one row.
    async fn fetch_one(&self, q: PgQuery<'_>) -> Result<PgRow, StoreError> {
        self.fetch_optional(q)
            .await?
            .ok_or_else(|| StoreError::Corrupt("statement returned no report row".into()))
    }

    /// Runs one statement for its row count.
    async fn execute(&self, q: PgQuery<'_>) -> Result<PgQueryResult, StoreError> {
        let deadline = self.deadline();
        let mut lease = self.lease(deadline).await?;
        let conn = lease.conn()?;
        let r = tokio::time::timeout_at(deadline, q.execute(conn))
            .await
            .map_err(|_| StoreError::Timeout(self.timeout))?;
        lease.release(&r);
        Ok(r?)
    }

    /// Interprets the report row of `COMPLETE`/`RELEASE`.
    fn finish_result(row: &PgRow, fencing: u64) -> Result<(), StoreError> {
        if row.try_get::<i64, _>("changed")? > 0 {
            return Ok(());
        }
        let current: Option<i64> = row.try_get("fencing_token")?;
        let state: Option<String> = row.try_get("state")?;
        match (current, state.as_deref()) {
            (Some(t), Some("in_flight")) if t == fencing as i64 => {
                Err(StoreError::LeaseLost { presented: fencing })
            }
            (None, _) => Err(StoreError::LeaseLost { presented: fencing }),
            _ => Err(StoreError::Fenced { presented: fencing }),
        }
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("pool_size", &self.pool.size())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for PostgresStore {
    async fn try_lock(
        &self,
        key: &RecordKey,
        fingerprint: &Fingerprint,
        lease: Duration,
        retention: Duration,
    ) -> Result<LockOutcome, StoreError> {
        let lease = lease.min(retention);
        for _ in 0..SNAPSHOT_RETRIES {
            let q = sqlx::query(sql::TRY_LOCK)
                .bind(&key.tenant)
                .bind(&key.route)
                .bind(key.key.as_str())
                .bind(&fingerprint.as_bytes()[..])
                .bind(lease.as_secs_f64())
                .bind(retention.as_secs_f64());
            if let Some(row) = self.fetch_optional(q).await? {
                return lock_outcome(&row, fingerprint);
            }
        }
        // Only reachable if the row keeps appearing and vanishing between statements.
        Err(StoreError::Corrupt("try_lock found no stable row".into()))
    }

    async fn complete(
        &self,
        key: &RecordKey,
        fencing: u64,
        completion: Completion,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let (state, status, headers, body) = match completion {
            Completion::Response(r) => (
                RecordState::Completed,
                r.status,
                Some(headers_to_json(&r.headers)),
                Some(r.body),
            ),
            Completion::TooLarge(status) => (RecordState::TooLarge, status, None, None),
        };
        let q = sqlx::query(sql::COMPLETE)
            .bind(&key.tenant)
            .bind(&key.route)
            .bind(key.key.as_str())
            .bind(fencing as i64)
            .bind(state.as_str())
            .bind(status.as_u16() as i16)
            .bind(headers)
            .bind(body.as_deref())
            .bind(retention.as_secs_f64());
        let row = self.fetch_one(q).await?;
        Self::finish_result(&row, fencing)
    }

    async fn release(&self, key: &RecordKey, fencing: u64) -> Result<(), StoreError> {
        let q = sqlx::query(sql::RELEASE)
            .bind(&key.tenant)
            .bind(&key.route)
            .bind(key.key.as_str())
            .bind(fencing as i64);
        let row = self.fetch_one(q).await?;
        Self::finish_result(&row, fencing)
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let q = sqlx::query(sql::GET)
            .bind(&key.tenant)
            .bind(&key.route)
            .bind(key.key.as_str());
        let Some(row) = self.fetch_optional(q).await? else {
            return Ok(None);
        };
        let state: String = row.try_get("state")?;
        let fingerprint: Vec<u8> = row.try_get("fingerprint")?;
        let status: Option<i16> = row.try_get("response_status")?;
        let created: DateTime<Utc> = row.try_get("created_at")?;
        let expires: DateTime<Utc> = row.try_get("expires_at")?;
        Ok(Some(RecordInfo {
            state: parse_state(&state)?,
            fingerprint_hex: hex::encode(fingerprint),
            fencing: row.try_get::<i64, _>("fencing_token")? as u64,
            status: status.map(|s| s as u16),
            created_at: SystemTime::from(created),
            expires_at: SystemTime::from(expires),
        }))
    }

    async fn delete(&self, key: &RecordKey) -> Result<bool, StoreError> {
        let q = sqlx::query(sql::DELETE)
            .bind(&key.tenant)
            .bind(&key.route)
            .bind(key.key.as_str());
        let row = self.fetch_optional(q).await?;
        Ok(match row {
            Some(r) => r.try_get::<bool, _>("live")?,
            None => false,
        })
    }
}

fn parse_state(s: &str) -> Result<RecordState, StoreError> {
    RecordState::parse(s).ok_or_else(|| StoreError::Corrupt(format!("unknown state {s:?}")))
}

fn lock_outcome(row: &PgRow, fingerprint: &Fingerprint) -> Result<LockOutcome, StoreError> {
    let fencing: i64 = row.try_get("fencing_token")?;
    if row.try_get::<String, _>("outcome")? == "acquired" {
        return Ok(LockOutcome::Acquired {
            fencing: fencing as u64,
            took_over: row.try_get("took_over")?,
        });
    }
    let stored: Vec<u8> = row.try_get("fingerprint")?;
    if stored.as_slice() != fingerprint.as_bytes() {
        return Ok(LockOutcome::Mismatch);
    }
    let status = |s: Option<i16>| {
        s.and_then(|s| StatusCode::from_u16(s as u16).ok())
            .ok_or_else(|| StoreError::Corrupt("missing or invalid response status".into()))
    };
    let state: String = row.try_get("state")?;
    Ok(match parse_state(&state)? {
        RecordState::InFlight => LockOutcome::InFlight {
            lease_remaining: Duration::from_millis(
                row.try_get::<Option<i64>, _>("lease_ms")?
                    .unwrap_or(0)
                    .max(0) as u64,
            ),
        },
        RecordState::TooLarge => LockOutcome::TooLarge {
            status: status(row.try_get("response_status")?)?,
        },
        RecordState::Completed => {
            let headers: Option<String> = row.try_get("response_headers")?;
            let body: Option<Vec<u8>> = row.try_get("response_body")?;
            LockOutcome::Completed(StoredResponse {
                status: status(row.try_get("response_status")?)?,
                headers: headers_from_json(headers.as_deref().unwrap_or("[]"))?,
                body: body.unwrap_or_default().into(),
            })
        }
    })
}
