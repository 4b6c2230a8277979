//! The configuration database (tenants, API keys, quotas, audit log): SQLite for the embedded
//! default, PostgreSQL in production. Migrations are embedded at compile time and applied at
//! start-up; queries are checked at run time so building never needs a live database.
//!
//! This layer returns plain rows ([`ConfigRows`]); turning them into the request path's
//! tenants and policies is the directory's job, so data access never depends on it.

use std::path::Path;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::postgres::{PgPool, PgPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

static SQLITE_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES_MIGRATIONS: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

/// How long start-up waits for the database before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Database failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DbError {
    /// Connecting or querying failed.
    #[error("database error: {0}")]
    Sqlx(#[from] sqlx::Error),
    /// The SQLite file could not be created or opened (a missing directory, no permission).
    /// The OS's reason is the source; the message names the file as the process sees it.
    #[error("cannot create or open the SQLite file {}", path.display())]
    SqliteFile {
        /// The file, made absolute against the working directory.
        path: std::path::PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// SQLite refused a file that exists and could be opened (not a database, locked, its
    /// directory not writable for the WAL files).
    #[error("cannot use the SQLite file {}", path.display())]
    SqliteOpen {
        /// The file, made absolute against the working directory.
        path: std::path::PathBuf,
        /// SQLite's reason.
        source: sqlx::Error,
    },
    /// A migration failed.
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// An API key in the file already belongs to another tenant in the database.
    #[error("tenants[{tenant}]: an API key is already assigned to another tenant")]
    KeyConflict {
        /// Tenant id from the file.
        tenant: String,
    },
}

/// A connection pool to the configured database.
#[derive(Debug, Clone)]
pub enum Database {
    /// Embedded SQLite.
    Sqlite(SqlitePool),
    /// PostgreSQL.
    Postgres(PgPool),
}

/// Connects to PostgreSQL and applies the migrations (idempotent: already applied ones are skipped).
pub async fn connect_postgres(url: &str) -> Result<PgPool, DbError> {
    // No liveness ping before every query: it doubled the round trips per statement
    // (BENCHMARKS.md); a broken connection surfaces as an error on use and is replaced.
    let pool = PgPoolOptions::new()
        .test_before_acquire(false)
        .max_connections(16)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect(url)
        .await?;
    POSTGRES_MIGRATIONS.run(&pool).await?;
    Ok(pool)
}

/// A tenant of the configuration file, upserted at start-up ([`Database::upsert_tenants`]).
#[derive(Clone)]
pub struct TenantSeed<'a> {
    /// Tenant id.
    pub id: &'a str,
    /// Its API keys in plain text (stored only as SHA-256 hashes).
    pub api_keys: Vec<&'a str>,
    /// Tokens per `per`.
    pub rate: u64,
    /// The bucket's period.
    pub per: Duration,
    /// Bucket capacity.
    pub burst: u64,
    /// Requests per UTC day.
    pub daily_quota: Option<u64>,
    /// Requests per UTC month.
    pub monthly_quota: Option<u64>,
    /// Requests of this tenant in flight at once (per replica); `None` = unlimited.
    pub max_in_flight: Option<u64>,
    /// Open WebSocket tunnels of this tenant (per replica); `None` = no cap of its own.
    pub max_websockets: Option<u32>,
    /// The tenant's WebSocket idle timeout; `None` = the route's alone.
    pub websocket_idle_timeout: Option<Duration>,
    /// The tenant's WebSocket maximum lifetime; `None` = the route's alone.
    pub websocket_max_lifetime: Option<Duration>,
}

/// A `tenants` row as the directory reads it.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct TenantRow {
    pub(crate) id: String,
    /// 1 when disabled.
    pub(crate) disabled: i64,
    pub(crate) rate: i64,
    pub(crate) per_ms: i64,
    pub(crate) burst: i64,
    pub(crate) daily_quota: Option<i64>,
    pub(crate) monthly_quota: Option<i64>,
    pub(crate) max_in_flight: Option<i64>,
    pub(crate) max_websockets: Option<i64>,
    pub(crate) websocket_idle_timeout_ms: Option<i64>,
    pub(crate) websocket_max_lifetime_ms: Option<i64>,
}

/// A `route_quotas` row: a tenant's own limit on one route.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct RouteQuotaRow {
    pub(crate) tenant_id: String,
    /// The route's name.
    pub(crate) route_prefix: String,
    pub(crate) rate: i64,
    pub(crate) per_ms: i64,
    pub(crate) burst: i64,
}

/// An active `api_keys` row: the key's hash and its tenant.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct KeyRow {
    pub(crate) key_hash: Vec<u8>,
    pub(crate) tenant_id: String,
}

/// Everything the tenant directory is built from, read at one configuration version.
#[derive(Debug, Default)]
pub(crate) struct ConfigRows {
    pub(crate) version: i64,
    pub(crate) tenants: Vec<TenantRow>,
    pub(crate) keys: Vec<KeyRow>,
    pub(crate) routes: Vec<RouteQuotaRow>,
}

/// SHA-256 of an API key: the only form in which keys are stored or compared.
pub(crate) fn hash_api_key(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

/// The visible prefix of a key, to recognise it in listings without revealing it.
pub(crate) fn key_prefix(key: &str) -> String {
    key.chars().take(6).collect()
}

// === impl Database ===

impl Database {
    /// Opens (creating if missing) a SQLite file and applies migrations.
    pub async fn sqlite(path: &Path) -> Result<Self, DbError> {
        // SQLite says only "unable to open database file" for a missing directory or a
        // permission problem; creating the (empty, hence valid) file first gets the OS's own
        // reason. Absolute, so a relative `sqlite://portcullis.db` says where it was looked for.
        let shown = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|source| DbError::SqliteFile {
                path: shown.clone(),
                source,
            })?;
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(|source| DbError::SqliteOpen {
                path: shown,
                source,
            })?;
        SQLITE_MIGRATIONS.run(&pool).await?;
        Ok(Self::Sqlite(pool))
    }

    /// Connects to PostgreSQL and applies migrations.
    pub async fn postgres(url: &str) -> Result<Self, DbError> {
        Ok(Self::Postgres(connect_postgres(url).await?))
    }

    /// A trivial query, for readiness.
    pub async fn ping(&self) -> Result<(), DbError> {
        match self {
            Self::Sqlite(pool) => sqlx::query("SELECT 1").execute(pool).await.map(|_| ())?,
            Self::Postgres(pool) => sqlx::query("SELECT 1").execute(pool).await.map(|_| ())?,
        }
        Ok(())
    }

    /// A write, for readiness: a no-op update of the configuration version row (the row every
    /// directory change updates). A database that answers `SELECT 1` but refuses writes (a
    /// read-only transaction default, a standby after a fail-over, a full disk) fails it.
    pub async fn check_writes(&self) -> Result<(), DbError> {
        let sql = "UPDATE config_version SET version = version WHERE id = 1";
        match self {
            Self::Sqlite(pool) => sqlx::query(sql).execute(pool).await.map(|_| ())?,
            Self::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|_| ())?,
        }
        Ok(())
    }

    /// Upserts the tenants of the configuration file and their keys (hashed), in one
    /// transaction, and bumps the configuration version so replicas reload.
    pub async fn upsert_tenants(&self, tenants: &[TenantSeed<'_>]) -> Result<(), DbError> {
        // One body for both dialects; only the SQL text differs (placeholders, clock).
        macro_rules! upsert {
            ($pool:expr, $sql:expr) => {{
                let sql: &UpsertSql = $sql;
                let mut tx = $pool.begin().await?;
                for t in tenants {
                    sqlx::query(sql.tenant)
                        .bind(t.id)
                        .bind(to_i64(t.rate))
                        .bind(duration_ms(t.per))
                        .bind(to_i64(t.burst))
                        .bind(t.daily_quota.map(to_i64))
                        .bind(t.monthly_quota.map(to_i64))
                        .bind(t.max_in_flight.map(to_i64))
                        .bind(t.max_websockets.map(i64::from))
                        .bind(t.websocket_idle_timeout.map(duration_ms))
                        .bind(t.websocket_max_lifetime.map(duration_ms))
                        .execute(&mut *tx)
                        .await?;
                    for key in &t.api_keys {
                        let hash = hash_api_key(key);
                        let owner: Option<String> = sqlx::query_scalar(sql.key_owner)
                            .bind(&hash)
                            .fetch_optional(&mut *tx)
                            .await?;
                        match owner {
                            Some(owner) if owner != t.id => {
                                return Err(DbError::KeyConflict {
                                    tenant: t.id.to_owned(),
                                })
                            }
                            Some(_) => {}
                            None => {
                                sqlx::query(sql.insert_key)
                                    .bind(t.id)
                                    .bind(&hash)
                                    .bind(key_prefix(key))
                                    .execute(&mut *tx)
                                    .await?;
                            }
                        }
                    }
                }
                sqlx::query("UPDATE config_version SET version = version + 1 WHERE id = 1")
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
            }};
        }
        match self {
            Self::Sqlite(pool) => upsert!(pool, &SQLITE_UPSERT),
            Self::Postgres(pool) => upsert!(pool, &POSTGRES_UPSERT),
        }
        Ok(())
    }

    /// The configuration version, bumped by every change.
    pub(crate) async fn config_version(&self) -> Result<i64, DbError> {
        let sql = "SELECT CAST(version AS BIGINT) FROM config_version WHERE id = 1";
        let version = match self {
            Self::Sqlite(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
            Self::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await?,
        };
        Ok(version)
    }

    /// Reads tenants, active key hashes and route overrides at one version. The version is
    /// read first: a change racing the read bumps it again and triggers another reload.
    pub(crate) async fn load_rows(&self) -> Result<ConfigRows, DbError> {
        let version = self.config_version().await?;
        macro_rules! load {
            ($pool:expr) => {{
                let tenants: Vec<TenantRow> = sqlx::query_as(TENANTS_SQL).fetch_all($pool).await?;
                let keys: Vec<KeyRow> = sqlx::query_as(KEYS_SQL).fetch_all($pool).await?;
                let routes: Vec<RouteQuotaRow> =
                    sqlx::query_as(ROUTE_QUOTAS_SQL).fetch_all($pool).await?;
                (tenants, keys, routes)
            }};
        }
        let (tenants, keys, routes) = match self {
            Self::Sqlite(pool) => load!(pool),
            Self::Postgres(pool) => load!(pool),
        };
        Ok(ConfigRows {
            version,
            tenants,
            keys,
            routes,
        })
    }

    /// Closes the pool.
    pub async fn close(&self) {
        match self {
            Self::Sqlite(pool) => pool.close().await,
            Self::Postgres(pool) => pool.close().await,
        }
    }
}

/// The statements of `upsert_tenants`, per dialect.
struct UpsertSql {
    tenant: &'static str,
    key_owner: &'static str,
    insert_key: &'static str,
}

const SQLITE_UPSERT: UpsertSql = UpsertSql {
    tenant: "INSERT INTO tenants (id, rate, per_ms, burst, daily_quota, monthly_quota, max_in_flight, \
         max_websockets, websocket_idle_timeout_ms, websocket_max_lifetime_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) \
         ON CONFLICT (id) DO UPDATE SET rate = excluded.rate, per_ms = excluded.per_ms, burst = excluded.burst, \
         daily_quota = excluded.daily_quota, monthly_quota = excluded.monthly_quota, max_in_flight = excluded.max_in_flight, \
         max_websockets = excluded.max_websockets, websocket_idle_timeout_ms = excluded.websocket_idle_timeout_ms, \
         websocket_max_lifetime_ms = excluded.websocket_max_lifetime_ms, \
         updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')",
    key_owner: "SELECT tenant_id FROM api_keys WHERE key_hash = ?1",
    insert_key: "INSERT INTO api_keys (tenant_id, key_hash, prefix) VALUES (?1, ?2, ?3)",
};

const POSTGRES_UPSERT: UpsertSql = UpsertSql {
    tenant: "INSERT INTO tenants (id, rate, per_ms, burst, daily_quota, monthly_quota, max_in_flight, \
         max_websockets, websocket_idle_timeout_ms, websocket_max_lifetime_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT (id) DO UPDATE SET rate = excluded.rate, per_ms = excluded.per_ms, burst = excluded.burst, \
         daily_quota = excluded.daily_quota, monthly_quota = excluded.monthly_quota, max_in_flight = excluded.max_in_flight, \
         max_websockets = excluded.max_websockets, websocket_idle_timeout_ms = excluded.websocket_idle_timeout_ms, \
         websocket_max_lifetime_ms = excluded.websocket_max_lifetime_ms, \
         updated_at = now()",
    key_owner: "SELECT tenant_id FROM api_keys WHERE key_hash = $1",
    insert_key: "INSERT INTO api_keys (tenant_id, key_hash, prefix) VALUES ($1, $2, $3)",
};

const TENANTS_SQL: &str = "SELECT id, CAST(CASE WHEN disabled THEN 1 ELSE 0 END AS BIGINT) AS disabled, \
     CAST(rate AS BIGINT) AS rate, CAST(per_ms AS BIGINT) AS per_ms, CAST(burst AS BIGINT) AS burst, \
     CAST(daily_quota AS BIGINT) AS daily_quota, CAST(monthly_quota AS BIGINT) AS monthly_quota, \
     CAST(max_in_flight AS BIGINT) AS max_in_flight, CAST(max_websockets AS BIGINT) AS max_websockets, \
     CAST(websocket_idle_timeout_ms AS BIGINT) AS websocket_idle_timeout_ms, \
     CAST(websocket_max_lifetime_ms AS BIGINT) AS websocket_max_lifetime_ms FROM tenants";
const KEYS_SQL: &str = "SELECT key_hash, tenant_id FROM api_keys WHERE revoked_at IS NULL";
/// Every route override; the admin API adds its own `WHERE`.
pub(crate) const ROUTE_QUOTAS_SQL: &str =
    "SELECT tenant_id, route_prefix, CAST(rate AS BIGINT) AS rate, CAST(per_ms AS BIGINT) AS per_ms, \
     CAST(burst AS BIGINT) AS burst FROM route_quotas";

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sqlite_file_that_cannot_be_created_names_the_path_and_the_os_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing-dir").join("p.db");
        match Database::sqlite(&path).await {
            Err(DbError::SqliteFile {
                path: shown,
                source,
            }) => {
                assert_eq!(shown, path);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            other => panic!("expected SqliteFile, got {other:?}"),
        }
    }
}
