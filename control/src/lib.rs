//! The Portcullis control plane: everything that decides *who* may call and *how much*, kept
//! apart from the request path that enforces it.
//!
//! - [`db`]: the configuration database (SQLite embedded, PostgreSQL in production), its
//!   migrations, and the seeding of tenants from the configuration file. It returns rows,
//!   never request-path types.
//! - [`Directory`]: the tenant snapshot the data plane reads (API key hash → [`Tenant`] with
//!   its rate-limit policies built once per snapshot), swapped atomically on reload.
//! - [`admin`]: the admin API (tenants, keys, quotas, usage, audit log, idempotency records).
//! - [`cli`]: `portcullis admin …`, a client of that API (the only user of `reqwest`).
//! - [`console`]: the browser console at `/console`, another client of that API.
//!
//! # How the gateway uses it
//!
//! At start-up the gateway connects the [`Database`], seeds it from its file, opens the
//! [`Directory`] and spawns [`Directory::keep_fresh`]. Its tenant-resolution layer reads
//! [`Directory::snapshot`] (one atomic load per request, never the database), and its
//! rate-limit layer reports each 429 to the resolved [`Tenant`]
//! ([`Tenant::record_rate_limited`]), which the usage view shows. The admin listener serves
//! [`admin::router`].
//!
//! # Reload path
//!
//! Every change bumps `config_version` and, on PostgreSQL, sends `NOTIFY portcullis_config`
//! in its transaction. Each replica `LISTEN`s and reloads at once; a version poll every
//! [`REFRESH_INTERVAL`] is the safety net for lost notifications and for SQLite. The replica
//! that made a change through its admin API reloads before answering.
//!
//! ```no_run
//! # async fn demo() -> Result<(), portcullis_control::DbError> {
//! use std::sync::Arc;
//! use portcullis_control::{Database, Directory};
//!
//! let db = Database::sqlite("portcullis.db".as_ref()).await?;
//! let directory = Arc::new(Directory::open(&db).await?);
//! tokio::spawn(directory.clone().keep_fresh(db.clone(), std::future::pending()));
//! let tenant = directory.snapshot().by_key_hash(&[0; 32]).cloned();
//! assert!(tenant.is_none(), "no such key");
//! # Ok(()) }
//! ```

pub mod admin;
pub mod cli;
pub mod console;
pub mod db;
mod directory;
mod quota;
mod quota_admin;
pub mod usage_history;

pub use db::{Database, DbError, TenantSeed};
pub use directory::{
    build_policy, Directory, Snapshot, Tenant, MAX_TENANT_IN_FLIGHT, MAX_TENANT_WEBSOCKETS,
    MAX_TENANT_WEBSOCKET_DURATION, REFRESH_INTERVAL,
};

/// Environment variable holding the admin API's bearer token (read by the gateway's
/// configuration and by the `portcullis admin` CLI).
pub const ENV_ADMIN_TOKEN: &str = "PORTCULLIS_ADMIN_TOKEN";
