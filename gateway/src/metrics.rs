//! Prometheus metrics: one process-wide recorder, rendered at `/metrics` on the admin
//! listener, and the layer that counts every request by route and status.

use std::sync::OnceLock;
use std::task::{Context, Poll};

use axum::body::Body;
use futures_util::future::{BoxFuture, FutureExt};
use http::{Request, Response};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tower::{Layer, Service};

use crate::router::MatchedRoute;

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

/// Counts requests and observes latency by route and status.
#[derive(Debug, Clone, Copy, Default)]
pub struct ObserveLayer;

/// The service of [`ObserveLayer`].
#[derive(Debug, Clone)]
pub struct Observe<S> {
    inner: S,
}

impl<S> Layer<S> for ObserveLayer {
    type Service = Observe<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Observe { inner }
    }
}

impl<S> Service<Request<Body>> for Observe<S>
where
    S: Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<Response<Body>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let started = tokio::time::Instant::now();
        let method = request.method().clone();
        let future = self.inner.call(request);
        async move {
            let response = future.await?;
            let route: String = response
                .extensions()
                .get::<MatchedRoute>()
                .map(|m| m.0.label.to_string())
                .unwrap_or_else(|| "unmatched".to_owned());
            let status = response.status().as_u16();
            let elapsed = started.elapsed();
            metrics::counter!("http_requests_total", "route" => route.clone(), "status" => status.to_string())
                .increment(1);
            metrics::histogram!("http_request_duration_seconds", "route" => route.clone())
                .record(elapsed.as_secs_f64());
            tracing::debug!(
                target: "portcullis::access",
                %method,
                route,
                status,
                latency_ms = elapsed.as_secs_f64() * 1000.0,
                "request"
            );
            Ok(response)
        }
        .boxed()
    }
}
