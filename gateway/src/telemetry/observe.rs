//! Prometheus metrics: one process-wide recorder, rendered at `/metrics` on the admin
//! listener, and the layer that counts every request by route, status and tenant, ends its
//! server span and writes its access-log line (see `crate::telemetry`).

use std::net::IpAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use http::{HeaderValue, Method, Request, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use opentelemetry::KeyValue;
use portcullis_idempotency::IdempotencyOutcome;
use portcullis_ratelimit::RateLimitOutcome;

use crate::plumbing::client::PeerAddr;
use crate::plumbing::context::Caller;
use crate::plumbing::route::RouteMetrics;
use crate::plumbing::step::{Finish, Step};
use crate::telemetry::{AccessLine, Counted, Exchange, Telemetry};
use portcullis_problem::headers::{IDEMPOTENCY_KEY, X_REQUEST_ID};

/// Latency buckets in seconds: 100 µs to 30 s (the longest synchronous retry budget).
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// How often recorded histogram samples are folded into their buckets.
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the recorder once per process and returns the handle that renders it. `None` when
/// another recorder was installed first (then metrics go there).
///
/// The recorder keeps every histogram sample until its upkeep folds them into the buckets.
/// Nothing else runs it but a scrape, so without one a process that is never scraped would
/// grow by 8 bytes per sample (three per proxied request: 100 MiB after a few million
/// requests). A thread of its own runs it every second, off the request path, as the
/// exporter's own `install` does.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            let upkeep = handle.clone();
            // Without the thread, samples are still folded at every scrape.
            let _ = std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || loop {
                    std::thread::sleep(UPKEEP_EVERY);
                    upkeep.run_upkeep();
                });
            Some(handle)
        })
        .clone()
}

/// Counts requests, opens the request's trace and writes its access-log line (a [`Step`]).
#[derive(Debug, Clone)]
pub(crate) struct Observe(Arc<Telemetry>);

impl Observe {
    /// Observes with `telemetry`.
    pub(crate) fn new(telemetry: Arc<Telemetry>) -> Self {
        Self(telemetry)
    }
}

/// What [`Observe`] remembers of a request until its response.
pub(crate) struct Observed {
    started: tokio::time::Instant,
    telemetry: Arc<Telemetry>,
    exchange: Arc<Exchange>,
    peer: Option<IpAddr>,
    /// Only when the access log is written: method, path and `Idempotency-Key`.
    request: Option<(Method, String, Option<HeaderValue>)>,
}

impl Step for Observe {
    type Finish = Observed;

    fn step(&self, request: &mut Request<Body>) -> Result<Observed, Response<Body>> {
        let started = tokio::time::Instant::now();
        let telemetry = &self.0;
        let peer = request.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        let exchange = Arc::new(Exchange::open(telemetry, request, peer));
        request.extensions_mut().insert(exchange.clone());
        let logged = telemetry.access_log_enabled().then(|| {
            let uri = request.uri();
            let path = match (telemetry.access_log_query(), uri.path_and_query()) {
                (true, Some(full)) => full.as_str().to_owned(),
                _ => uri.path().to_owned(),
            };
            let key = request.headers().get(&IDEMPOTENCY_KEY).cloned();
            (request.method().clone(), path, key)
        });
        if logged.is_some() {
            // A declared length is what will be read (the limits layer holds the body to
            // it); a chunked body is counted as it is read.
            match http_body::Body::size_hint(request.body()).exact() {
                Some(length) => exchange.add_bytes_in(length),
                None => {
                    let body = std::mem::take(request.body_mut());
                    *request.body_mut() = Counted::wrap(body, exchange.clone());
                }
            }
        }
        Ok(Observed {
            started,
            telemetry: telemetry.clone(),
            exchange,
            peer,
            request: logged,
        })
    }
}

impl Finish for Observed {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        let Self {
            started,
            telemetry,
            exchange,
            peer,
            request,
        } = self;
        let status = response.status().as_u16();
        let elapsed = started.elapsed();
        let extensions = response.extensions();
        // The route resolution left the matched route's metrics and the request context in
        // the exchange; the rate-limit and idempotency layers their decisions on the response.
        let resolution = exchange.resolution();
        let metrics = match resolution {
            Some(resolution) => &resolution.metrics,
            None => unmatched(),
        };
        metrics.record(status, elapsed);
        let context = resolution.and_then(|r| r.context.as_deref());
        let tenant = context.and_then(|c| match &c.caller {
            Caller::Tenant(tenant) => Some(&tenant.id),
            _ => None,
        });
        let rate_limit = extensions.get::<RateLimitOutcome>().copied();
        let idempotency = extensions.get::<IdempotencyOutcome>().copied();
        telemetry.tenants().of(tenant.map(|t| &**t)).record(
            status,
            rate_limit == Some(RateLimitOutcome::Limited),
            elapsed,
        );
        let rate_limit = rate_limit.map_or("-", RateLimitOutcome::as_str);
        let idempotency = idempotency.map_or("-", IdempotencyOutcome::as_str);
        let client_ip = context.map(|c| c.client.ip).or(peer);
        let upstream = context.and_then(|c| telemetry.upstream_name(c.route.settings.upstream));
        if let Some(span) = exchange.server_span().filter(|s| s.is_recording()) {
            span.set_attributes([
                KeyValue::new("http.route", metrics.label().to_owned()),
                KeyValue::new("http.response.status_code", i64::from(status)),
                KeyValue::new(
                    "portcullis.tenant",
                    tenant.map_or_else(|| "-".to_owned(), |t| t.to_string()),
                ),
                KeyValue::new("portcullis.ratelimit", rate_limit),
                KeyValue::new("portcullis.idempotency", idempotency),
                KeyValue::new("portcullis.attempts", i64::from(exchange.attempts())),
            ]);
            if let Some(ip) = client_ip {
                span.set_attribute(KeyValue::new("client.address", ip.to_string()));
            }
            if let Some(upstream) = upstream {
                span.set_attribute(KeyValue::new("portcullis.upstream", upstream.to_string()));
            }
            if status >= 500 {
                span.set_status(opentelemetry::trace::Status::error("server error"));
            }
            span.end();
        }
        let Some((method, path, idempotency_key)) = request else {
            return response;
        };
        let mut line = AccessLine::new(started, exchange.clone(), method, path, status);
        line.request_id = response.headers().get(&X_REQUEST_ID).cloned();
        line.tenant = tenant.cloned();
        line.client_ip = client_ip;
        line.route = metrics.label_arc();
        line.upstream = upstream.cloned();
        line.rate_limit = rate_limit;
        line.idempotency = idempotency;
        line.idempotency_key = idempotency_key;
        line.attach(response)
    }
}

fn unmatched() -> &'static RouteMetrics {
    static UNMATCHED: OnceLock<RouteMetrics> = OnceLock::new();
    UNMATCHED.get_or_init(|| RouteMetrics::new(Arc::from("unmatched")))
}
