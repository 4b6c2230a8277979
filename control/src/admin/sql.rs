//! The two SQL dialects behind one small interface, so every admin query is written once.
//!
//! Queries use `$1, $2, …` placeholders in both dialects (sqlx-sqlite maps `$N` to the N-th
//! argument) and are always parameterised: the only text spliced into SQL comes from the
//! [`Tx::now`], [`Tx::ts`], [`Tx::json_in`] and [`Tx::json_out`] fragments below, which are
//! constants of the dialect, never input.

use sqlx::postgres::PgRow;
use sqlx::sqlite::SqliteRow;
use sqlx::{FromRow, Postgres, Sqlite, Transaction};

use crate::db::Database;

use crate::directory::notify::CHANNEL;

/// One bound parameter.
#[derive(Debug, Clone)]
pub(crate) enum Arg {
    I64(i64),
    OptI64(Option<i64>),
    Text(String),
    OptText(Option<String>),
    Bytes(Vec<u8>),
    Bool(bool),
}

/// A transaction on either database. Dropping it without [`Tx::commit`] rolls back.
pub(crate) enum Tx {
    Sqlite(Transaction<'static, Sqlite>),
    Postgres(Transaction<'static, Postgres>),
}

/// Row types readable from both databases.
pub(crate) trait AnyRow:
    for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{
}
impl<T> AnyRow for T where
    T: for<'r> FromRow<'r, SqliteRow> + for<'r> FromRow<'r, PgRow> + Send + Unpin
{
}

macro_rules! bind_args {
    ($query:expr, $args:expr) => {{
        let mut query = $query;
        for arg in $args {
            query = match arg {
                Arg::I64(v) => query.bind(v),
                Arg::OptI64(v) => query.bind(v),
                Arg::Text(v) => query.bind(v),
                Arg::OptText(v) => query.bind(v),
                Arg::Bytes(v) => query.bind(v),
                Arg::Bool(v) => query.bind(v),
            };
        }
        query
    }};
}

// === impl Tx ===

impl Tx {
    /// Starts a transaction.
    pub(crate) async fn begin(db: &Database) -> Result<Self, sqlx::Error> {
        Ok(match db {
            Database::Sqlite(pool) => Self::Sqlite(pool.begin().await?),
            Database::Postgres(pool) => Self::Postgres(pool.begin().await?),
        })
    }

    /// Starts a configuration change: bumps `config_version` first. That takes the write lock
    /// at once (SQLite: no deferred read→write upgrade that could fail with SQLITE_BUSY;
    /// PostgreSQL: a row lock), so concurrent admin changes are serialised and every
    /// check-then-write inside the transaction sees a stable state.
    pub(crate) async fn begin_change(db: &Database) -> Result<Self, sqlx::Error> {
        let mut tx = Self::begin(db).await?;
        tx.execute(
            "UPDATE config_version SET version = version + 1 WHERE id = 1",
            vec![],
        )
        .await?;
        Ok(tx)
    }

    /// Announces the change to every replica; delivered by PostgreSQL only at commit, so a
    /// rolled-back change announces nothing. SQLite replicas poll.
    pub(crate) async fn announce(&mut self) -> Result<(), sqlx::Error> {
        if let Self::Postgres(tx) = self {
            sqlx::query("SELECT pg_notify($1, '')")
                .bind(CHANNEL)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// Runs a statement; returns the number of rows affected.
    pub(crate) async fn execute(&mut self, sql: &str, args: Vec<Arg>) -> Result<u64, sqlx::Error> {
        Ok(match self {
            Self::Sqlite(tx) => bind_args!(sqlx::query(sql), args)
                .execute(&mut **tx)
                .await?
                .rows_affected(),
            Self::Postgres(tx) => bind_args!(sqlx::query(sql), args)
                .execute(&mut **tx)
                .await?
                .rows_affected(),
        })
    }

    /// All rows of a query.
    pub(crate) async fn fetch_all<T: AnyRow>(
        &mut self,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Vec<T>, sqlx::Error> {
        match self {
            Self::Sqlite(tx) => {
                bind_args!(sqlx::query_as::<_, T>(sql), args)
                    .fetch_all(&mut **tx)
                    .await
            }
            Self::Postgres(tx) => {
                bind_args!(sqlx::query_as::<_, T>(sql), args)
                    .fetch_all(&mut **tx)
                    .await
            }
        }
    }

    /// The first row of a query, if any.
    pub(crate) async fn fetch_optional<T: AnyRow>(
        &mut self,
        sql: &str,
        args: Vec<Arg>,
    ) -> Result<Option<T>, sqlx::Error> {
        match self {
            Self::Sqlite(tx) => {
                bind_args!(sqlx::query_as::<_, T>(sql), args)
                    .fetch_optional(&mut **tx)
                    .await
            }
            Self::Postgres(tx) => {
                bind_args!(sqlx::query_as::<_, T>(sql), args)
                    .fetch_optional(&mut **tx)
                    .await
            }
        }
    }

    /// Commits.
    pub(crate) async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Self::Sqlite(tx) => tx.commit().await,
            Self::Postgres(tx) => tx.commit().await,
        }
    }

    /// The current time as a column value (UTC).
    pub(crate) fn now(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
            Self::Postgres(_) => "now()",
        }
    }

    /// A timestamp column as RFC 3339 text with milliseconds, the same in both dialects
    /// (SQLite already stores that text).
    pub(crate) fn ts(&self, column: &str) -> String {
        match self {
            Self::Sqlite(_) => column.to_owned(),
            Self::Postgres(_) => format!(
                r#"to_char({column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS {column}"#
            ),
        }
    }

    /// A JSON parameter as a column value (JSONB in PostgreSQL, TEXT in SQLite).
    pub(crate) fn json_in(&self, placeholder: &str) -> String {
        match self {
            Self::Sqlite(_) => placeholder.to_owned(),
            Self::Postgres(_) => format!("CAST({placeholder} AS JSONB)"),
        }
    }

    /// A JSON column as text.
    pub(crate) fn json_out(&self, column: &str) -> String {
        match self {
            Self::Sqlite(_) => column.to_owned(),
            Self::Postgres(_) => format!("CAST({column} AS TEXT) AS {column}"),
        }
    }
}

/// Whether a database error is a unique-constraint violation (a duplicate id).
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(e) if e.is_unique_violation())
}
