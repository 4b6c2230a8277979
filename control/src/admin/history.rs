//! `GET /tenants/{id}/usage/history` (a tenant's 429s per 10 s over the last 10 minutes) and
//! `GET /usage/throttled?limit=` (the tenants with the most 429s in that window, across the
//! fleet when a shared board is configured). Both read counts the rate limiter already keeps
//! ([`crate::usage_history`]); neither touches the limiter's state store.

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use axum::Json;
use http::Response;
use serde_json::json;

use super::error::AdminError;
use super::quotas::require_tenant;
use super::validate::Fields;
use super::AdminState;
use crate::usage_history::{fleet_top, BUCKET, POINTS, PUBLISH_TOP};

/// Default `limit` of the top-throttled view (the largest is [`PUBLISH_TOP`]).
const DEFAULT_TOP: u64 = 10;

/// The tenant's history on the answering replica.
pub(super) async fn get(
    State(state): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    require_tenant(&state, &id).await?;
    let snapshot = state.directory.snapshot();
    let bucket = state.history.current_bucket();
    // The replica that created the tenant reloaded before answering; another replica may be
    // up to a poll behind, and then has counted nothing for it yet.
    let history = match snapshot.by_id(&id) {
        Some(tenant) => state.history.history(tenant, bucket),
        None => state.history.nothing_yet(&id, bucket),
    };
    Ok(Json(history).into_response())
}

/// The top throttled tenants: the fleet's sum with a board, else this replica's. A board
/// that does not answer degrades to this replica's counts, said in `scope` and `fleet_error`.
pub(super) async fn throttled(
    State(state): State<AdminState>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response<Body>, AdminError> {
    let mut fields = Fields::from_query(query);
    let limit = fields
        .u64("limit", 1, PUBLISH_TOP as u64, false)
        .unwrap_or(DEFAULT_TOP);
    fields.finish().map_err(AdminError::Invalid)?;
    let limit = usize::try_from(limit).unwrap_or(PUBLISH_TOP);
    let bucket = state.history.current_bucket();
    let own = state
        .history
        .top(&state.directory.snapshot(), bucket, PUBLISH_TOP);
    let window_secs = BUCKET.as_secs() * POINTS as u64;
    let (scope, replicas, items, error) = match &state.board {
        None => ("replica", 1, truncate(own, limit), None),
        Some(board) => match board.read().await {
            Ok(published) => {
                let (replicas, top) = fleet_top(state.history.replica(), own, published, limit);
                ("fleet", replicas, top, None)
            }
            Err(err) => {
                tracing::warn!(%err, "throttled tenants: fleet board unreadable, answering with this replica's counts");
                ("replica", 1, truncate(own, limit), Some(err.to_string()))
            }
        },
    };
    let mut body =
        json!({ "window_secs": window_secs, "scope": scope, "replicas": replicas, "items": items });
    if let Some(error) = error {
        body["fleet_error"] = json!(error);
    }
    Ok(Json(body).into_response())
}

fn truncate<T>(mut items: Vec<T>, limit: usize) -> Vec<T> {
    items.truncate(limit);
    items
}
