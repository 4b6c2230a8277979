//! A hook for `benches/balance.rs`: one endpoint set picked from outside the crate.

use std::sync::Arc;

use super::{Address, Clock, Endpoint, EndpointSet, EndpointState, Now};
use crate::config::LoadBalancer;

/// An endpoint set of `n` endpoints on loopback, with its clock.
#[derive(Debug)]
pub struct BenchSet {
    set: EndpointSet,
    clock: Clock,
}

impl BenchSet {
    /// `kind`: `"round_robin"`, `"least_request"` or `"peak_ewma"`; `n` ≥ 1 endpoints,
    /// weights 1, 2, 3 … so round robin runs its weighted schedule.
    pub fn new(kind: &str, n: u16) -> Self {
        let kind = match kind {
            "least_request" => LoadBalancer::LeastRequest,
            "peak_ewma" => LoadBalancer::PeakEwma,
            _ => LoadBalancer::RoundRobin,
        };
        let endpoints = (0..n)
            .filter_map(|i| {
                let text = format!("127.0.0.1:{}", 9000 + i);
                Some(Arc::new(Endpoint {
                    address: Address {
                        scheme: http::uri::Scheme::HTTP,
                        authority: text.parse().ok()?,
                        host: http::HeaderValue::from_str(&text).ok()?,
                    },
                    weight: u32::from(i % 3) + 1,
                    state: Arc::new(EndpointState::new()),
                }))
            })
            .collect();
        Self {
            set: EndpointSet::new(endpoints, kind, 50, 42),
            clock: Clock::new(),
        }
    }

    /// One pick, as the proxy makes it; the endpoint's id.
    #[inline]
    pub fn pick(&self, avoid: Option<usize>) -> usize {
        let mut now = Now::new(&self.clock);
        self.set.pick(avoid, &mut now).map_or(0, |e| e.state.id)
    }
}
