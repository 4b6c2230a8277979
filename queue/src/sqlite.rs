//! SQLite engine: the embedded default, one file next to the gateway.
//!
//! - **Durability**: WAL with `synchronous = FULL`: every commit (an enqueue, an outcome)
//!   is on disk before the call returns, so neither a crash of the gateway nor of the host
//!   loses an accepted message.
//! - **One writer at a time** (SQLite's rule), made explicit: every write goes through one
//!   connection, taken in FIFO order by the pool. Several connections writing would each
//!   meet SQLite's lock and wait in its busy handler, which sleeps in steps of up to 100 ms:
//!   draining a backlog with 256 outcomes in flight on 16 connections recorded about 45
//!   outcomes a second that way. Each decision is one statement or one short transaction
//!   whose first statement writes. Readers (`get`, `list`, `stats`) have their own
//!   connections and run beside the writer (WAL).
//! - **Leasing** is one `UPDATE … WHERE seq IN (SELECT … LIMIT n) RETURNING`, atomic in
//!   SQLite; a lease moves `due_at` to the lease's end, so an expired lease is simply due
//!   again and the lease query needs one index, `(queue, state, due_at)`.
//! - **Time** is SQLite's clock (the host's), in Unix milliseconds.
//! - Several processes may open the same file (each has its own pool); they serialize on
//!   SQLite's file lock. Replicas on different hosts need PostgreSQL or Redis.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};

use crate::codec::encode_headers;
use crate::connect::ConnectOptions;
use crate::error::QueueError;
use crate::message::{
    millis, Attempt, DeliveryId, Enqueued, Leased, ListFilter, Message, NewMessage, Page, Stats,
};
use crate::sql::{self, LEASED_COLUMNS, MESSAGE_COLUMNS, SUMMARY_COLUMNS};
use crate::Queue;

/// The engine's clock in Unix milliseconds (`julianday` has sub-millisecond precision and
/// exists in every SQLite version; `'now'` is fixed within one statement).
macro_rules! now {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS queue_messages (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    id            TEXT NOT NULL UNIQUE,
    queue         TEXT NOT NULL,
    tenant        TEXT,
    state         INTEGER NOT NULL,
    method        TEXT NOT NULL,
    path          TEXT NOT NULL,
    headers       BLOB NOT NULL,
    body          BLOB NOT NULL,
    dedupe_key    TEXT,
    enqueued_at   INTEGER NOT NULL,
    due_at        INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    lease_until   INTEGER,
    token         INTEGER NOT NULL DEFAULT 0,
    leases        INTEGER NOT NULL DEFAULT 0,
    attempt_count INTEGER NOT NULL DEFAULT 0,
    cycle_at      INTEGER,
    cycle_base    INTEGER NOT NULL DEFAULT 0,
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
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (queue, tenant, key)
);
CREATE INDEX IF NOT EXISTS queue_dedupe_expiry ON queue_dedupe (expires_at);
";

/// [`Queue`] in a SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteQueue {
    /// One connection: every write goes through it, in FIFO order (see the module docs).
    writer: SqlitePool,
    /// `pool_size` connections for `get`, `list`, `stats` and the refusal look-ups.
    reader: SqlitePool,
    timeout: Duration,
}

// === impl SqliteQueue ===

impl SqliteQueue {
    /// Opens (creating if missing) the file at `path` and its schema.
    pub async fn open(path: &Path, options: &ConnectOptions) -> Result<Self, QueueError> {
        // SQLite says only "unable to open database file"; creating the file first gets the
        // operating system's reason (missing directory, permissions).
        let shown = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| QueueError::File {
                path: shown.display().to_string(),
                source,
            })?;
        let connect = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(options.timeout);
        // No liveness ping before every statement (sqlx's default): on the one writer it is a
        // round trip to the connection's thread inside the serialized section.
        let writer = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .max_connections(1)
            .acquire_timeout(options.timeout)
            .connect_with(connect.clone())
            .await?;
        sqlx::raw_sql(SCHEMA).execute(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .test_before_acquire(false)
            .max_connections(options.pool_size.max(1))
            .acquire_timeout(options.timeout)
            .connect_with(connect)
            .await?;
        Ok(Self {
            writer,
            reader,
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
        let mut tx = self.writer.begin().await?;
        if let Some(d) = &m.dedupe {
            let tenant = m.tenant.as_deref().unwrap_or_default();
            let won: Option<(String,)> = sqlx::query_as(concat!(
                "INSERT INTO queue_dedupe (queue, tenant, key, id, expires_at) \
                 VALUES ($1, $2, $3, $4, ",
                now!(),
                " + $5) ON CONFLICT (queue, tenant, key) DO UPDATE \
                 SET id = excluded.id, expires_at = excluded.expires_at \
                 WHERE queue_dedupe.expires_at <= ",
                now!(),
                " RETURNING id"
            ))
            .bind(&m.queue)
            .bind(tenant)
            .bind(&d.key)
            .bind(id.as_str())
            .bind(millis(d.window))
            .fetch_optional(&mut *tx)
            .await?;
            if won.is_none() {
                let (first,): (String,) = sqlx::query_as(
                    "SELECT id FROM queue_dedupe WHERE queue = $1 AND tenant = $2 AND key = $3",
                )
                .bind(&m.queue)
                .bind(tenant)
                .bind(&d.key)
                .fetch_one(&mut *tx)
                .await?;
                tx.rollback().await?;
                return Ok(Enqueued::Duplicate(DeliveryId::from_stored(first)));
            }
        }
        sqlx::query(concat!(
            "INSERT INTO queue_messages (id, queue, tenant, state, method, path, headers, body, \
             dedupe_key, enqueued_at, due_at, updated_at) \
             VALUES ($1, $2, $3, 0, $4, $5, $6, $7, $8, ",
            now!(),
            ", ",
            now!(),
            " + $9, ",
            now!(),
            ")"
        ))
        .bind(id.as_str())
        .bind(&m.queue)
        .bind(&m.tenant)
        .bind(&m.method)
        .bind(&m.path_and_query)
        .bind(encode_headers(&m.headers))
        .bind(m.body.as_ref())
        .bind(m.dedupe.as_ref().map(|d| d.key.as_str()))
        .bind(millis(m.delay))
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Enqueued::New(id))
    }

    /// Runs a guarded update of the leased message; when it touches nothing, says why.
    async fn finish<'a>(
        &self,
        id: &DeliveryId,
        token: u64,
        query: sqlx::query::Query<'a, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'a>>,
    ) -> Result<(), QueueError> {
        let done = query.execute(&self.writer).await?;
        if done.rows_affected() > 0 {
            return Ok(());
        }
        let now: Option<(i64, i64, i64)> = sqlx::query_as(concat!(
            "SELECT state, token, CASE WHEN lease_until IS NULL THEN 0 WHEN lease_until > ",
            now!(),
            " THEN 1 ELSE 2 END FROM queue_messages WHERE id = $1"
        ))
        .bind(id.as_str())
        .fetch_optional(&self.reader)
        .await?;
        Err(sql::refusal(id, token, now))
    }
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

#[async_trait]
impl Queue for SqliteQueue {
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
                "UPDATE queue_messages SET token = token + 1, leases = leases + 1, \
                 due_at = {now} + $3, lease_until = {now} + $3, updated_at = {now} \
                 WHERE seq IN (SELECT seq FROM queue_messages \
                   WHERE queue = $1 AND state = 0 AND due_at <= {now} \
                   ORDER BY due_at LIMIT $2) \
                 RETURNING {LEASED_COLUMNS}, {now}",
                now = now!()
            );
            let rows: Vec<SqliteRow> = sqlx::query(&sql)
                .bind(queue)
                .bind(max)
                .bind(millis(lease_for).max(1))
                .fetch_all(&self.writer)
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
        let json = sql::attempt_json(&attempt);
        let q = sqlx::query(concat!(
            "UPDATE queue_messages SET state = 1, lease_until = NULL, due_at = ",
            now!(),
            ", updated_at = ",
            now!(),
            ", attempts = json_insert(attempts, '$[#]', json($3)), \
             attempt_count = attempt_count + 1",
            held!()
        ))
        .bind(id.as_str())
        .bind(sql::token_arg(token))
        .bind(json);
        self.bounded(self.finish(id, token, q)).await
    }

    async fn retry_at(
        &self,
        id: &DeliveryId,
        token: u64,
        attempt: Attempt,
        due_in: Duration,
    ) -> Result<(), QueueError> {
        let json = sql::attempt_json(&attempt);
        let q = sqlx::query(concat!(
            "UPDATE queue_messages SET lease_until = NULL, due_at = ",
            now!(),
            " + $4, updated_at = ",
            now!(),
            ", attempts = json_insert(attempts, '$[#]', json($3)), \
             attempt_count = attempt_count + 1",
            held!()
        ))
        .bind(id.as_str())
        .bind(sql::token_arg(token))
        .bind(json)
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
        let json = attempt.as_ref().map(sql::attempt_json);
        let q = sqlx::query(concat!(
            "UPDATE queue_messages SET state = 2, lease_until = NULL, reason = $4, updated_at = ",
            now!(),
            ", attempts = CASE WHEN $3 IS NULL THEN attempts \
               ELSE json_insert(attempts, '$[#]', json($3)) END, \
             attempt_count = attempt_count + (CASE WHEN $3 IS NULL THEN 0 ELSE 1 END)",
            held!()
        ))
        .bind(id.as_str())
        .bind(sql::token_arg(token))
        .bind(json)
        .bind(reason);
        self.bounded(self.finish(id, token, q)).await
    }

    async fn get(&self, id: &DeliveryId) -> Result<Option<Message>, QueueError> {
        self.bounded(async {
            let sql = format!("SELECT {MESSAGE_COLUMNS} FROM queue_messages WHERE id = $1");
            let row: Option<SqliteRow> = sqlx::query(&sql)
                .bind(id.as_str())
                .fetch_optional(&self.reader)
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
                 AND ($2 IS NULL OR state = $2) AND ($3 IS NULL OR queue = $3) \
                 AND ($4 IS NULL OR tenant = $4) ORDER BY seq LIMIT $5"
            );
            let rows: Vec<SqliteRow> = sqlx::query(&sql)
                .bind(after)
                .bind(filter.state.map(|s| s.code()))
                .bind(&filter.queue)
                .bind(&filter.tenant)
                .bind(i64::try_from(size + 1).unwrap_or(i64::MAX))
                .fetch_all(&self.reader)
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
            .execute(&self.writer)
            .await?;
            if done.rows_affected() > 0 {
                return Ok(());
            }
            let exists: Option<(i64,)> =
                sqlx::query_as("SELECT state FROM queue_messages WHERE id = $1")
                    .bind(id.as_str())
                    .fetch_optional(&self.reader)
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
                .execute(&self.writer)
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
            .fetch_one(&self.reader)
            .await?;
            Ok(Stats {
                depth: sql::count(depth),
                oldest_age: oldest.map(crate::message::from_millis),
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
            .execute(&self.writer)
            .await?;
            sqlx::query(concat!(
                "DELETE FROM queue_dedupe WHERE rowid IN (SELECT rowid FROM queue_dedupe \
                 WHERE expires_at <= ",
                now!(),
                " LIMIT $1)"
            ))
            .bind(limit)
            .execute(&self.writer)
            .await?;
            Ok(gone.rows_affected())
        })
        .await
    }

    fn engine(&self) -> &'static str {
        "sqlite"
    }
}
