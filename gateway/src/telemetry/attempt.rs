//! [`Attempt`]: one upstream attempt as the proxy makes it — a child span of the request's
//! server span, the `traceparent` (naming that span) and `tracestate` sent upstream, and
//! the attempt's latency and outcome series.

use std::borrow::Cow;
use std::sync::Arc;

use axum::body::Body;
use http::Request;
use opentelemetry::trace::{Span as _, SpanBuilder, SpanKind, Status, Tracer};
use opentelemetry::KeyValue;
use opentelemetry_sdk::trace::Span;
use portcullis_retry::AttemptInfo;
use rand::Rng;
use tokio::time::Instant;

use super::series::AttemptEnd;
use super::traceparent::{format, TRACEPARENT, TRACESTATE};
use super::Exchange;
use crate::plumbing::context::RequestContext;

/// An upstream attempt in progress. Dropped without [`Attempt::end`] (the retry layer's
/// attempt timeout, or the client left) it ends as `cancelled`.
#[derive(Debug)]
pub(crate) struct Attempt {
    exchange: Option<Arc<Exchange>>,
    /// Boxed: a span is a few hundred bytes, and the attempt lives in the proxy's future
    /// (moved into its box on every attempt) whether or not tracing is on.
    span: Option<Box<Span>>,
    upstream: usize,
    started: Instant,
    ended: bool,
}

impl Attempt {
    /// Starts the attempt of `request`, already addressed to its endpoint: adds the trace
    /// context headers. A request without an [`Exchange`] (never in the gateway's stack) is
    /// sent as it is.
    pub(crate) fn start(mut request: Request<Body>) -> (Request<Body>, Self) {
        let extensions = request.extensions();
        let exchange = extensions.get::<Arc<Exchange>>().cloned();
        let info = extensions.get::<AttemptInfo>().copied();
        let upstream =
            RequestContext::of(extensions).map_or(usize::MAX, |c| c.route.settings.upstream);
        let mut attempt = Self {
            exchange: None,
            span: None,
            upstream,
            // The retry layer read the clock as it sent the attempt; without it (never in
            // the gateway's stack) the attempt starts now.
            started: info.map_or_else(Instant::now, |i| i.started),
            ended: false,
        };
        let Some(exchange) = exchange else {
            return (request, attempt);
        };
        let number = info.map_or(1, |i| i.number);
        exchange.attempt_started(number, request.uri().authority());
        let tracer = exchange.telemetry.tracer.as_ref();
        // An unsampled request's attempts are not recorded either (parent-based): they get
        // ids but no attributes, which would only be formatted to be thrown away.
        let recording = exchange.server_span().is_some_and(|s| s.is_recording());
        let span = tracer
            .zip(exchange.server.as_ref())
            .map(|(tracer, server)| {
                if !recording {
                    let builder = SpanBuilder::from_name("upstream attempt");
                    return tracer.build_with_context(builder, server);
                }
                let telemetry = &exchange.telemetry;
                let upstream_name = telemetry
                    .upstream_name(upstream)
                    .map_or(Cow::Borrowed("-"), |n| Cow::Owned(n.to_string()));
                let endpoint = request
                    .uri()
                    .authority()
                    .map_or_else(String::new, |a| a.as_str().to_owned());
                let backoff_ms = info.map_or(0, |i| {
                    i64::try_from(i.backoff.as_millis()).unwrap_or(i64::MAX)
                });
                let builder = SpanBuilder::from_name("upstream attempt")
                    .with_kind(SpanKind::Client)
                    .with_attributes([
                        KeyValue::new("portcullis.attempt", i64::from(number)),
                        KeyValue::new("portcullis.upstream", upstream_name),
                        KeyValue::new("server.address", endpoint),
                        KeyValue::new("portcullis.backoff_ms", backoff_ms),
                        KeyValue::new("http.request.method", request.method().as_str().to_owned()),
                    ]);
                tracer.build_with_context(builder, server)
            });
        let (span_id, flags) = match &span {
            Some(span) => {
                let context = span.span_context();
                (
                    u64::from_be_bytes(context.span_id().to_bytes()),
                    context.trace_flags().to_u8(),
                )
            }
            // Not recording: a fresh id per attempt still tells the upstream's spans apart.
            None => (
                rand::thread_rng().gen_range(1..=u64::MAX),
                exchange.parent().1,
            ),
        };
        let headers = request.headers_mut();
        headers.insert(
            TRACEPARENT.clone(),
            format(exchange.trace_id(), span_id, flags),
        );
        if let Some(state) = &exchange.tracestate {
            headers.insert(TRACESTATE.clone(), state.clone());
        }
        attempt.exchange = Some(exchange);
        attempt.span = span.map(Box::new);
        (request, attempt)
    }

    /// Ends the attempt with a response `status`, or `None` when the client failed.
    pub(crate) fn end(mut self, status: Option<u16>) {
        self.finish(status.map_or(AttemptEnd::Error, AttemptEnd::Status));
    }

    fn finish(&mut self, end: AttemptEnd) {
        self.ended = true;
        let Some(exchange) = &self.exchange else {
            return;
        };
        let elapsed = self.started.elapsed();
        exchange.attempt_ended(elapsed);
        if let Some(series) = exchange.telemetry.attempts.get(self.upstream) {
            series.record(end, elapsed);
        }
        if let Some(mut span) = self.span.take() {
            span.set_attribute(KeyValue::new("portcullis.attempt.outcome", end.label()));
            match end {
                AttemptEnd::Status(status) => {
                    span.set_attribute(KeyValue::new(
                        "http.response.status_code",
                        i64::from(status),
                    ));
                    if status >= 500 {
                        span.set_status(Status::error(end.label()));
                    }
                }
                AttemptEnd::Error | AttemptEnd::Cancelled => {
                    span.set_status(Status::error(end.label()))
                }
            }
            span.end();
        }
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.ended {
            self.finish(AttemptEnd::Cancelled);
        }
    }
}
