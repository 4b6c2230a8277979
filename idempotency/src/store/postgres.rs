//! PostgreSQL store: records in the `idempotency_records` table of
//! `migrations/postgres/0002_idempotency.sql` (the caller runs the migrations).
//!
//! - Each decision is **one statement**, on the server's `now()`: `try_lock` is an
//!   `INSERT … ON CONFLICT DO UPDATE … WHERE <lease or retention expired> RETURNING` joined
//!   with a read of the conflicting row; `complete`/`release` are an `UPDATE`/`DELETE`
//!   guarded by `fencing_token = $n AND lease_until > now()`. No explicit transaction, so
//!   one round trip each (plus, rarely, one retry of `try_lock`: see [`sql::TRY_LOCK`]).
//! - Queries are runtime-checked (`sqlx::query`), so building never needs a database; the
//!   conformance suite checks them against a real server.
//! - Expired rows are invisible to every statement (`expires_at > now()`), and deleted in
//!   batches by [`PostgresStore::reap_expired`] or the task from
//!   [`PostgresStore::spawn_reaper`].
//! - Every call is bounded by a timeout (default 1 s) so a stalled database gives a
//!   transient [`StoreError::Timeout`] (503) instead of a hung request.

use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use http::StatusCode;
use sqlx::postgres::{PgPool, PgRow};
use sqlx::Row;

use super::{LockOutcome, RecordKey, Store, StoreError};
use crate::fingerprint::Fingerprint;
use crate::record::{
    headers_from_json, headers_to_json, Completion, RecordInfo, RecordState, StoredResponse,
};

mod sql;

/// Default bound on one database call, pool acquisition included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// How often `try_lock` re-runs when a concurrent insert hid the row from its snapshot.
const SNAPSHOT_RETRIES: usize = 3;

/// [`Store`] on PostgreSQL through an `sqlx` pool.
#[derive(Clone)]
pub struct PostgresStore {
    pool: PgPool,
    timeout: Duration,
}

// === impl PostgresStore ===

impl PostgresStore {
    /// A store on `pool`, whose database has the `migrations/postgres` migrations applied.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// Sets the per-call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Deletes at most `batch` expired rows; returns how many went. Small batches keep each
    /// delete's locks and WAL burst short.
    pub async fn reap_expired(&self, batch: i64) -> Result<u64, StoreError> {
        let q = sqlx::query(sql::REAP)
            .bind(batch.max(1))
            .execute(&self.pool);
        Ok(self.bounded(q).await?.rows_affected())
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

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => Ok(r?),
            Err(_) => Err(StoreError::Timeout(self.timeout)),
        }
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
                .bind(retention.as_secs_f64())
                .fetch_optional(&self.pool);
            if let Some(row) = self.bounded(q).await? {
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
            .bind(retention.as_secs_f64())
            .fetch_one(&self.pool);
        let row = self.bounded(q).await?;
        Self::finish_result(&row, fencing)
    }

    async fn release(&self, key: &RecordKey, fencing: u64) -> Result<(), StoreError> {
        let q = sqlx::query(sql::RELEASE)
            .bind(&key.tenant)
            .bind(&key.route)
            .bind(key.key.as_str())
            .bind(fencing as i64)
            .fetch_one(&self.pool);
        let row = self.bounded(q).await?;
        Self::finish_result(&row, fencing)
    }

    async fn get(&self, key: &RecordKey) -> Result<Option<RecordInfo>, StoreError> {
        let q = sqlx::query(sql::GET)
            .bind(&key.tenant)
            .bind(&key.route)
            .bind(key.key.as_str())
            .fetch_optional(&self.pool);
        let Some(row) = self.bounded(q).await? else {
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
            .bind(key.key.as_str())
            .fetch_optional(&self.pool);
        let row = self.bounded(q).await?;
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
