//! Load shedding: over the global in-flight cap, answer 503 + `Retry-After` at once rather
//! than queue. The permit is held by the response body, so a slow download still counts as
//! in flight until its last byte.
//!
//! # Priority
//!
//! Routes marked `priority = "critical"` keep a reserved share of `server.load_shed_limit`
//! (`server.critical_reserve`, default 0.1): other requests are shed once
//! `load_shed_limit − ⌊load_shed_limit × critical_reserve⌋` are in flight, critical ones only at
//! `load_shed_limit`. Both count on the one counter, so the cap itself is never exceeded and
//! critical traffic may use the whole of it. When no route is critical nothing is held back:
//! a reserve nobody can use would only shed normal traffic early. Envoy's overload manager
//! and Netflix's concurrency limiter partition the same way (lower priorities shed first).
//!
//! Admission is one compare-and-swap on a shared counter ([`CountPermit`]): cheaper than a
//! semaphore's permit bookkeeping, and the two thresholds are just two limits on it.
//!
//! # Fair shares
//!
//! Before the cap, each caller's own count is checked ([`crate::pipeline::fair_share`]):
//! one caller holds at most `server.caller_share` of `load_shed_limit`, and past half of it
//! no more than its fair share; over that it gets 429 `concurrency-limited`, not 503.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response};

use crate::config::Priority;
use crate::pipeline::concurrency::{self, Scope};
use crate::pipeline::fair_share::FairShare;
use crate::pipeline::in_flight::{CountPermit, KeyedPermit};
use crate::plumbing::context::Caller;
use crate::plumbing::context::RequestContext;
use crate::plumbing::held::{hold_until_body_ends, Held};
use crate::plumbing::step::{Finish, Step};
use portcullis_problem::Problem;

/// What a shed client is told to wait: long enough to spread a herd, short enough to be useful.
pub const SHED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Caps concurrent requests (a [`Step`]; clones share the cap). Runs after the request
/// context is resolved, to read the route's priority.
#[derive(Debug, Clone)]
pub(crate) struct LoadShed {
    in_flight: Arc<AtomicU64>,
    caps: Caps,
    /// Per-caller shares of the cap; `None` when `caller_share` is 1.0.
    fair: Option<Arc<FairShare>>,
}

/// The two admission thresholds on the one in-flight counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// Normal-priority requests are admitted while fewer than this are in flight.
    pub(crate) normal: u64,
    /// Critical requests are admitted while fewer than this (`load_shed_limit`) are.
    pub(crate) critical: u64,
}

impl Caps {
    /// The thresholds for `load_shed_limit` with `reserve` of it kept for critical routes
    /// (`any_critical = false`: nothing is kept). The reserve is rounded down to whole
    /// requests (a cap of 1 reserves nothing, so normal traffic is never refused outright);
    /// the 1e-9 absorbs a product such as `100 × 0.29 = 28.999…` that is meant whole.
    pub(crate) fn new(load_shed_limit: usize, reserve: f64, any_critical: bool) -> Self {
        let critical = u64::try_from(load_shed_limit).unwrap_or(u64::MAX);
        let reserve = if any_critical {
            reserve.clamp(0.0, 1.0)
        } else {
            0.0
        };
        // Truncation is the rounding down intended; the value is within 0..=critical.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let reserved = ((critical as f64) * reserve + 1e-9).floor() as u64;
        Self {
            normal: critical.saturating_sub(reserved.min(critical)),
            critical,
        }
    }
}

impl LoadShed {
    /// At most `load_shed_limit` requests at once, the last `critical_reserve` share of them
    /// for critical routes when `any_critical`.
    pub(crate) fn new(load_shed_limit: usize, critical_reserve: f64, any_critical: bool) -> Self {
        Self {
            in_flight: Arc::default(),
            caps: Caps::new(load_shed_limit, critical_reserve, any_critical),
            fair: None,
        }
    }

    /// The same, with no caller holding more than its share (`pipeline::fair_share`;
    /// `caller_share` 1.0: no limit per caller).
    pub(crate) fn with_caller_share(mut self, load_shed_limit: usize, caller_share: f64) -> Self {
        self.fair = FairShare::new(load_shed_limit, caller_share).map(Arc::new);
        self
    }
}

impl Step for LoadShed {
    type Finish = ShedPermit;

    fn step(&self, request: &mut Request<Body>) -> Result<ShedPermit, Response<Body>> {
        let context = RequestContext::of(request.extensions());
        let critical =
            context.is_some_and(|context| context.route.settings.priority == Priority::Critical);
        // The caller's share first: a caller over it is told so (429) even when the server
        // is full too; its slot goes back (dropped) if the server then refuses.
        let caller = match (&self.fair, context) {
            (Some(fair), Some(context)) => {
                let key = context.caller_key();
                match fair.try_acquire(key, &self.in_flight) {
                    Ok(permit) => Some(permit),
                    Err(limit) => {
                        if let Caller::Tenant(tenant) = &context.caller {
                            tenant.record_rate_limited();
                        }
                        return Err(concurrency::refuse(Scope::Caller, limit));
                    }
                }
            }
            _ => None,
        };
        let cap = if critical {
            self.caps.critical
        } else {
            self.caps.normal
        };
        let Some(permit) = CountPermit::try_acquire(&self.in_flight, cap) else {
            metrics::counter!("load_shed_total").increment(1);
            return Err(Problem::overloaded(SHED_RETRY_AFTER).into_response());
        };
        Ok(ShedPermit {
            _permit: permit,
            _caller: caller,
        })
    }
}

/// The permit of a request let through; handed on to its response body.
#[derive(Debug)]
pub(crate) struct ShedPermit {
    _permit: CountPermit,
    _caller: Option<KeyedPermit>,
}

/// Given back when dropped (the permit's own `Drop`).
impl Held for ShedPermit {}

impl Finish for ShedPermit {
    fn finish(self, response: Response<Body>) -> Response<Body> {
        hold_until_body_ends(response, self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plumbing::step::StepLayer;
    use tower::{Layer, ServiceExt};

    #[tokio::test]
    async fn sheds_over_the_cap_and_releases_with_the_body() {
        let layer = StepLayer::new(LoadShed::new(1, 0.1, true));
        let service = layer.layer(tower::service_fn(|_req: Request<Body>| async {
            Ok::<_, std::convert::Infallible>(Response::new(Body::from("hello")))
        }));
        let held = service
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        let shed = service
            .clone()
            .oneshot(Request::new(Body::empty()))
            .await
            .unwrap();
        assert_eq!(shed.status(), 503);
        assert_eq!(shed.headers()["retry-after"], "1");
        drop(held);
        let ok = service.oneshot(Request::new(Body::empty())).await.unwrap();
        assert_eq!(ok.status(), 200);
    }

    #[test]
    fn the_reserve_is_whole_requests_rounded_down() {
        let caps = |max, reserve, any| {
            let c = Caps::new(max, reserve, any);
            (c.normal, c.critical)
        };
        assert_eq!(caps(10_000, 0.1, true), (9_000, 10_000));
        assert_eq!(caps(10, 0.1, true), (9, 10));
        assert_eq!(caps(100, 0.29, true), (71, 100), "28.999… is 29");
        assert_eq!(caps(5, 0.5, true), (3, 5), "2.5 reserves 2");
        assert_eq!(caps(1, 0.1, true), (1, 1), "a cap of 1 reserves nothing");
        assert_eq!(caps(10, 0.9, true), (1, 10));
        assert_eq!(caps(10, 0.0, true), (10, 10));
        assert_eq!(
            caps(10, 0.5, false),
            (10, 10),
            "no critical route, no reserve"
        );
    }

    #[tokio::test]
    async fn critical_routes_use_the_reserve_normal_ones_are_shed_first() {
        use crate::pipeline::resolve::tests::context_for;
        let shed = LoadShed::new(2, 0.5, true);
        let request = |priority| {
            let mut request = Request::new(Body::empty());
            request.extensions_mut().insert(context_for(priority));
            request
        };
        let normal = shed.step(&mut request(Priority::Normal)).unwrap();
        let refused = shed.step(&mut request(Priority::Normal)).unwrap_err();
        assert_eq!(refused.status(), 503);
        let critical = shed.step(&mut request(Priority::Critical)).unwrap();
        assert_eq!(
            shed.step(&mut request(Priority::Critical))
                .unwrap_err()
                .status(),
            503,
            "the cap itself holds for critical requests"
        );
        drop((normal, critical));
        let again = shed.step(&mut request(Priority::Normal));
        assert!(again.is_ok(), "dropped permits come back");
    }

    #[tokio::test]
    async fn a_caller_over_its_share_gets_429_and_others_still_get_in() {
        use crate::pipeline::resolve::tests::context_on;
        let config = "[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9\"]\n\n\
                      [[routes]]\nprefix = \"/\"\nupstream = \"u\"\n";
        let shed = LoadShed::new(4, 0.0, false).with_caller_share(4, 0.5);
        let from = |last: u8| {
            let mut request = Request::new(Body::empty());
            let ip = std::net::IpAddr::from([192, 0, 2, last]);
            request
                .extensions_mut()
                .insert(context_on(config, "/", Caller::Anonymous, ip));
            request
        };
        let held: Vec<_> = (0..2).map(|_| shed.step(&mut from(1)).unwrap()).collect();
        let refused = shed.step(&mut from(1)).unwrap_err();
        assert_eq!(refused.status(), 429);
        assert_eq!(refused.headers()["retry-after"], "1");
        let body = http_body_util::BodyExt::collect(refused.into_body())
            .await
            .unwrap()
            .to_bytes();
        let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            (problem["scope"].as_str(), problem["limit"].as_u64()),
            (Some("caller"), Some(2))
        );
        // Another address gets in; the server's own cap still answers 503.
        let others: Vec<_> = (2..4).map(|n| shed.step(&mut from(n)).unwrap()).collect();
        assert_eq!(shed.step(&mut from(4)).unwrap_err().status(), 503);
        drop((held, others));
        assert!(shed.step(&mut from(1)).is_ok(), "slots come back");
    }
}
