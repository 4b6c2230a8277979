//! RFC 9457 problem details for the admin API's own errors, in the same shape and `type`
//! URIs as the gateway's (`gateway/src/problem.rs`). Private on purpose: this is the subset
//! the admin API needs until the shared problem+json crate replaces both.

use axum::body::Body;
use http::{header, HeaderValue, Response, StatusCode};
use serde::Serialize;

/// Base of the stable problem `type` URIs.
const TYPE_BASE: &str = "https://portcullis.dev/problems/";
/// The media type of problem bodies.
pub(crate) const CONTENT_TYPE: &str = "application/problem+json";

/// A problem details object plus extension members.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Problem {
    #[serde(rename = "type")]
    type_uri: String,
    title: &'static str,
    status: u16,
    detail: String,
    #[serde(flatten)]
    extensions: serde_json::Map<String, serde_json::Value>,
    #[serde(skip)]
    retry_after: Option<u64>,
}

// === impl Problem ===

impl Problem {
    /// A problem with the type URI `TYPE_BASE + slug`.
    pub(crate) fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            type_uri: format!("{TYPE_BASE}{slug}"),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            extensions: serde_json::Map::new(),
            retry_after: None,
        }
    }

    /// Adds an extension member.
    pub(crate) fn with(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// Sets `Retry-After` and the `retry_after` member, in whole seconds (the admin API only
    /// answers fixed waits, so there is nothing to round).
    pub(crate) fn retry_after_secs(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self.with("retry_after", secs)
    }

    /// The response: JSON body, problem media type, never cached, `Retry-After` when set.
    pub(crate) fn into_response(self) -> Response<Body> {
        let body = serde_json::to_vec(&self).unwrap_or_else(|_| b"{}".to_vec());
        let mut response = Response::new(Body::from(body));
        *response.status_mut() =
            StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// 500 for anything unexpected; details go to the log, never to the client.
    pub(crate) fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal gateway error",
            "the gateway failed to handle the request; the incident was logged",
        )
    }
}
