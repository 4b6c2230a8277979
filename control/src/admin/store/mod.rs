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

mod keys;
mod tenants;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::error::AdminError;
use super::sql::{Arg, Tx};
use super::validate::{ConfiguredRoute, Patch};
use crate::db::Database;

/// Most items one list page returns.
pub(crate) const MAX_PAGE: u64 = 500;
/// Items per page when `limit` is not given.
pub(crate) const DEFAULT_PAGE: u64 = 50;

/// The admin store: the database plus the configured routes quota values are checked against.
#[derive(Debug, Clone)]
pub(crate) struct AdminStore {
    db: Database,
    routes: Arc<[ConfiguredRoute]>,
}

/// A tenant as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct TenantView {
    /// Tenant id.
    pub(crate) id: String,
    /// Display name.
    pub(crate) name: String,
    /// Disabled tenants' keys are refused with 401.
    pub(crate) disabled: bool,
    /// Tokens per `per`.
    pub(crate) rate: u64,
    /// Bucket period (`"1s"`).
    pub(crate) per: String,
    /// Bucket capacity.
    pub(crate) burst: u64,
    /// Requests per UTC day, if limited.
    pub(crate) daily_quota: Option<u64>,
    /// Requests per UTC month, if limited.
    pub(crate) monthly_quota: Option<u64>,
    /// Requests in flight at once (per replica), if limited.
    pub(crate) max_in_flight: Option<u64>,
    /// Per-route overrides of the bucket.
    pub(crate) route_quotas: Vec<RouteQuotaView>,
    /// Creation time (RFC 3339, UTC).
    pub(crate) created_at: String,
    /// Last change (RFC 3339, UTC).
    pub(crate) updated_at: String,
}

/// A per-route override.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RouteQuotaView {
    /// Route prefix.
    pub(crate) route: String,
    /// Tokens per `per`.
    pub(crate) rate: u64,
    /// Bucket period.
    pub(crate) per: String,
    /// Bucket capacity.
    pub(crate) burst: u64,
}

/// An API key as listings show it: never the key, never its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KeyView {
    /// Key id (for revocation).
    pub(crate) id: i64,
    /// Owning tenant.
    pub(crate) tenant: String,
    /// The first characters of the key, to recognise it.
    pub(crate) prefix: String,
    /// Issue time.
    pub(crate) created_at: String,
    /// Revocation time, if revoked.
    pub(crate) revoked_at: Option<String>,
}

/// A freshly issued key: the only time the plaintext exists outside the client. Deliberately
/// without `Debug`, so it cannot end up in a log line by accident.
#[derive(Clone, Serialize)]
pub(crate) struct IssuedKey {
    /// The stored part.
    #[serde(flatten)]
    pub(crate) key: KeyView,
    /// The plaintext key, shown once.
    pub(crate) api_key: String,
}

/// One audit log entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct AuditEntry {
    /// Sequence number (newest is largest).
    pub(crate) id: i64,
    /// When (RFC 3339, UTC).
    pub(crate) at: String,
    /// Who: `admin-token`, or `admin-token:<X-Admin-Actor>`.
    pub(crate) actor: String,
    /// What (`tenant.create`, `quota.update`, …).
    pub(crate) action: String,
    /// Affected tenant.
    pub(crate) tenant: Option<String>,
    /// State before (`null` for creations).
    pub(crate) before: Value,
    /// State after (`null` for deletions).
    pub(crate) after: Value,
}

/// One page of a listing.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Page<T> {
    /// The items.
    pub(crate) items: Vec<T>,
    /// Pass as `cursor` to get the next page; `null` on the last page.
    pub(crate) next_cursor: Option<String>,
}

/// A token bucket plus long-period quotas, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// Tokens per `per`.
    pub(crate) rate: u64,
    /// Bucket period.
    pub(crate) per: Duration,
    /// Bucket capacity.
    pub(crate) burst: u64,
    /// Requests per UTC day.
    pub(crate) daily_quota: Option<u64>,
    /// Requests per UTC month.
    pub(crate) monthly_quota: Option<u64>,
    /// Requests in flight at once (per replica).
    pub(crate) max_in_flight: Option<u64>,
}

/// A tenant to create.
#[derive(Debug, Clone)]
pub(crate) struct NewTenant {
    /// Tenant id.
    pub(crate) id: String,
    /// Display name.
    pub(crate) name: String,
    /// Its limits.
    pub(crate) limits: Limits,
}

/// A partial update of a tenant; `None` keeps the current value.
#[derive(Debug, Clone, Default)]
pub(crate) struct TenantPatch {
    /// New display name.
    pub(crate) name: Option<String>,
    /// Disable or enable.
    pub(crate) disabled: Option<bool>,
    /// New rate.
    pub(crate) rate: Option<u64>,
    /// New period.
    pub(crate) per: Option<Duration>,
    /// New burst.
    pub(crate) burst: Option<u64>,
    /// Daily quota: keep, clear (`Some(None)`) or set.
    pub(crate) daily_quota: Patch<u64>,
    /// Monthly quota: keep, clear or set.
    pub(crate) monthly_quota: Patch<u64>,
    /// Concurrency limit: keep, clear or set.
    pub(crate) max_in_flight: Patch<u64>,
}

/// A per-route override to set.
#[derive(Debug, Clone)]
pub(crate) struct RouteQuota {
    /// Route prefix (one of the configured routes).
    pub(crate) route: String,
    /// Tokens per `per`.
    pub(crate) rate: u64,
    /// Bucket period.
    pub(crate) per: Duration,
    /// Bucket capacity.
    pub(crate) burst: u64,
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

    /// Writes an audit row on its own, for actions on state outside the database (period
    /// reset and top-up live in the rate-limit store, idempotency records in theirs).
    pub(crate) async fn record(
        &self,
        actor: &str,
        action: &str,
        tenant: &str,
        before: Option<Value>,
        after: Option<Value>,
    ) -> Result<(), AdminError> {
        let mut tx = Tx::begin(&self.db).await?;
        audit(&mut tx, actor, action, Some(tenant), before, after).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Audit entries, newest first, filtered; `cursor` is the `next_cursor` of the
    /// previous page.
    pub(crate) async fn audit_log(
        &self,
        filter: &AuditFilter,
        limit: u64,
        cursor: Option<i64>,
    ) -> Result<Page<AuditEntry>, AdminError> {
        let mut tx = Tx::begin(&self.db).await?;
        let mut sql = format!(
            "SELECT CAST(id AS BIGINT), {}, actor, action, tenant_id, {}, {} FROM audit_log WHERE 1 = 1",
            tx.ts("at"),
            tx.json_out("before"),
            tx.json_out("after")
        );
        let mut args = Vec::new();
        for (column, value) in [
            ("tenant_id", &filter.tenant),
            ("action", &filter.action),
            ("actor", &filter.actor),
        ] {
            if let Some(value) = value {
                args.push(Arg::Text(value.clone()));
                sql.push_str(&format!(" AND {column} = ${}", args.len()));
            }
        }
        if let Some(cursor) = cursor {
            args.push(Arg::I64(cursor));
            sql.push_str(&format!(" AND id < ${}", args.len()));
        }
        args.push(Arg::I64(page_fetch(limit)));
        sql.push_str(&format!(" ORDER BY id DESC LIMIT ${}", args.len()));
        type Row = (
            i64,
            String,
            String,
            String,
            Option<String>,
            Option<String>,
            Option<String>,
        );
        let rows: Vec<Row> = tx.fetch_all(&sql, args).await?;
        let entries = rows
            .into_iter()
            .map(
                |(id, at, actor, action, tenant, before, after)| AuditEntry {
                    id,
                    at,
                    actor,
                    action,
                    tenant,
                    before: parse_json(before),
                    after: parse_json(after),
                },
            )
            .collect();
        Ok(paginate(entries, limit, |e| e.id.to_string()))
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

/// Writes the audit row, announces the change and commits: the end of every change.
async fn finish(
    mut tx: Tx,
    actor: &str,
    action: &str,
    tenant: &str,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<(), AdminError> {
    audit(&mut tx, actor, action, Some(tenant), before, after).await?;
    tx.announce().await?;
    tx.commit().await?;
    tracing::info!(action, tenant, actor, "admin change committed");
    Ok(())
}

async fn audit(
    tx: &mut Tx,
    actor: &str,
    action: &str,
    tenant: Option<&str>,
    before: Option<Value>,
    after: Option<Value>,
) -> Result<(), AdminError> {
    let sql = format!(
        "INSERT INTO audit_log (actor, action, tenant_id, before, after) VALUES ($1, $2, $3, {}, {})",
        tx.json_in("$4"),
        tx.json_in("$5")
    );
    let json = |v: Option<Value>| v.map(|v| v.to_string());
    tx.execute(
        &sql,
        vec![
            Arg::Text(actor.to_owned()),
            Arg::Text(action.to_owned()),
            Arg::OptText(tenant.map(str::to_owned)),
            Arg::OptText(json(before)),
            Arg::OptText(json(after)),
        ],
    )
    .await?;
    Ok(())
}

fn parse_json(text: Option<String>) -> Value {
    text.and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// Filters of the audit log; each one set is an exact match.
#[derive(Debug, Default, Clone)]
pub(crate) struct AuditFilter {
    /// Entries about this tenant.
    pub(crate) tenant: Option<String>,
    /// Entries of this action (`tenant.create`, `key.revoke`, …).
    pub(crate) action: Option<String>,
    /// Entries by this actor (`admin-token` or `admin-token:<X-Admin-Actor>`).
    pub(crate) actor: Option<String>,
}

impl AuditFilter {
    /// Entries about `tenant` only.
    #[cfg(test)]
    pub(crate) fn of_tenant(tenant: &str) -> Self {
        Self {
            tenant: Some(tenant.to_owned()),
            ..Self::default()
        }
    }
}

/// Rows to fetch for a page: one more than shown, to know whether another page follows.
fn page_fetch(limit: u64) -> i64 {
    i64::try_from(limit.clamp(1, MAX_PAGE) + 1).unwrap_or(i64::MAX)
}

fn paginate<T>(mut items: Vec<T>, limit: u64, cursor_of: impl Fn(&T) -> String) -> Page<T> {
    let limit = usize::try_from(limit.clamp(1, MAX_PAGE)).unwrap_or(usize::MAX);
    let next_cursor = if items.len() > limit {
        items.truncate(limit);
        items.last().map(cursor_of)
    } else {
        None
    };
    Page { items, next_cursor }
}

/// A stored duration in milliseconds as the API shows it (`"1s"`, `"1m 30s"`).
fn per_text(per_ms: i64) -> String {
    humantime::format_duration(Duration::from_millis(u64::try_from(per_ms).unwrap_or(0)))
        .to_string()
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn to_json<T: Serialize>(value: &T) -> Option<Value> {
    serde_json::to_value(value).ok()
}
