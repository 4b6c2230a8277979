//! Admin API failures and their one mapping to problem+json.

use axum::body::Body;
use axum::response::IntoResponse;
use http::{header, HeaderValue, Response, StatusCode};

use super::validate::FieldError;
use crate::quota::QuotaError;
use portcullis_problem::Problem;

/// Why an admin request failed. Each kind says what the caller should do next through its
/// status: fix the input (422), create or look up the right thing (404/409), retry (503).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum AdminError {
    /// Missing or wrong bearer token.
    #[error("missing or invalid admin token")]
    Unauthorized,
    /// Input failed validation; every offending field is listed.
    #[error("invalid input ({} field(s))", .0.len())]
    Invalid(Vec<FieldError>),
    /// The addressed resource does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The change conflicts with the current state (duplicate id, no such quota period).
    #[error("{0}")]
    Conflict(String),
    /// The configuration database failed.
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    /// The rate-limit state store failed.
    #[error("rate-limit store: {0}")]
    Quota(String),
    /// The idempotency store failed.
    #[error("idempotency store: {0}")]
    Idempotency(#[from] portcullis_idempotency::StoreError),
    /// The delivery queue failed.
    #[error("delivery queue: {0}")]
    Queue(portcullis_queue::QueueError),
}

impl From<portcullis_queue::QueueError> for AdminError {
    fn from(err: portcullis_queue::QueueError) -> Self {
        use portcullis_queue::QueueError as Q;
        match err {
            Q::NotFound(id) => Self::NotFound(format!("no delivery {:?}", id.as_str())),
            Q::StillPending(id) => Self::Conflict(format!(
                "delivery {:?} is still pending: only a delivered or dead message can be replayed",
                id.as_str()
            )),
            Q::InvalidCursor(_) => Self::invalid("cursor", "not a cursor this listing returned"),
            other => Self::Queue(other),
        }
    }
}

// === impl AdminError ===

impl AdminError {
    /// One invalid field.
    pub(crate) fn invalid(field: &str, reason: impl Into<String>) -> Self {
        Self::Invalid(vec![FieldError::new(field, reason)])
    }

    /// 404 for a tenant id.
    pub(crate) fn no_tenant(id: &str) -> Self {
        Self::NotFound(format!("no tenant with id {id:?}"))
    }

    /// The HTTP status this error answers with.
    pub(crate) fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Invalid(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Database(e) if is_unavailable(e) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Database(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Quota(_) | Self::Idempotency(_) | Self::Queue(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
        }
    }

    /// The problem+json body.
    pub(crate) fn problem(&self) -> Problem {
        match self {
            Self::Unauthorized => Problem::new(
                StatusCode::UNAUTHORIZED,
                "admin-unauthorized",
                "Admin token required",
                "send the admin token (PORTCULLIS_ADMIN_TOKEN) as Authorization: Bearer <token>",
            ),
            Self::Invalid(errors) => {
                let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
                Problem::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "admin-invalid-input",
                    "Invalid input",
                    format!("invalid field(s): {}; nothing was changed", fields.join(", ")),
                )
                .with(
                    "errors",
                    serde_json::to_value(errors).unwrap_or(serde_json::Value::Null),
                )
            }
            Self::NotFound(detail) => Problem::new(
                StatusCode::NOT_FOUND,
                "admin-not-found",
                "Not found",
                detail.clone(),
            ),
            Self::Conflict(detail) => Problem::new(
                StatusCode::CONFLICT,
                "admin-conflict",
                "Conflict",
                detail.clone(),
            ),
            Self::Database(_) | Self::Quota(_) | Self::Idempotency(_) | Self::Queue(_)
                if self.status() == StatusCode::SERVICE_UNAVAILABLE =>
            {
                Problem::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "admin-store-unavailable",
                    "Store unavailable",
                    "a backing store did not answer; nothing was changed by this request, retry later",
                )
                .retry_after_whole_secs(1)
            }
            _ => Problem::internal(),
        }
    }
}

impl From<QuotaError> for AdminError {
    fn from(err: QuotaError) -> Self {
        match err {
            QuotaError::UnknownTenant(id) => Self::NotFound(format!(
                "tenant {id:?} is not (yet) known to the rate limiter; a tenant created a moment ago is loaded within a second"
            )),
            QuotaError::NoSuchQuota(period) => {
                let name = period_name(period);
                Self::Conflict(format!(
                    "the tenant has no {name} quota; set {name}_quota first"
                ))
            }
            other => Self::Quota(other.to_string()),
        }
    }
}

fn period_name(period: crate::quota::Period) -> &'static str {
    match period {
        crate::quota::Period::Day => "daily",
        crate::quota::Period::Month => "monthly",
    }
}

impl IntoResponse for AdminError {
    fn into_response(self) -> Response<Body> {
        let status = self.status();
        if status.is_server_error() {
            // Details stay in the log; the body only says what to do.
            tracing::error!(error = %self, "admin request failed");
        }
        let mut response = self.problem().into_response();
        if status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"portcullis-admin\""),
            );
        }
        response
    }
}

/// Connection-level failures: the database is down or overloaded, not the request wrong.
fn is_unavailable(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
    ) || matches!(err, sqlx::Error::Database(e) if e.message().contains("database is locked"))
}
