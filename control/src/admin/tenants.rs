//! Tenant endpoints: create, list, get, update, disable/enable, delete.

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use http::{header, Response, StatusCode};

use super::error::AdminError;
use super::quotas::{read_limits, read_limits_patch};
use super::store::{NewTenant, TenantPatch, DEFAULT_PAGE, MAX_PAGE};
use super::validate::{self, Fields};
use super::{Actor, AdminState, BASE};

/// `POST /tenants`: `{id, name?, rate, per?, burst, daily_quota?, monthly_quota?,
/// max_in_flight?, max_websockets?, websocket_idle_timeout?, websocket_max_lifetime?}` → 201.
pub(super) async fn create(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Bytes,
) -> Result<Response<Body>, AdminError> {
    let new = parse_new(&body)?;
    let tenant = state.store.create_tenant(&actor.0, &new).await?;
    let location = format!("{BASE}/tenants/{}", tenant.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(tenant),
    )
        .into_response())
}

fn parse_new(body: &[u8]) -> Result<NewTenant, AdminError> {
    let mut fields = Fields::parse(body).map_err(AdminError::Invalid)?;
    let id = fields.required_string("id");
    if let Some(Err(reason)) = id.as_deref().map(validate::tenant_id) {
        fields.push("id", reason);
    }
    let name = read_name(&mut fields).unwrap_or_default();
    let limits = read_limits(&mut fields);
    fields.finish().map_err(AdminError::Invalid)?;
    match (id, limits) {
        (Some(id), Some(limits)) => Ok(NewTenant { id, name, limits }),
        // Unreachable in practice: a missing value always recorded an error above.
        _ => Err(AdminError::invalid("body", "incomplete tenant")),
    }
}

/// Reads and checks the optional `name` field.
fn read_name(fields: &mut Fields) -> Option<String> {
    let name = fields.string("name")?;
    match validate::name(&name) {
        Ok(()) => Some(name),
        Err(reason) => {
            fields.push("name", reason);
            None
        }
    }
}

/// Longest search term of the tenant list.
const MAX_SEARCH: usize = 200;

/// `GET /tenants?q=&limit=&cursor=`: `q` keeps tenants whose id or name contains it,
/// ignoring ASCII case.
pub(super) async fn list(
    State(state): State<AdminState>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response<Body>, AdminError> {
    let mut fields = Fields::from_query(query);
    let limit = fields
        .u64("limit", 1, MAX_PAGE, false)
        .unwrap_or(DEFAULT_PAGE);
    let cursor = fields.string("cursor");
    let search = fields.string("q").filter(|q| !q.is_empty());
    if search.as_ref().is_some_and(|q| q.len() > MAX_SEARCH) {
        fields.push("q", format!("must be at most {MAX_SEARCH} bytes"));
    }
    fields.finish().map_err(AdminError::Invalid)?;
    let page = state
        .store
        .list_tenants(limit, cursor.as_deref(), search.as_deref())
        .await?;
    Ok(Json(page).into_response())
}

/// `GET /tenants/{id}`.
pub(super) async fn get(
    State(state): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    Ok(Json(state.store.get_tenant(&id).await?).into_response())
}

/// `PATCH /tenants/{id}`: any of `name`, `disabled`, `rate`, `per`, `burst`, `daily_quota`,
/// `monthly_quota`, `max_in_flight`, `max_websockets`, `websocket_idle_timeout`,
/// `websocket_max_lifetime` (`null` clears a period quota or a limit).
pub(super) async fn update(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response<Body>, AdminError> {
    let mut fields = Fields::parse(&body).map_err(AdminError::Invalid)?;
    let mut patch = TenantPatch {
        name: read_name(&mut fields),
        disabled: fields.bool("disabled"),
        ..TenantPatch::default()
    };
    read_limits_patch(&mut fields, &mut patch);
    fields.finish().map_err(AdminError::Invalid)?;
    let tenant = state
        .store
        .update_tenant(&actor.0, "tenant.update", &id, &patch)
        .await?;
    Ok(Json(tenant).into_response())
}

/// `POST /tenants/{id}/disable`: its keys are refused with 401 until enabled again.
pub(super) async fn disable(
    state: State<AdminState>,
    actor: Extension<Actor>,
    id: Path<String>,
) -> Result<Response<Body>, AdminError> {
    set_disabled(state, actor, id, true).await
}

/// `POST /tenants/{id}/enable`.
pub(super) async fn enable(
    state: State<AdminState>,
    actor: Extension<Actor>,
    id: Path<String>,
) -> Result<Response<Body>, AdminError> {
    set_disabled(state, actor, id, false).await
}

async fn set_disabled(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    disabled: bool,
) -> Result<Response<Body>, AdminError> {
    let patch = TenantPatch {
        disabled: Some(disabled),
        ..TenantPatch::default()
    };
    let action = if disabled {
        "tenant.disable"
    } else {
        "tenant.enable"
    };
    let tenant = state
        .store
        .update_tenant(&actor.0, action, &id, &patch)
        .await?;
    Ok(Json(tenant).into_response())
}

/// `DELETE /tenants/{id}` → 204. Its keys and overrides go with it; the audit log keeps
/// the deleted state.
pub(super) async fn delete(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    state.store.delete_tenant(&actor.0, &id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
