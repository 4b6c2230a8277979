//! Quota endpoints: the tenant bucket and long-period quotas, per-route overrides, and manual
//! reset or top-up of the current day or month.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use http::{Response, StatusCode};
use serde::Serialize;

use super::error::AdminError;
use super::store::{Limits, RouteQuota, RouteQuotaView, TenantPatch, TenantView};
use super::validate::{Fields, MAX_PER, MAX_QUOTA, MAX_RATE};
use super::{Actor, AdminState};
use crate::quota::Period;
use crate::{MAX_TENANT_IN_FLIGHT, MAX_TENANT_WEBSOCKETS, MAX_TENANT_WEBSOCKET_DURATION};

/// Bucket period when `per` is not given on creation.
pub(crate) const DEFAULT_PER: Duration = Duration::from_secs(1);
const MIN_PER: Duration = Duration::from_millis(1);
/// Shortest WebSocket idle timeout or lifetime of a tenant.
const MIN_WEBSOCKET_DURATION: Duration = Duration::from_millis(1);

/// A tenant's limits as `GET /tenants/{id}/quota` shows them.
#[derive(Debug, Serialize)]
struct QuotaView {
    tenant: String,
    rate: u64,
    per: String,
    burst: u64,
    daily_quota: Option<u64>,
    monthly_quota: Option<u64>,
    max_in_flight: Option<u64>,
    max_websockets: Option<u64>,
    websocket_idle_timeout: Option<String>,
    websocket_max_lifetime: Option<String>,
    route_quotas: Vec<RouteQuotaView>,
}

impl From<TenantView> for QuotaView {
    fn from(t: TenantView) -> Self {
        Self {
            tenant: t.id,
            rate: t.rate,
            per: t.per,
            burst: t.burst,
            daily_quota: t.daily_quota,
            monthly_quota: t.monthly_quota,
            max_in_flight: t.max_in_flight,
            max_websockets: t.max_websockets,
            websocket_idle_timeout: t.websocket_idle_timeout,
            websocket_max_lifetime: t.websocket_max_lifetime,
            route_quotas: t.route_quotas,
        }
    }
}

/// Reads `rate` and `burst` (required), `per` (default 1 s), the optional period quotas and
/// the optional concurrency limit `max_in_flight` and the optional WebSocket limits
/// (`max_websockets`, `websocket_idle_timeout`, `websocket_max_lifetime`).
pub(super) fn read_limits(fields: &mut Fields) -> Option<Limits> {
    let rate = fields.u64("rate", 1, MAX_RATE, true);
    let per = if fields.has("per") {
        fields.duration("per", MIN_PER, MAX_PER)
    } else {
        Some(DEFAULT_PER)
    };
    let burst = fields.u64("burst", 1, MAX_RATE, true);
    let daily_quota = fields.patch_u64("daily_quota", 1, MAX_QUOTA).flatten();
    let monthly_quota = fields.patch_u64("monthly_quota", 1, MAX_QUOTA).flatten();
    let max_in_flight = fields
        .patch_u64("max_in_flight", 1, MAX_TENANT_IN_FLIGHT)
        .flatten();
    let max_websockets = fields
        .patch_u64("max_websockets", 1, u64::from(MAX_TENANT_WEBSOCKETS))
        .flatten();
    let websocket_idle_timeout = websocket_duration(fields, "websocket_idle_timeout").flatten();
    let websocket_max_lifetime = websocket_duration(fields, "websocket_max_lifetime").flatten();
    Some(Limits {
        rate: rate?,
        per: per?,
        burst: burst?,
        daily_quota,
        monthly_quota,
        max_in_flight,
        max_websockets,
        websocket_idle_timeout,
        websocket_max_lifetime,
    })
}

/// Reads any of the limit fields into `patch`.
pub(super) fn read_limits_patch(fields: &mut Fields, patch: &mut TenantPatch) {
    patch.rate = fields.u64("rate", 1, MAX_RATE, false);
    patch.per = fields.duration("per", MIN_PER, MAX_PER);
    patch.burst = fields.u64("burst", 1, MAX_RATE, false);
    patch.daily_quota = fields.patch_u64("daily_quota", 1, MAX_QUOTA);
    patch.monthly_quota = fields.patch_u64("monthly_quota", 1, MAX_QUOTA);
    patch.max_in_flight = fields.patch_u64("max_in_flight", 1, MAX_TENANT_IN_FLIGHT);
    patch.max_websockets = fields.patch_u64("max_websockets", 1, u64::from(MAX_TENANT_WEBSOCKETS));
    patch.websocket_idle_timeout = websocket_duration(fields, "websocket_idle_timeout");
    patch.websocket_max_lifetime = websocket_duration(fields, "websocket_max_lifetime");
}

/// A tenant's WebSocket bound: absent → keep, `null` → clear, else a duration string.
fn websocket_duration(fields: &mut Fields, name: &str) -> Option<Option<Duration>> {
    fields.patch_duration(name, MIN_WEBSOCKET_DURATION, MAX_TENANT_WEBSOCKET_DURATION)
}

/// `GET /tenants/{id}/quota`.
pub(super) async fn get(
    State(state): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    let tenant = state.store.get_tenant(&id).await?;
    Ok(Json(QuotaView::from(tenant)).into_response())
}

/// `PATCH /tenants/{id}/quota`: any of `rate`, `per`, `burst`, `daily_quota`,
/// `monthly_quota`, `max_in_flight`, `max_websockets`, `websocket_idle_timeout`,
/// `websocket_max_lifetime` (`null` removes a period quota or a limit).
pub(super) async fn update(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response<Body>, AdminError> {
    let mut fields = Fields::parse(&body).map_err(AdminError::Invalid)?;
    let mut patch = TenantPatch::default();
    read_limits_patch(&mut fields, &mut patch);
    fields.finish().map_err(AdminError::Invalid)?;
    let tenant = state
        .store
        .update_tenant(&actor.0, "quota.update", &id, &patch)
        .await?;
    Ok(Json(QuotaView::from(tenant)).into_response())
}

/// `GET /tenants/{id}/route-quotas`.
pub(super) async fn list_routes(
    State(state): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    let tenant = state.store.get_tenant(&id).await?;
    Ok(Json(serde_json::json!({ "items": tenant.route_quotas })).into_response())
}

/// `PUT /tenants/{id}/route-quotas`: `{route, rate, per?, burst}` sets the override of one
/// configured route (it replaces the route's own limit for this tenant).
pub(super) async fn put_route(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response<Body>, AdminError> {
    let mut fields = Fields::parse(&body).map_err(AdminError::Invalid)?;
    let route = fields.required_string("route");
    let limits = read_bucket(&mut fields);
    fields.finish().map_err(AdminError::Invalid)?;
    let (Some(route), Some((rate, per, burst))) = (route, limits) else {
        return Err(AdminError::invalid("body", "incomplete route quota"));
    };
    let quota = RouteQuota {
        route,
        rate,
        per,
        burst,
    };
    let tenant = state.store.put_route_quota(&actor.0, &id, &quota).await?;
    let view = tenant
        .route_quotas
        .into_iter()
        .find(|r| r.route == quota.route);
    Ok(Json(view).into_response())
}

fn read_bucket(fields: &mut Fields) -> Option<(u64, Duration, u64)> {
    let rate = fields.u64("rate", 1, MAX_RATE, true);
    let per = if fields.has("per") {
        fields.duration("per", MIN_PER, MAX_PER)
    } else {
        Some(DEFAULT_PER)
    };
    let burst = fields.u64("burst", 1, MAX_RATE, true);
    Some((rate?, per?, burst?))
}

/// `DELETE /tenants/{id}/route-quotas?route=/orders` → 204.
pub(super) async fn delete_route(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response<Body>, AdminError> {
    let mut fields = Fields::from_query(query);
    let route = fields.required_string("route");
    fields.finish().map_err(AdminError::Invalid)?;
    let route = route.unwrap_or_default();
    state
        .store
        .delete_route_quota(&actor.0, &id, &route)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /tenants/{id}/periods/{day|month}/reset`: the period's count starts again at 0.
pub(super) async fn reset(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path((id, period)): Path<(String, String)>,
) -> Result<Response<Body>, AdminError> {
    let period = parse_period(&period)?;
    require_tenant(&state, &id).await?;
    let before = period_usage(&state, &id, period).await;
    let after = state.quota.reset_period(&id, period).await?;
    let after_json = serde_json::to_value(&after).ok();
    state
        .store
        .record(&actor.0, "period.reset", &id, before, after_json)
        .await?;
    Ok(Json(after).into_response())
}

/// `POST /tenants/{id}/periods/{day|month}/top-up`: `{amount}` requests are given back in
/// the current period.
pub(super) async fn top_up(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path((id, period)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response<Body>, AdminError> {
    let period = parse_period(&period)?;
    let mut fields = Fields::parse(&body).map_err(AdminError::Invalid)?;
    let amount = fields.u64("amount", 1, MAX_QUOTA, true);
    fields.finish().map_err(AdminError::Invalid)?;
    let amount = amount.unwrap_or(0);
    require_tenant(&state, &id).await?;
    let before = period_usage(&state, &id, period).await;
    let after = state.quota.top_up(&id, period, amount).await?;
    let mut after_json = serde_json::to_value(&after).ok();
    if let Some(serde_json::Value::Object(map)) = after_json.as_mut() {
        map.insert("amount".to_owned(), amount.into());
    }
    state
        .store
        .record(&actor.0, "period.top_up", &id, before, after_json)
        .await?;
    Ok(Json(after).into_response())
}

fn parse_period(text: &str) -> Result<Period, AdminError> {
    match text {
        "day" | "daily" => Ok(Period::Day),
        "month" | "monthly" => Ok(Period::Month),
        _ => Err(AdminError::invalid(
            "period",
            "must be \"day\" or \"month\"",
        )),
    }
}

/// 404 unless the tenant exists in the database (the limiter's view may lag by a moment).
pub(super) async fn require_tenant(state: &AdminState, id: &str) -> Result<(), AdminError> {
    if state.store.tenant_exists(id).await? {
        Ok(())
    } else {
        Err(AdminError::no_tenant(id))
    }
}

/// The period's usage before a change, for the audit log; best effort.
async fn period_usage(state: &AdminState, id: &str, period: Period) -> Option<serde_json::Value> {
    let usage = state.quota.usage(id).await.ok()?;
    let current = usage.periods.into_iter().find(|p| p.period == period)?;
    serde_json::to_value(current).ok()
}
