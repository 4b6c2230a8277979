//! The dead-letter workflow of asynchronous routes (docs/admin.md, "Deliveries"): list and
//! filter the queue's messages, inspect one (payload, stored headers, every attempt, the
//! dead-letter reason), replay one or many, purge one. Every change is audited.
//!
//! - `GET /deliveries?state=pending|delivered|dead&queue=&tenant=&limit=&cursor=`
//! - `GET /deliveries/{id}`
//! - `POST /deliveries/{id}/replay`
//! - `POST /deliveries/replay` with `{"state": "dead", "queue": …, "tenant": …, "limit": …}`
//!   (one page of matches, at most 1000, replayed; `next` says whether more match)
//! - `DELETE /deliveries/{id}`
//!
//! Without an asynchronous route there is no queue: every path is a 404 saying so.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::response::IntoResponse;
use axum::{Extension, Json};
use base64::Engine;
use http::{Response, StatusCode};
use portcullis_queue::{
    AttemptOutcome, Cursor, DeliveryId, ListFilter, Message, Queue, QueueError, State as MsgState,
    Summary, MAX_PAGE,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::error::AdminError;
use super::{Actor, AdminState};

/// The header the gateway stores the sender's address in (never delivered); shown as
/// `client`, not among the headers.
const STORED_CLIENT: &[u8] = b"portcullis-stored-client";

/// Default page size of a listing.
const DEFAULT_PAGE: usize = 100;

/// `GET /deliveries` query.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    state: Option<String>,
    queue: Option<String>,
    tenant: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

/// `POST /deliveries/replay` body.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BulkReplay {
    state: Option<String>,
    queue: Option<String>,
    tenant: Option<String>,
    limit: Option<usize>,
}

#[derive(Debug, Serialize)]
struct SummaryView {
    id: String,
    queue: String,
    tenant: Option<String>,
    state: &'static str,
    enqueued_at_ms: i64,
    due_at_ms: i64,
    attempts: u32,
    reason: Option<String>,
}

fn queue(state: &AdminState) -> Result<&Arc<dyn Queue>, AdminError> {
    state.deliveries.as_ref().ok_or_else(|| {
        AdminError::NotFound("no route is asynchronous: there is no delivery queue".into())
    })
}

fn parse_state(text: Option<&str>, field: &str) -> Result<Option<MsgState>, AdminError> {
    match text {
        None => Ok(None),
        Some(text) => MsgState::parse(text).map(Some).ok_or_else(|| {
            AdminError::invalid(field, "allowed \"pending\", \"delivered\" or \"dead\"")
        }),
    }
}

fn parse_id(id: &str) -> Result<DeliveryId, AdminError> {
    DeliveryId::parse(id).ok_or_else(|| AdminError::NotFound(format!("no delivery {id:?}")))
}

fn limit(limit: Option<usize>) -> Result<usize, AdminError> {
    match limit.unwrap_or(DEFAULT_PAGE) {
        n @ 1..=MAX_PAGE => Ok(n),
        _ => Err(AdminError::invalid(
            "limit",
            format!("allowed 1..={MAX_PAGE}"),
        )),
    }
}

fn summary(s: &Summary) -> SummaryView {
    SummaryView {
        id: s.id.to_string(),
        queue: s.queue.clone(),
        tenant: s.tenant.clone(),
        state: s.state.as_str(),
        enqueued_at_ms: s.enqueued_at_ms,
        due_at_ms: s.due_at_ms,
        attempts: s.attempts,
        reason: s.reason.clone(),
    }
}

/// A message as the admin API shows it: the stored headers (credentials were never
/// stored), the payload as text when it is UTF-8 and always as base64, every attempt.
fn view(m: &Message) -> Value {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let client = m
        .headers
        .iter()
        .find(|(n, _)| n.as_slice() == STORED_CLIENT)
        .map(|(_, v)| text(v));
    let headers: Vec<Value> = m
        .headers
        .iter()
        .filter(|(n, _)| n.as_slice() != STORED_CLIENT)
        .map(|(n, v)| json!([text(n), text(v)]))
        .collect();
    let attempts: Vec<Value> = m
        .attempts
        .iter()
        .map(|a| match &a.outcome {
            AttemptOutcome::Status(s) => {
                json!({"at_ms": a.at_ms, "status": s, "latency_ms": a.latency_ms})
            }
            AttemptOutcome::Error(e) => {
                json!({"at_ms": a.at_ms, "error": e, "latency_ms": a.latency_ms})
            }
        })
        .collect();
    json!({
        "id": m.id.as_str(),
        "queue": m.queue,
        "tenant": m.tenant,
        "client": client,
        "state": m.state.as_str(),
        "method": m.method,
        "path": m.path_and_query,
        "headers": headers,
        "body": std::str::from_utf8(&m.body).ok(),
        "body_base64": base64::engine::general_purpose::STANDARD.encode(&m.body),
        "dedupe_key": m.dedupe_key,
        "enqueued_at_ms": m.enqueued_at_ms,
        "due_at_ms": m.due_at_ms,
        "updated_at_ms": m.updated_at_ms,
        "attempts": attempts,
        "reason": m.reason,
    })
}

/// `GET /deliveries`.
pub(super) async fn list(
    State(state): State<AdminState>,
    Query(query): Query<ListQuery>,
) -> Result<Response<Body>, AdminError> {
    let queue = queue(&state)?;
    let filter = ListFilter {
        state: parse_state(query.state.as_deref(), "state")?,
        queue: query.queue,
        tenant: query.tenant,
        limit: limit(query.limit)?,
        cursor: query.cursor.map(Cursor),
    };
    let page = queue.list(&filter).await?;
    let items: Vec<SummaryView> = page.items.iter().map(summary).collect();
    Ok(Json(json!({ "items": items, "next": page.next.map(|c| c.0) })).into_response())
}

/// `GET /deliveries/{id}`.
pub(super) async fn get(
    State(state): State<AdminState>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    let queue = queue(&state)?;
    match queue.get(&parse_id(&id)?).await? {
        Some(message) => Ok(Json(view(&message)).into_response()),
        None => Err(AdminError::NotFound(format!("no delivery {id:?}"))),
    }
}

/// `POST /deliveries/{id}/replay`: pending again, due now; audited.
pub(super) async fn replay(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    let queue = queue(&state)?;
    let id = parse_id(&id)?;
    let before = queue.get(&id).await?.map(|m| summary_of(&m));
    queue.replay(&id).await?;
    state
        .store
        .record_untenanted(
            &actor.0,
            "delivery.replay",
            before,
            Some(json!({"id": id.as_str(), "state": "pending"})),
        )
        .await?;
    Ok(Json(json!({ "id": id.as_str(), "state": "pending" })).into_response())
}

/// `POST /deliveries/replay`: one page of matching messages (dead by default) replayed.
pub(super) async fn replay_many(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    body: Option<Json<BulkReplay>>,
) -> Result<Response<Body>, AdminError> {
    let queue = queue(&state)?;
    let body = body.map(|Json(b)| b).unwrap_or_default();
    let filter = ListFilter {
        state: Some(parse_state(body.state.as_deref(), "state")?.unwrap_or(MsgState::Dead)),
        queue: body.queue.clone(),
        tenant: body.tenant.clone(),
        limit: limit(body.limit)?,
        cursor: None,
    };
    if filter.state == Some(MsgState::Pending) {
        return Err(AdminError::invalid(
            "state",
            "a pending message cannot be replayed",
        ));
    }
    let page = queue.list(&filter).await?;
    let mut replayed = Vec::new();
    for item in &page.items {
        match queue.replay(&item.id).await {
            Ok(()) => replayed.push(item.id.to_string()),
            // Replayed or purged meanwhile by someone else: not this request's to count.
            Err(QueueError::StillPending(_) | QueueError::NotFound(_)) => {}
            Err(err) => return Err(err.into()),
        }
    }
    let after = json!({
        "filter": {"state": filter.state.map(MsgState::as_str), "queue": body.queue, "tenant": body.tenant},
        "replayed": replayed,
    });
    state
        .store
        .record_untenanted(&actor.0, "delivery.replay_many", None, Some(after))
        .await?;
    Ok(
        Json(json!({ "replayed": replayed.len(), "ids": replayed, "more": page.next.is_some() }))
            .into_response(),
    )
}

/// `DELETE /deliveries/{id}` → 204; the dedupe record stays for its window.
pub(super) async fn purge(
    State(state): State<AdminState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
) -> Result<Response<Body>, AdminError> {
    let queue = queue(&state)?;
    let id = parse_id(&id)?;
    let before = queue.get(&id).await?.map(|m| summary_of(&m));
    if !queue.purge(&id).await? {
        return Err(AdminError::NotFound(format!(
            "no delivery {:?}",
            id.as_str()
        )));
    }
    state
        .store
        .record_untenanted(&actor.0, "delivery.purge", before, None)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// What the audit log keeps of a message: no payload, no header.
fn summary_of(m: &Message) -> Value {
    json!({
        "id": m.id.as_str(),
        "queue": m.queue,
        "tenant": m.tenant,
        "state": m.state.as_str(),
        "attempts": m.attempts.len(),
        "reason": m.reason,
    })
}
