//! The admin API's view of the upstreams (`GET /admin/v1/upstreams`).

use std::sync::Arc;

use std::time::Duration;

use portcullis_control::admin::{
    EndpointHealth, EndpointStatus, LatencyStatus, RouteLatencyStatus, UpstreamStatus,
    UpstreamsView,
};
use portcullis_retry::{Latency, RetryPolicy};

use super::Now;
use crate::upstream::proxy::Upstream;

/// Bounds of a recommended attempt timeout when the upstream's is fixed.
const RECOMMENDED_BOUNDS: (Duration, Duration) =
    (Duration::from_millis(50), Duration::from_secs(300));

/// Every upstream with its retry policy, for the admin API.
#[derive(Debug)]
pub(crate) struct Upstreams(pub(crate) Vec<(Arc<Upstream>, RetryPolicy)>);

impl UpstreamsView for Upstreams {
    fn upstreams(&self) -> Vec<UpstreamStatus> {
        self.0.iter().map(|(u, policy)| status(u, policy)).collect()
    }
}

/// Attempt latency of `histogram` and the timeout it suggests: within the `"auto"` bounds
/// when the upstream learns its timeout, else within [`RECOMMENDED_BOUNDS`].
fn latency(histogram: &Latency, policy: &RetryPolicy) -> Option<LatencyStatus> {
    let measured = histogram.recent()?;
    let params = policy.params();
    let (floor, ceiling) = match params.auto_attempt_timeout_floor {
        Some(floor) => (floor, params.attempt_timeout),
        None => RECOMMENDED_BOUNDS,
    };
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Some(LatencyStatus {
        samples: measured.samples,
        p50_ms: ms(measured.p50),
        p99_ms: ms(measured.p99),
        p999_ms: ms(measured.p999),
        recommended_attempt_timeout_ms: millis(histogram.recommended(floor, ceiling)),
    })
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn status(upstream: &Upstream, policy: &RetryPolicy) -> UpstreamStatus {
    let balancer = upstream.balancer();
    let set = balancer.endpoint_set();
    let clock = balancer.clock();
    let now = clock.now();
    let mut lazy = Now::new(clock);
    let endpoints: Vec<EndpointStatus> = set
        .endpoints()
        .iter()
        .map(|e| {
            let ejected = e.state.ejected_until(now);
            let state = if e.state.active_down() {
                EndpointHealth::Unhealthy
            } else if ejected.is_some() {
                EndpointHealth::Ejected
            } else {
                EndpointHealth::Healthy
            };
            EndpointStatus {
                url: e.address.url(),
                host: e.address.host.to_str().unwrap_or_default().to_owned(),
                weight: e.weight,
                state,
                ejected_for_ms: ejected.map(|until| (until - now) / 1_000_000),
                ejections: e.state.ejections(),
                consecutive_failures: e.state.consecutive_failures(),
                in_flight: e.state.in_flight(),
            }
        })
        .collect();
    let healthy = set
        .endpoints()
        .iter()
        .filter(|e| e.state.usable(&mut lazy))
        .count();
    UpstreamStatus {
        name: balancer.name().to_owned(),
        load_balancer: balancer.load_balancer().as_str().to_owned(),
        circuit_breaker: balancer.state().breaker_state().to_owned(),
        healthy_endpoints: healthy,
        panic: set.in_panic(healthy),
        endpoints,
        attempt_timeout_ms: millis(policy.attempt_timeout_for(balancer.state())),
        latency: latency(balancer.state().latency_histogram(), policy),
        retry_amplification: balancer.state().retry_amplification(),
        routes: balancer
            .state()
            .route_latencies()
            .iter()
            .map(|(route, histogram)| RouteLatencyStatus {
                route: route.to_string(),
                latency: latency(histogram, policy),
            })
            .collect(),
    }
}
