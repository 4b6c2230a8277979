//! The admin API's SQL: tenants, API keys, quotas and the audit log, in SQLite and PostgreSQL.
//!
//! # One change, one transaction
//!
//! Every change runs in one transaction that (1) bumps `config_version` first, which
//! serialises concurrent admin changes, (2) reads the state before, (3) validates and writes,
//! (4) reads the state after, (5) writes the audit row with both, (6) `NOTIFY`s replicas
//! (PostgreSQL; delivered at commit), then commits. Any failure drops the transaction, so a
//! 4xx/5xx never leaves anything half-written — not even an audit row.
//!
//! Queries are runtime-checked and parameterised; they are covered by the conformance tests
//! in `store/tests.rs`, which run against SQLite and a real PostgreSQL.

mod audit;
mod changes;
mod columns;
mod keys;
mod page;
mod tenants;
#[cfg(test)]
mod tests;
mod views;

use std::sync::Arc;

use super::error::AdminError;
use super::sql::{Arg, Tx};
use super::validate::ConfiguredRoute;
use crate::db::Database;
use audit::{finish, to_json};
use columns::{millis, per_text, to_i64, to_u64};
use page::{page_fetch, paginate};

pub(crate) use audit::AuditFilter;
pub(crate) use changes::{Limits, NewTenant, RouteQuota, TenantPatch};
pub(crate) use page::{Page, DEFAULT_PAGE, MAX_PAGE};
pub(crate) use views::{IssuedKey, KeyView, RouteQuotaView, TenantView};

/// The admin store: the database plus the configured routes quota values are checked against.
#[derive(Debug, Clone)]
pub(crate) struct AdminStore {
    db: Database,
    routes: Arc<[ConfiguredRoute]>,
}

// === impl AdminStore ===

impl AdminStore {
    /// A store over `db`; quota values are checked against `routes`.
    pub(crate) fn new(db: Database, routes: Arc<[ConfiguredRoute]>) -> Self {
        Self { db, routes }
    }

    /// Whether a tenant exists.
    pub(crate) async fn tenant_exists(&self, id: &str) -> Result<bool, AdminError> {
        let mut tx = Tx::begin(&self.db).await?;
        let found: Option<(String,)> = tx
            .fetch_optional(
                "SELECT id FROM tenants WHERE id = $1",
                vec![Arg::Text(id.to_owned())],
            )
            .await?;
        Ok(found.is_some())
    }

    /// The largest cost of any configured route: the least burst a tenant bucket may have.
    fn max_cost(&self) -> u32 {
        self.routes.iter().map(|r| r.cost).max().unwrap_or(1)
    }

    /// The configured routes.
    pub(crate) fn routes(&self) -> &[ConfiguredRoute] {
        &self.routes
    }
}
