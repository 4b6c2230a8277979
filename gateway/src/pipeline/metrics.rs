//! Prometheus metrics: one process-wide recorder, rendered at `/metrics` on the admin
//! listener, and the layer that counts every request by route and status.

use std::sync::{Arc, OnceLock};

use axum::body::Body;
use http::{Method, Request, Response};
use metrics::SharedString;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::pipeline::step::{Finish, Step};

/// Latency buckets in seconds: 100 µs to 30 s (the longest synchronous retry budget).
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the recorder once per process and returns the handle that renders it. `None` when
/// another recorder was installed first (then metrics go there).
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .ok()?;
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            metrics::set_global_recorder(recorder).ok()?;
            Some(handle)
        })
        .clone()
}

/// Counts requests and observes latency by route and status (a [`Step`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Observe;

/// What [`Observe`] remembers of a request until its response.
pub(crate) struct Observed {
    started: tokio::time::Instant,
    method: Method,
}

impl Step for Observe {
    type Finish = Observed;

    fn step(&self, request: &mut Request<Body>) -> Result<Observed, Response<Body>> {
        Ok(Observed {
            started: tokio::time::Instant::now(),
            method: request.method().clone(),
        })
    }
}

impl Finish for Observed {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        let Self { started, method } = self;
        let status = response.status().as_u16();
        let elapsed = started.elapsed();
        // The router hands the matched route's metrics back on the response.
        let metrics = match response.extensions().get::<RouteMetrics>() {
            Some(route) => route,
            None => unmatched(),
        };
        metrics.record(status, elapsed);
        tracing::debug!(
            target: "portcullis::access",
            %method,
            route = metrics.label(),
            status,
            latency_ms = elapsed.as_secs_f64() * 1000.0,
            "request"
        );
        response
    }
}

/// Request metrics of one route, registered once: recording is then an atomic add, with no
/// label formatting or registry lookup per request. Clones share them (one `Arc`).
#[derive(Debug, Clone)]
pub struct RouteMetrics(Arc<Registered>);

#[derive(Debug)]
struct Registered {
    label: Arc<str>,
    latency: metrics::Histogram,
    /// One counter per status code 100..=599, registered on first use.
    by_status: Box<[OnceLock<metrics::Counter>]>,
}

impl RouteMetrics {
    /// Metrics labelled `route = label`.
    pub fn new(label: Arc<str>) -> Self {
        let latency = metrics::histogram!("http_request_duration_seconds", "route" => SharedString::from(label.clone()));
        Self(Arc::new(Registered {
            label,
            latency,
            by_status: (100..600).map(|_| OnceLock::new()).collect(),
        }))
    }

    /// The `route` label.
    pub fn label(&self) -> &str {
        &self.0.label
    }

    /// Counts one answer with `status` that took `elapsed`.
    pub fn record(&self, status: u16, elapsed: std::time::Duration) {
        let this = &self.0;
        this.latency.record(elapsed.as_secs_f64());
        let Some(slot) = usize::from(status)
            .checked_sub(100)
            .and_then(|i| this.by_status.get(i))
        else {
            return;
        };
        slot.get_or_init(|| {
            metrics::counter!(
                "http_requests_total",
                "route" => SharedString::from(this.label.clone()),
                "status" => status.to_string()
            )
        })
        .increment(1);
    }
}

fn unmatched() -> &'static RouteMetrics {
    static UNMATCHED: OnceLock<RouteMetrics> = OnceLock::new();
    UNMATCHED.get_or_init(|| RouteMetrics::new(Arc::from("unmatched")))
}
