//! `GET /tenants/{id}/usage`: current bucket state, period usage and 429 count, read without
//! consuming anything (through [`QuotaAdmin::usage`](crate::quota::QuotaAdmin::usage)).

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use axum::Json;
use http::Response;

use super::error::AdminError;
use super::quotas::require_tenant;
use super::AdminState;

/// The usage view. Bucket state comes from the shared state store (all replicas' traffic
/// with Redis, this replica's with memory state); `rejected_total` counts this replica's 429s.
pub(super) async fn get(
    State(state): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    require_tenant(&state, &id).await?;
    let usage = state.quota.usage(&id).await?;
    Ok(Json(usage).into_response())
}
