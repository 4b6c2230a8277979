//! API key endpoints: issue (the plaintext is in that one response only), list, revoke.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use http::{header, HeaderValue, Response, StatusCode};

use super::error::AdminError;
use super::{Actor, AdminState};

/// `POST /tenants/{id}/keys` → 201 `{id, tenant, prefix, created_at, revoked_at, api_key}`.
pub(super) async fn issue(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(tenant): Path<String>,
) -> Result<Response<Body>, AdminError> {
    let issued = state.store.issue_key(&actor.0, &tenant).await?;
    let mut response = (StatusCode::CREATED, Json(issued)).into_response();
    // The body holds a credential: no cache may keep it.
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// `GET /tenants/{id}/keys` → `{items: [...]}`, prefixes only, revoked keys included.
pub(super) async fn list(
    State(state): State<AdminState>,
    Path(tenant): Path<String>,
) -> Result<Response<Body>, AdminError> {
    let keys = state.store.list_keys(&tenant).await?;
    Ok(Json(serde_json::json!({ "items": keys })).into_response())
}

/// `POST /tenants/{id}/keys/{key_id}/revoke`: the key stops working on every replica within
/// a second. Revoking a revoked key succeeds without a change.
pub(super) async fn revoke(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path((tenant, key_id)): Path<(String, String)>,
) -> Result<Response<Body>, AdminError> {
    let Ok(key_id) = key_id.parse::<i64>() else {
        return Err(AdminError::NotFound(format!(
            "tenant {tenant:?} has no key {key_id:?}"
        )));
    };
    let key = state.store.revoke_key(&actor.0, &tenant, key_id).await?;
    Ok(Json(key).into_response())
}
