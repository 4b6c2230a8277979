//! The problem details object (RFC 9457) and the common problems every layer may answer.

use std::borrow::Cow;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Response, StatusCode};
use serde::Serialize;

use crate::retry_after_secs;

/// Base of Portcullis' stable problem `type` URIs.
pub const TYPE_BASE: &str = "https://portcullis.dev/problems/";

/// The media type of problem bodies.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// A problem details object (RFC 9457) plus extension members.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    type_uri: Cow<'static, str>,
    title: Cow<'static, str>,
    status: u16,
    detail: String,
    #[serde(flatten)]
    extensions: serde_json::Map<String, serde_json::Value>,
    #[serde(skip)]
    retry_after: Option<u64>,
    #[serde(skip)]
    close: bool,
}

// === impl Problem ===

impl Problem {
    /// A problem with the type URI `TYPE_BASE + slug`.
    pub fn new(
        status: StatusCode,
        slug: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            type_uri: Cow::Owned(format!("{TYPE_BASE}{slug}")),
            title: Cow::Borrowed(title),
            status: status.as_u16(),
            detail: detail.into(),
            extensions: serde_json::Map::new(),
            retry_after: None,
            close: false,
        }
    }

    /// A problem with a full `type` URI (for types defined by other modules).
    pub fn with_type(
        status: StatusCode,
        type_uri: &'static str,
        title: &'static str,
        detail: impl Into<String>,
    ) -> Self {
        Self {
            type_uri: Cow::Borrowed(type_uri),
            title: Cow::Borrowed(title),
            status: status.as_u16(),
            detail: detail.into(),
            extensions: serde_json::Map::new(),
            retry_after: None,
            close: false,
        }
    }

    /// Adds an extension member.
    pub fn with(mut self, name: &str, value: impl Into<serde_json::Value>) -> Self {
        self.extensions.insert(name.to_owned(), value.into());
        self
    }

    /// Sets `Retry-After` (whole seconds, rounded up, at least 1) and the `retry_after` member.
    pub fn retry_after(mut self, wait: Duration) -> Self {
        let secs = retry_after_secs(wait);
        self.retry_after = Some(secs);
        self.with("retry_after", secs)
    }

    /// Closes the connection after this answer (`Connection: close` on HTTP/1): for input
    /// the gateway will not read further — a malformed target, a head or body over the
    /// limit — as nginx drops keep-alive after 400, 413, 414 and 431. The unread rest of
    /// the request is discarded by the listener's lingering close.
    pub fn closing(mut self) -> Self {
        self.close = true;
        self
    }

    /// The status code.
    pub fn status(&self) -> StatusCode {
        StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// Sets `Retry-After` and the `retry_after` member to `secs` as they are, for a caller
    /// that already rounded its wait with [`retry_after_secs`].
    pub fn retry_after_whole_secs(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self.with("retry_after", secs)
    }

    /// Status, headers and body: JSON, the problem media type, `Cache-Control: no-store`,
    /// `Retry-After` when set (for storing an answer as well as sending it).
    pub fn to_parts(&self) -> (StatusCode, HeaderMap, Bytes) {
        // Strings, integers and JSON values always serialize.
        let body = serde_json::to_vec(self).unwrap_or_else(|_| b"{}".to_vec());
        let mut headers = HeaderMap::with_capacity(4);
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.close {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        (self.status(), headers, Bytes::from(body))
    }

    /// The response.
    pub fn into_response(self) -> Response<Body> {
        let (status, headers, body) = self.to_parts();
        let mut response = Response::new(Body::from(body));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }

    /// 404: no route matches the path.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "no-route",
            "No route matches this path",
            format!("no route is configured for {path:?}"),
        )
    }

    /// 413: the body exceeds `server.max_body_bytes`.
    pub fn body_too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body-too-large",
            "Request body too large",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
        .with("limit", limit)
        // The rest of the body is never read: close after answering (nginx does too).
        .closing()
    }

    /// 431: the request head exceeds `server.max_header_bytes`.
    pub fn headers_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers-too-large",
            "Request header fields too large",
            format!("the request line and headers exceed the limit of {limit} bytes"),
        )
        .with("limit", limit)
    }

    /// 503: over the global in-flight cap.
    pub fn overloaded(wait: Duration) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", "Gateway overloaded", "the gateway is at its concurrent request limit; retry after the indicated delay with backoff and jitter")
            .retry_after(wait)
    }

    /// 500 for anything unexpected; details go to the log, never to the client.
    pub fn internal() -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "Internal gateway error",
            "the gateway failed to handle the request; the incident was logged",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn renders_rfc9457() {
        let response = Problem::overloaded(Duration::from_millis(1500)).into_response();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "2");
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["type"], "https://portcullis.dev/problems/overloaded");
        assert_eq!(json["status"], 503);
        assert_eq!(json["retry_after"], 2);
        assert!(json["title"].is_string() && json["detail"].is_string());
    }
}
