//! The result of the latest attempt, kept until the layer decides whether to retry.

use std::time::{Duration, SystemTime};

use axum::body::Body;
use http::{header::RETRY_AFTER, Response};

use crate::{
    error::{RetryError, UpstreamFailure},
    headers::{parse_retry_after, X_RETRY_EXHAUSTED},
    metrics::Stop,
    ServedBy,
};

/// The result of the latest attempt.
pub(super) enum Last<E> {
    Response(Response<Body>),
    Error(RetryError<E>),
}

// === impl Last ===

impl<E: UpstreamFailure> Last<E> {
    pub(super) fn into_result(self) -> Result<Response<Body>, RetryError<E>> {
        match self {
            Self::Response(rsp) => Ok(rsp),
            Self::Error(e) => Err(e),
        }
    }

    /// Marks an upstream answer the layer gave up retrying (`X-Retry-Exhausted`).
    pub(super) fn exhausted(mut self, attempts: u32, stop: Stop) -> Self {
        if let Self::Response(rsp) = &mut self {
            let value = format!("attempts={attempts}, reason={}", stop.as_str());
            if let Ok(value) = http::HeaderValue::from_str(&value) {
                rsp.headers_mut().insert(X_RETRY_EXHAUSTED, value);
            }
        }
        self
    }

    /// The endpoint that produced this result, to avoid on the next attempt.
    pub(super) fn endpoint(&self) -> Option<usize> {
        match self {
            Self::Response(rsp) => rsp.extensions().get::<ServedBy>().map(|s| s.0),
            Self::Error(RetryError::Upstream(e)) => e.endpoint(),
            Self::Error(_) => None,
        }
    }

    /// The upstream's `Retry-After`, when it sent one.
    pub(super) fn retry_after(&self, now: SystemTime) -> Option<Duration> {
        match self {
            Self::Response(rsp) => rsp
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| parse_retry_after(v, now)),
            Self::Error(_) => None,
        }
    }
}
