//! PostgreSQL engine: every replica leases from the same tables.
//!
//! - **Durability**: each write commits before the call returns; with the server's
//!   default `synchronous_commit = on` nothing acknowledged is lost, even if the database
//!   host crashes right after.
//! - **Leasing** is one statement: `SELECT … FOR UPDATE SKIP LOCKED` picks up to `max` due
//!   rows that no concurrent leaser holds, and the same statement's `UPDATE` stamps the
//!   lease; a lease moves `due_at` to the lease's end, so an expired lease is simply due
//!   again and the lease query needs one index, `(queue, state, due_at)`.
//! - **Enqueue without a dedupe key** is batched with the others waiting at that moment
//!   into one multi-row insert and commit ([`batch`]).
//! - **Enqueue with a dedupe key** is one statement too: a dedupe insert (`ON CONFLICT … DO UPDATE … WHERE`
//!   the old record expired) chained to the message insert in a data-modifying CTE, so the
//!   check and the insert commit together; only a duplicate whose first copy committed
//!   after this statement's snapshot needs a second look-up.
//! - **Schema**: created on connect (`CREATE … IF NOT EXISTS` under an advisory lock, so
//!   replicas starting together do not race), in tables `queue_messages` and `queue_dedupe`
//!   of whatever database the URL names; the gateway's own migrations do not touch them.
//! - **Time** is the server's `now()` in Unix milliseconds, so replicas' clocks never
//!   matter.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};

use crate::codec::encode_headers;
use crate::connect::ConnectOptions;
use crate::error::QueueError;
use crate::message::{
    from_millis, millis, Attempt, DeliveryId, Enqueued, Leased, ListFilter, Message, NewMessage,
    Page, Stats,
};
use crate::sql::{self, LEASED_COLUMNS, MESSAGE_COLUMNS, SUMMARY_COLUMNS};
use crate::Queue;

/// The server's clock in Unix milliseconds (fixed for one transaction).
macro_rules! now {
    () => {
        "(extract(epoch from now()) * 1000)::bigint"
    };
}

/// The guard of every outcome: the current token of a live lease.
macro_rules! held {
    () => {
        concat!(
            " WHERE id = $1 AND token = $2 AND state = 0 AND lease_until > ",
            now!()
        )
    };
}

/// Appends `$3` (an attempt's JSON text) to the history.
macro_rules! append_attempt {
    () => {
        "attempts = (attempts::jsonb || jsonb_build_array($3::jsonb))::text"
    };
}

mod batch;

use self::batch::{Batcher, Row};

/// Serializes schema creation between replicas (any constant; `hashtext` of the name).
const SCHEMA_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('portcullis-queue-schema'))";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS queue_messages (
    seq           BIGSERIAL PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    queue         TEXT NOT NULL,
    tenant        TEXT,
    state         BIGINT NOT NULL,
    method        TEXT NOT NULL,
    path          TEXT NOT NULL,
    headers       BYTEA NOT NULL,
    body          BYTEA NOT NULL,
    dedupe_key    TEXT,
    enqueued_at   BIGINT NOT NULL,
    due_at        BIGINT NOT NULL,
    updated_at    BIGINT NOT NULL,
    lease_until   BIGINT,
    token         BIGINT NOT NULL DEFAULT 0,
    leases        BIGINT NOT NULL DEFAULT 0,
    attempt_count BIGINT NOT NULL DEFAULT 0,
    cycle_at      BIGINT,
    cycle_base    BIGINT NOT NULL DEFAULT 0,
    attempts      TEXT NOT NULL DEFAULT '[]',
    reason        TEXT
);
CREATE INDEX IF NOT EXISTS queue_messages_due ON queue_messages (queue, state, due_at);
CREATE INDEX IF NOT EXISTS queue_messages_order ON queue_messages (queue, state, seq);
CREATE INDEX IF NOT EXISTS queue_messages_done ON queue_messages (state, updated_at);
CREATE TABLE IF NOT EXISTS queue_dedupe (
    queue      TEXT NOT NULL,
    tenant     TEXT NOT NULL,
    key        TEXT NOT NULL,
    id         TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (queue, tenant, key)
);
CREATE INDEX IF NOT EXISTS queue_dedupe_expiry ON queue_dedupe (expires_at);
";

/// [`Queue`] in PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresQueue {
    pool: PgPool,
    timeout: Duration,
    batch: Batcher,
}

// === impl PostgresQueue ===

impl PostgresQueue {
    /// Connects to `url` (`postgres://…`) and creates the schema if missing.
    pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Self, QueueError> {
        let connect: PgConnectOptions = url.parse()?;
        Self::connect_with(connect, options).await
    }

    /// Connects with explicit options and creates the schema if missing.
    pub async fn connect_with(
        connect: PgConnectOptions,
        options: &ConnectOptions,
    ) -> Result<Self, QueueError> {
        // sqlx checks an idle connection before handing it out: after a database restart a
        // stale connection is replaced instead of failing a whole batch of enqueues. With
        // enqueues batched, that check is one round trip per batch, not per message.
        let pool = PgPoolOptions::new()
            .max_connections(options.pool_size.max(1))
            .acquire_timeout(options.timeout)
            .connect_with(connect)
            .await?;
        let mut tx = pool.begin().await?;
        sqlx::query(SCHEMA_LOCK).execute(&mut *tx).await?;
        sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
        tx.commit().await?;
        // Two insert statements at once: one commits while the next batch gathers (more
        // would split the same arrivals into smaller batches, and take connections that
        // leases and outcomes need).
        let inserts = 2;
        Ok(Self {
            batch: Batcher::start(pool.clone(), inserts),
            pool,
            timeout: options.timeout,
        })
    }

    async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, QueueError>>,
    ) -> Result<T, QueueError> {
        crate::connect::bounded(self.timeout, fut).await
    }

    async fn enqueue_inner(&self, m: NewMessage) -> Result<Enqueued, QueueError> {
        let id = DeliveryId::random();
        let headers = encode_headers(&m.headers);
        let Some(d) = &m.dedupe else {
            self.batch
                .insert(Row {
                    id: id.as_str().to_owned(),
                    queue: m.queue,
                    tenant: m.tenant,
                    method: m.method,
                    path: m.path_and_query,
                    headers,
                    body: m.body,
                    delay_ms: millis(m.delay),
                })
                .await?;
            return Ok(Enqueued::New(id));
        };
        let tenant = m.tenant.as_deref().unwrap_or_default();
        let (new, old): (Option<String>, Option<String>) = sqlx::query_as(concat!(
            "WITH d AS (INSERT INTO queue_dedupe (queue, tenant, key, id, expires_at) \
               VALUES ($2, $10, $9, $1, ",
            now!(),
            " + $11) ON CONFLICT (queue, tenant, key) DO UPDATE \
               SET id = EXCLUDED.id, expires_at = EXCLUDED.expires_at \
               WHERE queue_dedupe.expires_at <= ",
            now!(),
            " RETURNING id), \
             m AS (INSERT INTO queue_messages (id, queue, tenant, state, method, path, headers, \
               body, dedupe_key, enqueued_at, due_at, updated_at) \
               SELECT $1, $2, $3, 0, $4, $5, $6, $7, $9, ",
            now!(),
            ", ",
            now!(),
            " + $8, ",
            now!(),
            " FROM d RETURNING id) \
             SELECT (SELECT id FROM m), (SELECT id FROM queue_dedupe \
               WHERE queue = $2 AND tenant = $10 AND key = $9 AND expires_at > ",
            now!(),
            ")"
        ))
        .bind(id.as_str())
        .bind(&m.queue)
        .bind(&m.tenant)
        .bind(&m.method)
        .bind(&m.path_and_query)
        .bind(headers)
        .bind(m.body.as_ref())
        .bind(millis(m.delay))
        .bind(&d.key)
        .bind(tenant)
        .bind(millis(d.window))
        .fetch_one(&self.pool)
        .await?;
        if let Some(new) = new {
            return Ok(Enqueued::New(DeliveryId::from_stored(new)));
        }
        if let Some(old) = old {
            return Ok(Enqueued::Duplicate(DeliveryId::from_stored(old)));
        }
        // The first copy committed after this statement's snapshot was taken (the insert
        // waited for it): a new statement sees it.
        let (first,): (String,) = sqlx::query_as(
            "SELECT id FROM queue_dedupe WHERE queue = $1 AND tenant = $2 AND key = $3",
        )
        .bind(&m.queue)
        .bind(tenant)
        .bind(&d.key)
        .fetch_one(&self.pool)
        .await?;
        Ok(Enqueued::Duplicate(DeliveryId::from_stored(first)))
    }

    /// Runs a guarded update of the leased message; when it touches nothing, says why.
    async fn finish(
        &self,
        id: &DeliveryId,
        token: u64,
        query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<(), QueueError> {
        let done = query.execute(&self.pool).await?;
        if done.rows_affected() > 0 {
            return Ok(());
        }
        let now: Option<(i64, i64, i64)> = sqlx::query_as(concat!(
            "SELECT state, token, CASE WHEN lease_until IS NULL THEN 0::bigint \
             WHEN lease_until > ",
            now!(),
            " THEN 1::bigint ELSE 2::bigint END FROM queue_messages WHERE id = $1"
        ))
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await?;
        Err(sql::refusal(id, token, now))
    }
}

#[async_trait]
impl Queue for PostgresQueue {
    async fn enqueue(&self, message: NewMessage) -> Result<Enqueued, QueueError> {
        self.bounded(self.enqueue_inner(message)).await
    }

    async fn lease(
        &self,
        queue: &str,
        max: usize,
        lease_for: Duration,
    ) -> Result<Vec<Leased>, QueueError> {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        self.bounded(async {
            let sql = format!(
                "WITH picked AS (SELECT seq FROM queue_messages \
                   WHERE queue = $1 AND state = 0 AND due_at <= {now} \
                   ORDER BY due_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE queue_messages SET token = token + 1, leases = leases + 1, \
                   due_at = {now} + $3, lease_until = {now} + $3, updated_at = {now} \
                 FROM picked WHERE queue_messages.seq = picked.seq \
                 RETURNING {LEASED_COLUMNS}, {now}",
                now = now!()
            );
            let rows: Vec<PgRow> = sqlx::query(&sql)
                .bind(queue)
                .bind(max)
                .bind(millis(lease_for).max(1))
                .fetch_all(&self.pool)
                .await?;
            rows.iter().map(sql::leased).collect()
        })
        .await
    }

    async fn delivered(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Attempt,
    ) -> Result<(), QueueError> {
        let q = sqlx::query(concat!(
            "UPDATE queue_messages SET state = 1, lease_until = NULL, due_at = ",
            now!(),
            ", updated_at = ",
            now!(),
            ", ",
            append_attempt!(),
            ", attempt_count = attempt_count + 1",
            held!()
        ))
        .bind(id.as_str())
        .bind(sql::token_arg(token))
        .bind(sql::attempt_json(&attempt));
        self.bounded(self.finish(id, token, q)).await
    }

    async fn retry_at(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Attempt,
        due_in: Duration,
    ) -> Result<(), QueueError> {
        let q = sqlx::query(concat!(
            "UPDATE queue_messages SET lease_until = NULL, due_at = ",
            now!(),
            " + $4, updated_at = ",
            now!(),
            ", ",
            append_attempt!(),
            ", attempt_count = attempt_count + 1",
            held!()
        ))
        .bind(id.as_str())
        .bind(sql::token_arg(token))
        .bind(sql::attempt_json(&attempt))
        .bind(millis(due_in));
        self.bounded(self.finish(id, token, q)).await
    }

    async fn dead(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Option<Attempt>,
        reason: &str,
    ) -> Result<(), QueueError> {
        let q = sqlx::query(concat!(
            "UPDATE queue_messages SET state = 2, lease_until = NULL, reason = $4, updated_at = ",
            now!(),
            ", attempts = CASE WHEN $3::text IS NULL THEN attempts \
               ELSE (attempts::jsonb || jsonb_build_array($3::jsonb))::text END, \
             attempt_count = attempt_count + (CASE WHEN $3::text IS NULL THEN 0 ELSE 1 END)",
            held!()
        ))
        .bind(id.as_str())
        .bind(sql::token_arg(token))
        .bind(attempt.as_ref().map(sql::attempt_json))
        .bind(reason);
        self.bounded(self.finish(id, token, q)).await
    }

    async fn get(&self, id: &DeliveryId) -> Result<Option<Message>, QueueError> {
        self.bounded(async {
            let sql = format!("SELECT {MESSAGE_COLUMNS} FROM queue_messages WHERE id = $1");
            let row: Option<PgRow> = sqlx::query(&sql)
                .bind(id.as_str())
                .fetch_optional(&self.pool)
                .await?;
            row.as_ref().map(sql::message).transpose()
        })
        .await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Page, QueueError> {
        let after = sql::cursor_seq(filter.cursor.as_ref())?;
        let size = filter.page_size();
        self.bounded(async {
            let sql = format!(
                "SELECT {SUMMARY_COLUMNS} FROM queue_messages WHERE seq > $1 \
                 AND ($2::bigint IS NULL OR state = $2) AND ($3::text IS NULL OR queue = $3) \
                 AND ($4::text IS NULL OR tenant = $4) ORDER BY seq LIMIT $5"
            );
            let rows: Vec<PgRow> = sqlx::query(&sql)
                .bind(after)
                .bind(filter.state.map(|s| s.code()))
                .bind(&filter.queue)
                .bind(&filter.tenant)
                .bind(i64::try_from(size + 1).unwrap_or(i64::MAX))
                .fetch_all(&self.pool)
                .await?;
            sql::page(&rows, size)
        })
        .await
    }

    async fn replay(&self, id: &DeliveryId) -> Result<(), QueueError> {
        self.bounded(async {
            let done = sqlx::query(concat!(
                "UPDATE queue_messages SET state = 0, lease_until = NULL, token = token + 1, \
                 leases = 0, cycle_base = attempt_count, cycle_at = ",
                now!(),
                ", due_at = ",
                now!(),
                ", updated_at = ",
                now!(),
                " WHERE id = $1 AND state <> 0"
            ))
            .bind(id.as_str())
            .execute(&self.pool)
            .await?;
            if done.rows_affected() > 0 {
                return Ok(());
            }
            let exists: Option<(i64,)> =
                sqlx::query_as("SELECT state FROM queue_messages WHERE id = $1")
                    .bind(id.as_str())
                    .fetch_optional(&self.pool)
                    .await?;
            Err(match exists {
                Some(_) => QueueError::StillPending(id.clone()),
                None => QueueError::NotFound(id.clone()),
            })
        })
        .await
    }

    async fn purge(&self, id: &DeliveryId) -> Result<bool, QueueError> {
        self.bounded(async {
            let done = sqlx::query("DELETE FROM queue_messages WHERE id = $1")
                .bind(id.as_str())
                .execute(&self.pool)
                .await?;
            Ok(done.rows_affected() > 0)
        })
        .await
    }

    async fn stats(&self, queue: &str) -> Result<Stats, QueueError> {
        self.bounded(async {
            let (depth, oldest, dead): (i64, Option<i64>, i64) = sqlx::query_as(concat!(
                "SELECT (SELECT count(*) FROM queue_messages WHERE queue = $1 AND state = 0), \
                 (SELECT ",
                now!(),
                " - enqueued_at FROM queue_messages WHERE queue = $1 AND state = 0 \
                   ORDER BY seq LIMIT 1), \
                 (SELECT count(*) FROM queue_messages WHERE queue = $1 AND state = 2)"
            ))
            .bind(queue)
            .fetch_one(&self.pool)
            .await?;
            Ok(Stats {
                depth: sql::count(depth),
                oldest_age: oldest.map(from_millis),
                dead: sql::count(dead),
            })
        })
        .await
    }

    async fn sweep(&self, retention: Duration, limit: usize) -> Result<u64, QueueError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.bounded(async {
            let gone = sqlx::query(concat!(
                "DELETE FROM queue_messages WHERE seq IN (SELECT seq FROM queue_messages \
                 WHERE state = 1 AND updated_at <= ",
                now!(),
                " - $1 LIMIT $2)"
            ))
            .bind(millis(retention))
            .bind(limit)
            .execute(&self.pool)
            .await?;
            sqlx::query(concat!(
                "DELETE FROM queue_dedupe WHERE (queue, tenant, key) IN \
                 (SELECT queue, tenant, key FROM queue_dedupe WHERE expires_at <= ",
                now!(),
                " LIMIT $1)"
            ))
            .bind(limit)
            .execute(&self.pool)
            .await?;
            Ok(gone.rows_affected())
        })
        .await
    }

    fn engine(&self) -> &'static str {
        "postgres"
    }
}
