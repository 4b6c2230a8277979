//! The audit log: the row every change writes in its own transaction (with the state before
//! and after), and the filtered, paged reading of it.

use serde::Serialize;
use serde_json::Value;

use super::page::{page_fetch, paginate, Page};
use super::AdminStore;
use crate::admin::error::AdminError;
use crate::admin::sql::{Arg, Tx};

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

// === impl AdminStore ===

impl AdminStore {
    /// [`AdminStore::record`] for an action that belongs to no tenant (or an anonymous
    /// caller's): a delivery replayed or purged.
    pub(crate) async fn record_untenanted(
        &self,
        actor: &str,
        action: &str,
        before: Option<Value>,
        after: Option<Value>,
    ) -> Result<(), AdminError> {
        let mut tx = Tx::begin(&self.db).await?;
        audit(&mut tx, actor, action, None, before, after).await?;
        tx.commit().await?;
        tracing::info!(action, actor, "admin change committed");
        Ok(())
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
            "SELECT CAST(id AS BIGINT) AS id, {}, actor, action, tenant_id, {}, {} FROM audit_log WHERE 1 = 1",
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
        let rows: Vec<AuditRow> = tx.fetch_all(&sql, args).await?;
        let entries = rows
            .into_iter()
            .map(|row| AuditEntry {
                id: row.id,
                at: row.at,
                actor: row.actor,
                action: row.action,
                tenant: row.tenant_id,
                before: parse_json(row.before),
                after: parse_json(row.after),
            })
            .collect();
        Ok(paginate(entries, limit, |e| e.id.to_string()))
    }
}

/// Writes the audit row, announces the change and commits: the end of every change.
pub(super) async fn finish(
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

/// Writes one audit row in `tx`.
pub(super) async fn audit(
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

/// A stored JSON column as a value (`NULL` or unreadable: `null`).
fn parse_json(text: Option<String>) -> Value {
    text.and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

/// A value as the audit row's JSON (`None` if it cannot be serialised).
pub(super) fn to_json<T: Serialize>(value: &T) -> Option<Value> {
    serde_json::to_value(value).ok()
}

/// An `audit_log` row; `before` and `after` are JSON text.
#[derive(Debug, sqlx::FromRow)]
struct AuditRow {
    id: i64,
    at: String,
    actor: String,
    action: String,
    tenant_id: Option<String>,
    before: Option<String>,
    after: Option<String>,
}
