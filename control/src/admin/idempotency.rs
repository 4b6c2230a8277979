//! `GET`/`DELETE /tenants/{id}/idempotency?route=&key=`: look up or delete one
//! Idempotency-Key record, for operators unsticking a client (a record stuck in flight after
//! a crash, or a stored failure the client must be allowed to retry).
//!
//! `route` is the route name from the configuration, its prefix unless named (records are
//! scoped by tenant and route); `key` is the client's key as sent, bare or as a quoted structured-field string.
//! Anonymous callers' records live under the tenant `ip:<client address>`.

use std::time::SystemTime;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use chrono::{DateTime, SecondsFormat, Utc};
use http::{Response, StatusCode};
use portcullis_idempotency::{IdempotencyKey, RecordInfo, RecordKey};
use serde::Serialize;

use super::error::AdminError;
use super::validate::{Fields, MAX_ROUTE_LEN};
use super::{Actor, AdminState};

/// Longest key accepted here: the most any route may be configured to allow.
const MAX_KEY_LEN: usize = 255;

/// A record as the admin API shows it (never the stored response body).
#[derive(Debug, Serialize)]
struct RecordView {
    tenant: String,
    route: String,
    key: String,
    state: &'static str,
    fingerprint: String,
    fencing_token: u64,
    status: Option<u16>,
    created_at: String,
    expires_at: String,
}

/// `GET`: the record's state, fingerprint, times; 404 when there is none (or it expired).
pub(super) async fn get(
    State(state): State<AdminState>,
    Path(tenant): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response<Body>, AdminError> {
    let key = record_key(&tenant, query)?;
    match state.idempotency.get(&key).await? {
        Some(info) => Ok(Json(view(&key, &info)).into_response()),
        None => Err(not_found(&key)),
    }
}

/// `DELETE` → 204: the key may be used again (a request still in flight with it can no
/// longer store its result). 404 when there was no record.
pub(super) async fn delete(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(tenant): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Result<Response<Body>, AdminError> {
    let key = record_key(&tenant, query)?;
    let before = state.idempotency.get(&key).await?;
    if !state.idempotency.delete(&key).await? {
        return Err(not_found(&key));
    }
    let before = before
        .map(|info| serde_json::to_value(view(&key, &info)).unwrap_or_default())
        .unwrap_or_else(|| serde_json::json!({ "route": key.route, "key": key.key.as_str() }));
    state
        .store
        .record(&actor.0, "idempotency.delete", &tenant, Some(before), None)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn record_key(tenant: &str, query: Vec<(String, String)>) -> Result<RecordKey, AdminError> {
    let mut fields = Fields::from_query(query);
    let route = fields.required_string("route");
    let key = fields.required_string("key");
    if let Some(route) = &route {
        if route.is_empty() || route.len() > MAX_ROUTE_LEN {
            fields.push(
                "route",
                format!("must be a route name (its prefix unless named), 1–{MAX_ROUTE_LEN} bytes"),
            );
        }
    }
    let parsed = key.as_ref().and_then(|k| {
        IdempotencyKey::parse(k.as_bytes(), MAX_KEY_LEN)
            .map_err(|err| fields.push("key", err.to_string()))
            .ok()
    });
    fields.finish().map_err(AdminError::Invalid)?;
    match (route, parsed) {
        (Some(route), Some(key)) => Ok(RecordKey::new(tenant, route, key)),
        _ => Err(AdminError::invalid("key", "is required")),
    }
}

fn view(key: &RecordKey, info: &RecordInfo) -> RecordView {
    RecordView {
        tenant: key.tenant.clone(),
        route: key.route.clone(),
        key: key.key.as_str().to_owned(),
        state: info.state.as_str(),
        fingerprint: info.fingerprint_hex.clone(),
        fencing_token: info.fencing,
        status: info.status,
        created_at: rfc3339(info.created_at),
        expires_at: rfc3339(info.expires_at),
    }
}

fn rfc3339(time: SystemTime) -> String {
    DateTime::<Utc>::from(time).to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn not_found(key: &RecordKey) -> AdminError {
    AdminError::NotFound(format!(
        "no idempotency record for tenant {:?}, route {:?} and this key (never used, expired or deleted)",
        key.tenant, key.route
    ))
}
