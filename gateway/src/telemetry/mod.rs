//! Telemetry: W3C trace context and spans (exported over OTLP when configured), the access
//! log, and per-tenant / per-upstream-attempt metric series.
//!
//! # How a request is observed
//!
//! The observe step (`telemetry::observe::Observe`, outermost of the request layers) opens an
//! [`Exchange`] per request: the trace it belongs to, the server span when spans are
//! exported, and counters the upstream attempts fill in. It rides in request extensions (an
//! `Arc`, cloned into every attempt). The proxy starts an [`Attempt`] per upstream attempt:
//! a child span, the `traceparent` sent upstream, the attempt's metrics. Layers that decide
//! something about the request leave it on the response (`RateLimitOutcome`,
//! `IdempotencyOutcome`, the request context), where the observe step reads it for the span,
//! the metrics and the access-log line.
//!
//! # Trust
//!
//! `traceparent`/`tracestate` are continued only from peers in `server.trusted_proxies` (as
//! Envoy continues a trace only from a trusted edge); from anyone else they are removed and
//! a new trace starts, so an untrusted client can neither join nor force-sample a trace nor
//! smuggle its own context to the upstream. A malformed `traceparent` starts a new trace.
//!
//! # Cost when off
//!
//! Without `otlp_endpoint` no span is created: the trace id is drawn from the thread-local
//! RNG, and each attempt formats one 55-byte `traceparent` into a stack buffer. The access
//! log captures the path only when its target is enabled.

mod access;
mod attempt;
mod exchange;
pub mod export;
pub mod fields;
pub(crate) mod observe;
pub mod series;
mod traceparent;

use std::sync::Arc;

use opentelemetry_sdk::trace::SdkTracer;

use crate::config::Config;
use crate::plumbing::client::TrustedProxies;

pub use access::write_access_lines_directly;
pub(crate) use access::{AccessLine, Counted, ACCESS_TARGET};
pub(crate) use attempt::Attempt;
pub(crate) use exchange::{Exchange, Resolution};

/// Everything the request path needs for telemetry, built once per stack.
#[derive(Debug)]
pub(crate) struct Telemetry {
    /// The OTLP tracer; `None` when spans are not exported.
    tracer: Option<SdkTracer>,
    /// Peers whose trace context is continued.
    trusted: Arc<TrustedProxies>,
    /// Per-tenant series.
    tenants: series::TenantLabels,
    /// Per-upstream attempt series, indexed like the configuration's upstreams.
    attempts: Vec<series::AttemptSeries>,
    /// Upstream names, indexed likewise.
    upstream_names: Vec<Arc<str>>,
    /// The access log is on.
    access_log: bool,
    /// The access log keeps the query string.
    access_log_query: bool,
}

impl Telemetry {
    /// Telemetry for `config`, exporting spans through the installed tracer (if any).
    pub(crate) fn new(config: &Config, trusted: Arc<TrustedProxies>) -> Self {
        Self::with_tracer(config, trusted, export::tracer())
    }

    /// The same with an explicit tracer (tests export to memory).
    pub(crate) fn with_tracer(
        config: &Config,
        trusted: Arc<TrustedProxies>,
        tracer: Option<SdkTracer>,
    ) -> Self {
        let settings = &config.telemetry;
        Self {
            tracer,
            trusted,
            tenants: series::TenantLabels::new(&settings.tenant_labels),
            attempts: config
                .upstreams
                .iter()
                .map(|u| series::AttemptSeries::register(&u.name))
                .collect(),
            upstream_names: config
                .upstreams
                .iter()
                .map(|u| Arc::from(u.name.as_str()))
                .collect(),
            access_log: settings.access_log,
            access_log_query: settings.access_log_query,
        }
    }

    /// The per-tenant series.
    pub(crate) fn tenants(&self) -> &series::TenantLabels {
        &self.tenants
    }

    /// Whether this request's access-log line would be written.
    pub(crate) fn access_log_enabled(&self) -> bool {
        self.access_log && tracing::enabled!(target: ACCESS_TARGET, tracing::Level::INFO)
    }

    /// Whether the access log keeps query strings.
    pub(crate) fn access_log_query(&self) -> bool {
        self.access_log_query
    }

    /// The name of upstream `index`.
    pub(crate) fn upstream_name(&self, index: usize) -> Option<&Arc<str>> {
        self.upstream_names.get(index)
    }
}
