//! [`Exchange`]: one request's trace and what its upstream attempts reported, shared (one
//! `Arc` in request extensions) between the observe step and the proxy.

use std::net::IpAddr;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::body::Body;
use http::uri::Authority;
use http::{HeaderValue, Request};
use opentelemetry::trace::{
    Span as _, SpanBuilder, SpanContext, SpanId, SpanKind, TraceContextExt, TraceFlags, TraceId,
    TraceState, Tracer,
};
use opentelemetry::{Context, KeyValue};
use rand::Rng;

use crate::plumbing::context::RequestContext;
use crate::plumbing::route::RouteMetrics;

use super::traceparent::{acceptable_tracestate, TraceParent, TRACEPARENT, TRACESTATE};
use super::Telemetry;

/// One request's trace context and upstream record.
#[derive(Debug)]
pub(crate) struct Exchange {
    pub(super) telemetry: Arc<Telemetry>,
    trace_id: u128,
    /// The server span's id: the parent of the attempts when no span is recorded.
    span_id: u64,
    flags: u8,
    /// The trusted caller's `tracestate`, forwarded as it came.
    pub(super) tracestate: Option<HeaderValue>,
    /// The server span, in a context its attempts are children of; `None` when not exporting.
    pub(super) server: Option<Context>,
    attempts: AtomicU32,
    upstream_nanos: AtomicU64,
    bytes_in: AtomicU64,
    endpoint: Mutex<Option<Authority>>,
    /// The matched route's metrics and, once the caller is known, the request context: set
    /// by the route resolution, read by the observe step when the response is ready. Here
    /// rather than in response extensions, which cost an allocation each per request.
    resolution: OnceLock<Resolution>,
}

/// What the route resolution found, for the observe step.
#[derive(Debug)]
pub(crate) struct Resolution {
    /// The matched route's metrics.
    pub metrics: RouteMetrics,
    /// The request context; `None` when the caller was refused (bad key or token).
    pub context: Option<Arc<RequestContext>>,
}

impl Exchange {
    /// Takes the trace context off the request (continued only from a trusted `peer`) and
    /// starts the server span when exporting.
    pub(crate) fn open(
        telemetry: &Arc<Telemetry>,
        request: &mut Request<Body>,
        peer: Option<IpAddr>,
    ) -> Self {
        let headers = request.headers_mut();
        // Removed whoever sent them: the gateway sends its own on every attempt.
        let incoming = headers.remove(&TRACEPARENT);
        let state = headers.remove(&TRACESTATE);
        let trusted = peer.is_some_and(|ip| telemetry.trusted.contains(ip));
        let parent = incoming
            .filter(|_| trusted)
            .and_then(|value| TraceParent::parse(value.as_bytes()));
        let tracestate = state
            .filter(|_| parent.is_some())
            .filter(acceptable_tracestate);
        let (trace_id, span_id, flags, server) = match &telemetry.tracer {
            Some(tracer) => {
                let parent_cx = match parent {
                    Some(p) => Context::new().with_remote_span_context(SpanContext::new(
                        TraceId::from(p.trace_id),
                        SpanId::from(p.parent_id),
                        TraceFlags::new(p.flags),
                        true,
                        tracestate
                            .as_ref()
                            .and_then(|v| v.to_str().ok())
                            .and_then(|s| TraceState::from_str(s).ok())
                            .unwrap_or_default(),
                    )),
                    None => Context::new(),
                };
                let builder = SpanBuilder::from_name("gateway request")
                    .with_kind(SpanKind::Server)
                    .with_attributes([KeyValue::new(
                        "http.request.method",
                        request.method().as_str().to_owned(),
                    )]);
                let span = tracer.build_with_context(builder, &parent_cx);
                let context = span.span_context().clone();
                (
                    u128::from_be_bytes(context.trace_id().to_bytes()),
                    u64::from_be_bytes(context.span_id().to_bytes()),
                    context.trace_flags().to_u8(),
                    Some(parent_cx.with_span(span)),
                )
            }
            None => {
                let mut rng = rand::thread_rng();
                let trace_id = parent.map_or_else(|| rng.gen_range(1..=u128::MAX), |p| p.trace_id);
                let flags = parent.map_or(0, |p| p.flags);
                (trace_id, rng.gen_range(1..=u64::MAX), flags, None)
            }
        };
        Self {
            telemetry: telemetry.clone(),
            trace_id,
            span_id,
            flags,
            tracestate,
            server,
            attempts: AtomicU32::new(0),
            upstream_nanos: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            endpoint: Mutex::new(None),
            resolution: OnceLock::new(),
        }
    }

    /// The server span, when spans are exported.
    pub(crate) fn server_span(&self) -> Option<opentelemetry::trace::SpanRef<'_>> {
        self.server.as_ref().map(|context| context.span())
    }

    /// The trace id.
    pub(crate) fn trace_id(&self) -> u128 {
        self.trace_id
    }

    /// The server span's id and the trace flags, for attempts that record no span.
    pub(super) fn parent(&self) -> (u64, u8) {
        (self.span_id, self.flags)
    }

    /// Upstream attempts made so far.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts.load(Ordering::Relaxed)
    }

    /// Time spent in upstream attempts so far (backoff excluded).
    pub(crate) fn upstream_time(&self) -> Duration {
        Duration::from_nanos(self.upstream_nanos.load(Ordering::Relaxed))
    }

    /// Request body bytes read so far.
    pub(crate) fn bytes_in(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed)
    }

    /// Counts request body bytes.
    pub(crate) fn add_bytes_in(&self, bytes: u64) {
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records what the route resolution found; only the first call counts (a request is
    /// resolved once).
    pub(crate) fn resolved(&self, resolution: Resolution) {
        let _ = self.resolution.set(resolution);
    }

    /// What the route resolution found; `None` for a request that matched no route or
    /// was answered before routing.
    pub(crate) fn resolution(&self) -> Option<&Resolution> {
        self.resolution.get()
    }

    /// The endpoint of the latest attempt.
    pub(crate) fn endpoint(&self) -> Option<Authority> {
        self.endpoint.lock().ok().and_then(|slot| slot.clone())
    }

    /// An attempt `number` to `endpoint` began.
    pub(super) fn attempt_started(&self, number: u32, endpoint: Option<&Authority>) {
        self.attempts.fetch_max(number, Ordering::Relaxed);
        if let Ok(mut slot) = self.endpoint.lock() {
            *slot = endpoint.cloned();
        }
    }

    /// An attempt ended after `elapsed`.
    pub(super) fn attempt_ended(&self, elapsed: Duration) {
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.upstream_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}
