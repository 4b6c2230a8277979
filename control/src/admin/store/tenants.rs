//! Tenants: create, list, get, update (including quotas and disabling), delete.

use std::time::Duration;

use super::{
    finish, millis, page_fetch, paginate, per_text, to_i64, to_json, to_u64, AdminStore, Limits,
    NewTenant, Page, RouteQuotaView, TenantPatch, TenantView,
};
use crate::admin::error::AdminError;
use crate::admin::sql::{is_unique_violation, Arg, Tx};
use crate::admin::validate;
use crate::db::{RouteQuotaRow, ROUTE_QUOTAS_SQL};

/// A `tenants` row as the admin API shows it.
#[derive(Debug, sqlx::FromRow)]
struct TenantRecord {
    id: String,
    name: String,
    /// 1 when disabled.
    disabled: i64,
    rate: i64,
    per_ms: i64,
    burst: i64,
    daily_quota: Option<i64>,
    monthly_quota: Option<i64>,
    max_in_flight: Option<i64>,
    max_websockets: Option<i64>,
    websocket_idle_timeout_ms: Option<i64>,
    websocket_max_lifetime_ms: Option<i64>,
    created_at: String,
    updated_at: String,
}

fn tenant_select(tx: &Tx) -> String {
    format!(
        "SELECT id, name, CAST(CASE WHEN disabled THEN 1 ELSE 0 END AS BIGINT) AS disabled, \
         CAST(rate AS BIGINT) AS rate, CAST(per_ms AS BIGINT) AS per_ms, CAST(burst AS BIGINT) AS burst, \
         CAST(daily_quota AS BIGINT) AS daily_quota, CAST(monthly_quota AS BIGINT) AS monthly_quota, \
         CAST(max_in_flight AS BIGINT) AS max_in_flight, CAST(max_websockets AS BIGINT) AS max_websockets, \
         CAST(websocket_idle_timeout_ms AS BIGINT) AS websocket_idle_timeout_ms, \
         CAST(websocket_max_lifetime_ms AS BIGINT) AS websocket_max_lifetime_ms, {}, {} FROM tenants",
        tx.ts("created_at"),
        tx.ts("updated_at")
    )
}

fn view(row: TenantRecord, routes: &[RouteQuotaRow]) -> TenantView {
    let route_quotas = routes
        .iter()
        .filter(|r| r.tenant_id == row.id)
        .map(|r| RouteQuotaView {
            route: r.route_prefix.clone(),
            rate: to_u64(r.rate),
            per: per_text(r.per_ms),
            burst: to_u64(r.burst),
        })
        .collect();
    TenantView {
        id: row.id,
        name: row.name,
        disabled: row.disabled != 0,
        rate: to_u64(row.rate),
        per: per_text(row.per_ms),
        burst: to_u64(row.burst),
        daily_quota: row.daily_quota.map(to_u64),
        monthly_quota: row.monthly_quota.map(to_u64),
        max_in_flight: row.max_in_flight.map(to_u64),
        max_websockets: row.max_websockets.map(to_u64),
        websocket_idle_timeout: row.websocket_idle_timeout_ms.map(per_text),
        websocket_max_lifetime: row.websocket_max_lifetime_ms.map(per_text),
        route_quotas,
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}

/// A duration the view shows as text, read back (`None`: not set).
fn stored_duration(text: Option<&str>) -> Option<Duration> {
    humantime::parse_duration(text?).ok()
}

/// Reads one tenant with its route overrides inside `tx`.
pub(super) async fn load(tx: &mut Tx, id: &str) -> Result<Option<TenantView>, AdminError> {
    let sql = format!("{} WHERE id = $1", tenant_select(tx));
    let Some(row) = tx
        .fetch_optional::<TenantRecord>(&sql, vec![Arg::Text(id.to_owned())])
        .await?
    else {
        return Ok(None);
    };
    let routes: Vec<RouteQuotaRow> = tx
        .fetch_all(
            &format!("{ROUTE_QUOTAS_SQL} WHERE tenant_id = $1 ORDER BY route_prefix"),
            vec![Arg::Text(id.to_owned())],
        )
        .await?;
    Ok(Some(view(row, &routes)))
}

/// Reads one tenant or fails with 404.
pub(super) async fn load_existing(tx: &mut Tx, id: &str) -> Result<TenantView, AdminError> {
    load(tx, id).await?.ok_or_else(|| AdminError::no_tenant(id))
}

// === impl AdminStore ===

impl AdminStore {
    /// Creates a tenant; 409 when the id is taken.
    pub(crate) async fn create_tenant(
        &self,
        actor: &str,
        new: &NewTenant,
    ) -> Result<TenantView, AdminError> {
        self.check_limits(&new.limits)?;
        let mut tx = Tx::begin_change(&self.db).await?;
        if load(&mut tx, &new.id).await?.is_some() {
            return Err(duplicate(&new.id));
        }
        let l = &new.limits;
        let inserted = tx
            .execute(
                "INSERT INTO tenants (id, name, rate, per_ms, burst, daily_quota, monthly_quota, \
                 max_in_flight, max_websockets, websocket_idle_timeout_ms, websocket_max_lifetime_ms) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
                vec![
                    Arg::Text(new.id.clone()),
                    Arg::Text(new.name.clone()),
                    Arg::I64(to_i64(l.rate)),
                    Arg::I64(millis(l.per)),
                    Arg::I64(to_i64(l.burst)),
                    Arg::OptI64(l.daily_quota.map(to_i64)),
                    Arg::OptI64(l.monthly_quota.map(to_i64)),
                    Arg::OptI64(l.max_in_flight.map(to_i64)),
                    Arg::OptI64(l.max_websockets.map(to_i64)),
                    Arg::OptI64(l.websocket_idle_timeout.map(millis)),
                    Arg::OptI64(l.websocket_max_lifetime.map(millis)),
                ],
            )
            .await;
        match inserted {
            Err(err) if is_unique_violation(&err) => return Err(duplicate(&new.id)),
            other => other?,
        };
        let after = load_existing(&mut tx, &new.id).await?;
        finish(tx, actor, "tenant.create", &new.id, None, to_json(&after)).await?;
        Ok(after)
    }

    /// One page of tenants in id order.
    pub(crate) async fn list_tenants(
        &self,
        limit: u64,
        cursor: Option<&str>,
        search: Option<&str>,
    ) -> Result<Page<TenantView>, AdminError> {
        let mut tx = Tx::begin(&self.db).await?;
        let mut sql = tenant_select(&tx);
        sql.push_str(" WHERE 1 = 1");
        let mut args = Vec::new();
        if let Some(cursor) = cursor {
            args.push(Arg::Text(cursor.to_owned()));
            sql.push_str(&format!(" AND id > ${}", args.len()));
        }
        if let Some(search) = search {
            // LOWER on both sides, by the database: SQLite's LIKE ignores ASCII case,
            // PostgreSQL's does not, and only the database folds case as its column does
            // (PostgreSQL folds non-ASCII letters too).
            args.push(Arg::Text(like_contains(search)));
            let n = args.len();
            sql.push_str(&format!(
                " AND (LOWER(id) LIKE LOWER(${n}) ESCAPE '\\' OR LOWER(name) LIKE LOWER(${n}) ESCAPE '\\')"
            ));
        }
        args.push(Arg::I64(page_fetch(limit)));
        sql.push_str(&format!(" ORDER BY id LIMIT ${}", args.len()));
        let rows: Vec<TenantRecord> = tx.fetch_all(&sql, args).await?;
        // Overrides of the page's tenants: ids are ordered, so one range query covers them.
        let routes: Vec<RouteQuotaRow> = match (rows.first(), rows.last()) {
            (Some(first), Some(last)) => {
                tx.fetch_all(
                    &format!("{ROUTE_QUOTAS_SQL} WHERE tenant_id >= $1 AND tenant_id <= $2 ORDER BY route_prefix"),
                    vec![Arg::Text(first.id.clone()), Arg::Text(last.id.clone())],
                )
                .await?
            }
            _ => Vec::new(),
        };
        let items = rows.into_iter().map(|row| view(row, &routes)).collect();
        Ok(paginate(items, limit, |t: &TenantView| t.id.clone()))
    }

    /// One tenant.
    pub(crate) async fn get_tenant(&self, id: &str) -> Result<TenantView, AdminError> {
        let mut tx = Tx::begin(&self.db).await?;
        load_existing(&mut tx, id).await
    }

    /// Applies a partial update, audited as `action`. A patch that changes nothing writes
    /// nothing (no audit row, no reload on the replicas).
    pub(crate) async fn update_tenant(
        &self,
        actor: &str,
        action: &str,
        id: &str,
        patch: &TenantPatch,
    ) -> Result<TenantView, AdminError> {
        let mut tx = Tx::begin_change(&self.db).await?;
        let before = load_existing(&mut tx, id).await?;
        let current_per = humantime::parse_duration(&before.per).unwrap_or(Duration::from_secs(1));
        let limits = Limits {
            rate: patch.rate.unwrap_or(before.rate),
            per: patch.per.unwrap_or(current_per),
            burst: patch.burst.unwrap_or(before.burst),
            daily_quota: patch.daily_quota.unwrap_or(before.daily_quota),
            monthly_quota: patch.monthly_quota.unwrap_or(before.monthly_quota),
            max_in_flight: patch.max_in_flight.unwrap_or(before.max_in_flight),
            max_websockets: patch.max_websockets.unwrap_or(before.max_websockets),
            websocket_idle_timeout: patch
                .websocket_idle_timeout
                .unwrap_or_else(|| stored_duration(before.websocket_idle_timeout.as_deref())),
            websocket_max_lifetime: patch
                .websocket_max_lifetime
                .unwrap_or_else(|| stored_duration(before.websocket_max_lifetime.as_deref())),
        };
        self.check_limits(&limits)?;
        let name = patch.name.clone().unwrap_or_else(|| before.name.clone());
        let disabled = patch.disabled.unwrap_or(before.disabled);
        let unchanged = name == before.name
            && disabled == before.disabled
            && limits.rate == before.rate
            && limits.per == current_per
            && limits.burst == before.burst
            && limits.daily_quota == before.daily_quota
            && limits.monthly_quota == before.monthly_quota
            && limits.max_in_flight == before.max_in_flight
            && limits.max_websockets == before.max_websockets
            && limits.websocket_idle_timeout.map(|d| per_text(millis(d)))
                == before.websocket_idle_timeout
            && limits.websocket_max_lifetime.map(|d| per_text(millis(d)))
                == before.websocket_max_lifetime;
        if unchanged {
            return Ok(before);
        }
        let sql = format!(
            "UPDATE tenants SET name = $2, disabled = $3, rate = $4, per_ms = $5, burst = $6, \
             daily_quota = $7, monthly_quota = $8, max_in_flight = $9, max_websockets = $10, \
             websocket_idle_timeout_ms = $11, websocket_max_lifetime_ms = $12, updated_at = {} WHERE id = $1",
            tx.now()
        );
        tx.execute(
            &sql,
            vec![
                Arg::Text(id.to_owned()),
                Arg::Text(name),
                Arg::Bool(disabled),
                Arg::I64(to_i64(limits.rate)),
                Arg::I64(millis(limits.per)),
                Arg::I64(to_i64(limits.burst)),
                Arg::OptI64(limits.daily_quota.map(to_i64)),
                Arg::OptI64(limits.monthly_quota.map(to_i64)),
                Arg::OptI64(limits.max_in_flight.map(to_i64)),
                Arg::OptI64(limits.max_websockets.map(to_i64)),
                Arg::OptI64(limits.websocket_idle_timeout.map(millis)),
                Arg::OptI64(limits.websocket_max_lifetime.map(millis)),
            ],
        )
        .await?;
        let after = load_existing(&mut tx, id).await?;
        finish(tx, actor, action, id, to_json(&before), to_json(&after)).await?;
        Ok(after)
    }

    /// Deletes a tenant with its keys and overrides (the audit log keeps its history).
    pub(crate) async fn delete_tenant(
        &self,
        actor: &str,
        id: &str,
    ) -> Result<TenantView, AdminError> {
        let mut tx = Tx::begin_change(&self.db).await?;
        let before = load_existing(&mut tx, id).await?;
        // Explicit deletes rather than relying on ON DELETE CASCADE, which SQLite applies
        // only when the connection enabled foreign keys.
        for sql in [
            "DELETE FROM api_keys WHERE tenant_id = $1",
            "DELETE FROM route_quotas WHERE tenant_id = $1",
            "DELETE FROM tenants WHERE id = $1",
        ] {
            tx.execute(sql, vec![Arg::Text(id.to_owned())]).await?;
        }
        finish(tx, actor, "tenant.delete", id, to_json(&before), None).await?;
        Ok(before)
    }

    /// Validates a tenant bucket against the limiter and the configured route costs.
    fn check_limits(&self, limits: &Limits) -> Result<(), AdminError> {
        let errors = validate::bucket(limits.rate, limits.per, limits.burst, self.max_cost());
        if errors.is_empty() {
            Ok(())
        } else {
            Err(AdminError::Invalid(errors))
        }
    }
}

fn duplicate(id: &str) -> AdminError {
    AdminError::Conflict(format!("a tenant with id {id:?} already exists"))
}

/// A LIKE pattern matching values that contain `text` literally (`%`, `_` and the escape
/// character `\` escaped).
fn like_contains(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 2);
    pattern.push('%');
    for c in text.chars() {
        if matches!(c, '%' | '_' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}
