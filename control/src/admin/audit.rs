//! `GET /audit?tenant=&limit=&cursor=`: every change with actor, time, before and after,
//! newest first.

use axum::body::Body;
use axum::extract::{Query, State};
use axum::response::IntoResponse;
use axum::Json;
use http::Response;

use super::error::AdminError;
use super::store::{DEFAULT_PAGE, MAX_PAGE};
use super::validate::Fields;
use super::AdminState;

/// One page of the audit log, optionally for one tenant.
pub(super) async fn list(
    State(state): State<AdminState>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response<Body>, AdminError> {
    let mut fields = Fields::from_query(query);
    let tenant = fields.string("tenant");
    let limit = fields
        .u64("limit", 1, MAX_PAGE, false)
        .unwrap_or(DEFAULT_PAGE);
    let cursor = fields.u64("cursor", 1, i64::MAX as u64, false);
    fields.finish().map_err(AdminError::Invalid)?;
    let cursor = cursor.and_then(|c| i64::try_from(c).ok());
    let page = state
        .store
        .audit_log(tenant.as_deref(), limit, cursor)
        .await?;
    Ok(Json(page).into_response())
}
