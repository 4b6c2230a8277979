//! The admin API's view of the upstreams (`GET /admin/v1/upstreams`).

use std::sync::Arc;

use portcullis_control::admin::{EndpointHealth, EndpointStatus, UpstreamStatus, UpstreamsView};

use super::Now;
use crate::upstream::proxy::Upstream;

/// Every upstream, for the admin API.
#[derive(Debug)]
pub(crate) struct Upstreams(pub(crate) Vec<Arc<Upstream>>);

impl UpstreamsView for Upstreams {
    fn upstreams(&self) -> Vec<UpstreamStatus> {
        self.0.iter().map(|u| status(u)).collect()
    }
}

fn status(upstream: &Upstream) -> UpstreamStatus {
    let set = upstream.endpoint_set();
    let clock = upstream.clock();
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
        name: upstream.name().to_owned(),
        load_balancer: upstream.load_balancer().as_str().to_owned(),
        circuit_breaker: upstream.dependency().breaker_state().to_owned(),
        healthy_endpoints: healthy,
        panic: set.in_panic(healthy),
        endpoints,
    }
}
