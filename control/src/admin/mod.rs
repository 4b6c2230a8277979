//! The admin API: tenants, API keys, quotas, usage, audit log and idempotency records, as JSON
//! over HTTP on the admin listener (`server.admin_listen`), next to `/healthz`, `/readyz` and
//! `/metrics`.
//!
//! ```text
//! POST   /admin/v1/tenants                              create (201; 409 duplicate id)
//! GET    /admin/v1/tenants?q=&limit=&cursor=            list, by id, paginated, searched
//! GET    /admin/v1/tenants/{id}                         get
//! PATCH  /admin/v1/tenants/{id}                         update (name, disabled, limits)
//! DELETE /admin/v1/tenants/{id}                         delete with keys and overrides (204)
//! POST   /admin/v1/tenants/{id}/disable | /enable       disable / enable
//! POST   /admin/v1/tenants/{id}/keys                    issue a key (plaintext shown once)
//! GET    /admin/v1/tenants/{id}/keys                    list keys (prefixes only)
//! POST   /admin/v1/tenants/{id}/keys/{key_id}/revoke    revoke
//! GET    /admin/v1/tenants/{id}/quota                   rate, per, burst, daily, monthly
//! PATCH  /admin/v1/tenants/{id}/quota                   change them
//! GET    /admin/v1/tenants/{id}/route-quotas            per-route overrides
//! PUT    /admin/v1/tenants/{id}/route-quotas            set one ({route, rate, per, burst})
//! DELETE /admin/v1/tenants/{id}/route-quotas?route=     remove one
//! POST   /admin/v1/tenants/{id}/periods/{day|month}/reset    reset the period's count
//! POST   /admin/v1/tenants/{id}/periods/{day|month}/top-up   give back {amount} requests
//! GET    /admin/v1/tenants/{id}/usage                   buckets, periods, 429 count
//! GET    /admin/v1/tenants/{id}/usage/history           429s per 10 s, last 10 minutes
//! GET    /admin/v1/usage/throttled?limit=               most 429s in 10 minutes (fleet)
//! GET    /admin/v1/tenants/{id}/idempotency?route=&key= an Idempotency-Key record
//! DELETE /admin/v1/tenants/{id}/idempotency?route=&key= delete it (unstick a client)
//! GET    /admin/v1/audit?tenant=&action=&actor=&limit=&cursor=   audit log, newest first
//! GET    /admin/v1/upstreams                            endpoints, health, ejections, breaker
//! GET    /admin/v1/openapi.json                         OpenAPI 3.1 description
//! ```
//!
//! Every request needs `Authorization: Bearer <PORTCULLIS_ADMIN_TOKEN>` (`auth.rs`). Errors
//! are problem+json; invalid input is a 422 listing every offending field. Changes are one
//! transaction each, audited, and reach every replica within a second ([`store`]).
//! Without a token the routes are not served at all ([`disabled_router`]).

mod audit;
mod auth;
mod deliveries;
mod error;
mod history;
mod idempotency;
mod keys;
mod openapi;
mod quotas;
mod sql;
pub(crate) mod store;
mod tenants;
mod upstreams;
mod usage;
pub(crate) mod validate;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::middleware::Next;
use axum::routing::{any, get, post};
use axum::{middleware, Router};
use http::{header, Method, Request, Response, StatusCode};

pub(crate) use error::AdminError;
pub use upstreams::{
    EndpointHealth, EndpointStatus, LatencyStatus, NoUpstreams, RouteLatencyStatus, UpstreamStatus,
    UpstreamsView,
};
pub use validate::ConfiguredRoute;

use portcullis_ratelimit::Limiter;

use crate::db::Database;
use crate::directory::Directory;
use crate::quota::QuotaAdmin;
use crate::quota_admin::LimiterQuotaAdmin;
use crate::usage_history::{ThrottledBoard, UsageHistory};
use portcullis_problem::{Problem, CONTENT_TYPE};
use store::AdminStore;

/// Path prefix of every admin endpoint.
pub const BASE: &str = "/admin/v1";

/// Everything the admin API works on.
#[derive(Clone)]
pub struct AdminContext {
    /// The configuration database (tenants, keys, quotas, audit log).
    pub db: Database,
    /// This replica's tenant snapshot (for reading what the limiter currently enforces).
    pub directory: Arc<Directory>,
    /// The configured limiter: usage, period reset and top-up read or change its state.
    pub limiter: Arc<dyn Limiter>,
    /// Idempotency records, for look-up and deletion.
    pub idempotency: Arc<dyn portcullis_idempotency::Store>,
    /// The bearer token (hashed at once by [`router`]; the plaintext is not kept).
    pub token: Arc<str>,
    /// Configured routes: overrides must name one, and buckets must admit their cost.
    pub routes: Arc<[ConfiguredRoute]>,
    /// The data plane's upstreams and their endpoints' health.
    pub upstreams: Arc<dyn UpstreamsView>,
    /// Where replicas share their throttled-tenant counts (Redis state); `None` = this
    /// replica's counts only.
    pub throttled_board: Option<Arc<dyn ThrottledBoard>>,
    /// The queue of asynchronous routes; `None` when no route is asynchronous.
    pub deliveries: Option<Arc<dyn portcullis_queue::Queue>>,
}

/// Shared state of the handlers.
#[derive(Clone)]
pub(crate) struct AdminState {
    store: AdminStore,
    db: Database,
    directory: Arc<Directory>,
    quota: Arc<dyn QuotaAdmin>,
    idempotency: Arc<dyn portcullis_idempotency::Store>,
    token: auth::TokenDigest,
    upstreams: Arc<dyn UpstreamsView>,
    history: Arc<UsageHistory>,
    board: Option<Arc<dyn ThrottledBoard>>,
    deliveries: Option<Arc<dyn portcullis_queue::Queue>>,
}

/// Who made a change, for the audit log (set by [`auth`]).
#[derive(Debug, Clone)]
pub(crate) struct Actor(pub(crate) String);

/// The admin API routes, behind bearer-token authentication.
pub fn router(ctx: AdminContext) -> Router {
    let quota = Arc::new(LimiterQuotaAdmin::new(
        ctx.limiter.clone(),
        ctx.directory.clone(),
    ));
    router_with_quota(ctx, quota)
}

/// [`router`] with the rate-limit operations given (tests pass a fake).
pub(crate) fn router_with_quota(ctx: AdminContext, quota: Arc<dyn QuotaAdmin>) -> Router {
    let history = Arc::new(UsageHistory::new(ctx.directory.clone()));
    // The sampler holds the history weakly: it ends when the last router clone is dropped.
    // Without a runtime (a router built in a plain test) reads still count what is pending.
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(UsageHistory::run(
            Arc::downgrade(&history),
            ctx.throttled_board.clone(),
        ));
    }
    let state = AdminState {
        store: AdminStore::new(ctx.db.clone(), ctx.routes),
        db: ctx.db,
        directory: ctx.directory,
        quota,
        idempotency: ctx.idempotency,
        token: auth::TokenDigest::new(&ctx.token),
        upstreams: ctx.upstreams,
        history,
        board: ctx.throttled_board,
        deliveries: ctx.deliveries,
    };
    let api = Router::new()
        .route("/tenants", get(tenants::list).post(tenants::create))
        .route(
            "/tenants/{id}",
            get(tenants::get)
                .patch(tenants::update)
                .delete(tenants::delete),
        )
        .route("/tenants/{id}/disable", post(tenants::disable))
        .route("/tenants/{id}/enable", post(tenants::enable))
        .route("/tenants/{id}/keys", get(keys::list).post(keys::issue))
        .route("/tenants/{id}/keys/{key_id}/revoke", post(keys::revoke))
        .route(
            "/tenants/{id}/quota",
            get(quotas::get).patch(quotas::update),
        )
        .route(
            "/tenants/{id}/route-quotas",
            get(quotas::list_routes)
                .put(quotas::put_route)
                .delete(quotas::delete_route),
        )
        .route("/tenants/{id}/periods/{period}/reset", post(quotas::reset))
        .route(
            "/tenants/{id}/periods/{period}/top-up",
            post(quotas::top_up),
        )
        .route("/tenants/{id}/usage", get(usage::get))
        .route("/tenants/{id}/usage/history", get(history::get))
        .route("/usage/throttled", get(history::throttled))
        .route(
            "/tenants/{id}/idempotency",
            get(idempotency::get).delete(idempotency::delete),
        )
        .route("/deliveries", get(deliveries::list))
        .route("/deliveries/replay", post(deliveries::replay_many))
        .route(
            "/deliveries/{id}",
            get(deliveries::get).delete(deliveries::purge),
        )
        .route("/deliveries/{id}/replay", post(deliveries::replay))
        .route("/audit", get(audit::list))
        .route("/upstreams", get(upstreams::list))
        .route("/openapi.json", get(openapi::serve))
        // Unknown admin paths answer 404 problem+json, and only after authentication, so
        // probing without the token learns nothing about which paths exist.
        .route("/", any(unknown_path))
        .route("/{*rest}", any(unknown_path))
        .with_state(state.clone());
    Router::new()
        .nest(BASE, api)
        .layer(middleware::map_response(problem_for_bare_errors))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            reload_after_change,
        ))
        .layer(middleware::from_fn_with_state(state, auth::require_token))
}

/// After a successful change, reloads this replica's tenant snapshot before answering, so
/// whoever made the change can use it through this replica at once (a key issued with 201
/// is accepted by the next request). Other replicas follow through NOTIFY or their poll.
async fn reload_after_change(
    State(state): State<AdminState>,
    request: Request<Body>,
    next: Next,
) -> Response<Body> {
    let changes = request.method() != Method::GET && request.method() != Method::HEAD;
    let response = next.run(request).await;
    if changes && response.status().is_success() {
        if let Err(err) = reload(&state).await {
            tracing::warn!(%err, "reload after an admin change failed; the poll will catch up");
        }
    }
    response
}

async fn reload(state: &AdminState) -> Result<(), crate::db::DbError> {
    // Actions on the state stores (period reset, idempotency delete) change no version.
    if state.db.config_version().await? <= state.directory.snapshot().version {
        return Ok(());
    }
    // A concurrent poll may have loaded something newer meanwhile; `reload` never goes back.
    state.directory.reload(&state.db).await?;
    Ok(())
}

/// What the admin listener serves under `/admin` when no token is configured: a 404 that
/// says why. The admin API never runs without authentication.
pub fn disabled_router() -> Router {
    async fn disabled() -> Response<Body> {
        Problem::new(
            StatusCode::NOT_FOUND,
            "admin-disabled",
            "Admin API disabled",
            "the admin API is not served because PORTCULLIS_ADMIN_TOKEN is not set; set it (16+ characters) and restart",
        )
        .into_response()
    }
    Router::new()
        .route("/admin", any(disabled))
        .route("/admin/{*rest}", any(disabled))
}

async fn unknown_path() -> Response<Body> {
    not_found(&format!(
        "no admin endpoint at this path; the API is described at {BASE}/openapi.json"
    ))
}

/// The admin listener's 404 problem+json, saying `detail` (also used by the console).
pub(crate) fn not_found(detail: &str) -> Response<Body> {
    AdminError::NotFound(detail.to_owned())
        .problem()
        .into_response()
}

/// Turns axum's own plain-text rejections (405, malformed path or query, body too large)
/// into problem+json, so every admin error has the same shape.
async fn problem_for_bare_errors(response: Response<Body>) -> Response<Body> {
    let status = response.status();
    let is_problem = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes() == CONTENT_TYPE.as_bytes());
    if !(status.is_client_error() || status.is_server_error()) || is_problem {
        return response;
    }
    let allow = response.headers().get(header::ALLOW).cloned();
    let (slug, title, detail) = match status {
        StatusCode::METHOD_NOT_ALLOWED => (
            "method-not-allowed",
            "Method not allowed",
            // axum adds the Allow header after this layer ran, so it cannot be quoted here.
            format!("this method is not allowed on this path; the Allow header lists those that are (see {BASE}/openapi.json)"),
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "body-too-large",
            "Request body too large",
            "the request body is larger than the admin API accepts".to_owned(),
        ),
        _ => (
            "admin-bad-request",
            "Bad request",
            format!(
                "the request was refused: {}",
                status.canonical_reason().unwrap_or("error")
            ),
        ),
    };
    let mut out = Problem::new(status, slug, title, detail).into_response();
    if let Some(allow) = allow {
        out.headers_mut().insert(header::ALLOW, allow);
    }
    out
}

#[cfg(test)]
mod tests;
