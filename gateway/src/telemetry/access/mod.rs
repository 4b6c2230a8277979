//! The access log: one line per request under the target [`ACCESS_TARGET`] at `info`,
//! written when the response body is finished or dropped (as nginx logs after the last
//! byte), so `duration_ms` and `bytes_out` cover the whole response.
//!
//! Fields (absent values are `-`, never Rust's `Option` formatting): `request_id`,
//! `trace_id`, `tenant`, `client_ip`, `method`, `path` (no query unless
//! `telemetry.access_log_query`), `route`, `upstream`, `endpoint`, `attempts`, `status`,
//! `bytes_in`, `bytes_out`, `duration_ms`, `upstream_duration_ms`, `rate_limit`,
//! `idempotency`, `idempotency_key`. Never bodies, credentials or API keys: the tenant
//! resolution replaced the key by the tenant id before any layer here saw it, and the
//! `Idempotency-Key` is a client-chosen request id, not a secret (docs/idempotency.md).
//!
//! Human logs without colour are written by `text.rs` (the same bytes, a fraction of the
//! cost); everything else goes through `tracing`.

use std::fmt;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Method, Response};
use http_body::{Frame, SizeHint};
use tokio::time::Instant;

use super::Exchange;
use crate::plumbing::held::{hold_until_body_ends, Held};

mod text;

pub use text::write_access_lines_directly;

/// The access log's `tracing` target.
pub(crate) const ACCESS_TARGET: &str = "portcullis::access";

/// What is known of a request when its response head is ready; logged when the response
/// body ends or is dropped.
#[derive(Debug)]
pub(crate) struct AccessLine {
    /// When the request arrived.
    pub started: Instant,
    /// The request's trace and upstream record.
    pub exchange: Arc<Exchange>,
    /// `X-Request-Id`.
    pub request_id: Option<HeaderValue>,
    /// The tenant id; `None` for anonymous callers.
    pub tenant: Option<Arc<str>>,
    /// The client address the gateway believes.
    pub client_ip: Option<IpAddr>,
    /// Request method.
    pub method: Method,
    /// Path as the client sent it (with the query only when configured).
    pub path: String,
    /// The matched route's label.
    pub route: Arc<str>,
    /// The route's upstream.
    pub upstream: Option<Arc<str>>,
    /// Response status.
    pub status: u16,
    /// The rate limiter's decision.
    pub rate_limit: &'static str,
    /// The idempotency layer's outcome.
    pub idempotency: &'static str,
    /// The `Idempotency-Key` as sent.
    pub idempotency_key: Option<HeaderValue>,
    /// Response body bytes sent so far.
    bytes_out: u64,
}

impl AccessLine {
    /// A line for `status`; the rest is filled in by the caller.
    pub(crate) fn new(
        started: Instant,
        exchange: Arc<Exchange>,
        method: Method,
        path: String,
        status: u16,
    ) -> Self {
        Self {
            started,
            exchange,
            request_id: None,
            tenant: None,
            client_ip: None,
            method,
            path,
            route: Arc::from("-"),
            upstream: None,
            status,
            rate_limit: "-",
            idempotency: "-",
            idempotency_key: None,
            bytes_out: 0,
        }
    }

    /// Wraps the response body so that the line is written when the body ends.
    pub(crate) fn attach(self, response: Response<Body>) -> Response<Body> {
        hold_until_body_ends(response, self)
    }

    fn emit(&self) {
        let duration = self.started.elapsed();
        if text::direct() {
            #[allow(clippy::disallowed_methods)] // a log line's timestamp is wall-clock time
            let now = std::time::SystemTime::now();
            text::write(self, duration, now);
        } else {
            self.trace(duration);
        }
    }

    /// The line as a `tracing` event (JSON, colour, or any subscriber of a test).
    fn trace(&self, duration: std::time::Duration) {
        let exchange = &self.exchange;
        tracing::info!(
            target: ACCESS_TARGET,
            request_id = %Dash(self.request_id.as_ref().and_then(|v| v.to_str().ok())),
            trace_id = %TraceId(exchange.trace_id()),
            tenant = %Dash(self.tenant.as_deref()),
            client_ip = %Dash(self.client_ip),
            method = %self.method,
            path = %self.path,
            route = %self.route,
            upstream = %Dash(self.upstream.as_deref()),
            endpoint = %Dash(exchange.endpoint()),
            attempts = exchange.attempts(),
            status = self.status,
            bytes_in = exchange.bytes_in(),
            bytes_out = self.bytes_out,
            duration_ms = millis(duration),
            upstream_duration_ms = millis(exchange.upstream_time()),
            rate_limit = self.rate_limit,
            idempotency = self.idempotency,
            idempotency_key = %Dash(self.idempotency_key.as_ref().and_then(|v| v.to_str().ok())),
            "request"
        );
    }
}

fn millis(duration: std::time::Duration) -> f64 {
    // Microsecond resolution is enough for a log and keeps the number short.
    (duration.as_micros() as f64) / 1000.0
}

/// A value or `-`.
struct Dash<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for Dash<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(value) => value.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// A trace id as 32 lower-case hex digits, formatted without an intermediate string.
struct TraceId(u128);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// Kept by the response body, which counts its bytes; the line is written when the body is
/// dropped (after the last frame, or when the client goes away mid-body).
impl Held for AccessLine {
    fn sent(&mut self, len: usize) {
        self.bytes_out += len as u64;
    }
}

impl Drop for AccessLine {
    fn drop(&mut self) {
        self.emit();
    }
}

pin_project_lite::pin_project! {
    /// The request body, counted into the exchange's `bytes_in` as it is read.
    pub(crate) struct Counted {
        #[pin]
        inner: Body,
        exchange: Arc<Exchange>,
    }
}

impl Counted {
    /// Counts `inner`'s bytes into `exchange`.
    pub(crate) fn wrap(inner: Body, exchange: Arc<Exchange>) -> Body {
        Body::new(Self { inner, exchange })
    }
}

impl http_body::Body for Counted {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(Ok(Some(data))) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
            this.exchange.add_bytes_in(data.len() as u64);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
