//! `GET /audit?tenant=&action=&actor=&limit=&cursor=`: every change with actor, time,
//! before and after, newest first; each filter is an exact match.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::Json;
use http::Response;

use super::error::AdminError;
use super::store::{AuditFilter, DEFAULT_PAGE, MAX_PAGE};
use super::validate::Fields;
use super::AdminState;

/// One page of the audit log, optionally for one tenant.
pub(super) async fn list(
    State(state): State<AdminState>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response<Body>, AdminError> {
    let mut fields = Fields::from_query(query);
    let filter = AuditFilter {
        tenant: fields.string("tenant").filter(|v| !v.is_empty()),
        action: fields.string("action").filter(|v| !v.is_empty()),
        actor: fields.string("actor").filter(|v| !v.is_empty()),
    };
    let limit = fields
        .u64("limit", 1, MAX_PAGE, false)
        .unwrap_or(DEFAULT_PAGE);
    let cursor = fields.u64("cursor", 1, i64::MAX as u64, false);
    fields.finish().map_err(AdminError::Invalid)?;
    let cursor = cursor.and_then(|c| i64::try_from(c).ok());
    let page = state.store.audit_log(&filter, limit, cursor).await?;
    Ok(Json(page).into_response())
}
