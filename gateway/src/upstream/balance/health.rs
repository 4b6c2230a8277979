//! Active health checks: one background task per upstream with a `health_check`, sending
//! `GET path` to every endpoint of the current set each `interval`, all endpoints of a
//! round concurrently and each bounded by `timeout`, so a round never outlasts
//! `timeout` (validation keeps it ≤ `interval`). A 2xx answer is a pass; anything else, a
//! connect error or the timeout is a failure. `unhealthy` failures in a row take an
//! endpoint out of balancing, `healthy` passes in a row bring it back (hysteresis as in
//! Envoy and nginx plus). New endpoints start healthy: a gateway that starts (or a name
//! that resolves) does not refuse traffic until a first round has passed. A pass on an
//! endpoint the checks hold healthy also ends its outlier ejection at once (Envoy's
//! default): a restarted endpoint is back within one `interval`, not after its ejection.

use std::sync::Arc;

use futures_util::future::{join_all, BoxFuture};
use http::uri::PathAndQuery;
use tokio::sync::watch;

use super::{Address, Balancer};

/// An upstream as its background tasks see it: its balancer, and one active health check
/// sent through its connection pool. The proxy implements it; naming it here keeps this
/// module from naming the proxy.
pub(crate) trait Probe: Send + Sync + 'static {
    /// The upstream's endpoints.
    fn balancer(&self) -> &Balancer;

    /// `GET path` to `address`; whether a 2xx came back.
    fn probe<'a>(&'a self, address: &'a Address, path: &'a PathAndQuery) -> BoxFuture<'a, bool>;
}

/// Runs the checks of `upstream` until `stop` turns true. Does nothing without a
/// `health_check`.
pub(crate) async fn run<U: Probe>(upstream: Arc<U>, mut stop: watch::Receiver<bool>) {
    let Some(settings) = upstream.balancer().health_check().cloned() else {
        return;
    };
    let mut ticker = tokio::time::interval(settings.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
        let set = upstream.balancer().endpoint_set();
        let checks = set.endpoints().iter().map(|endpoint| {
            let upstream = &upstream;
            let settings = &settings;
            async move {
                let passed = tokio::time::timeout(
                    settings.timeout,
                    upstream.probe(&endpoint.address, &settings.path),
                )
                .await
                .unwrap_or(false);
                if let Some(healthy) =
                    endpoint
                        .state
                        .record_check(passed, settings.healthy, settings.unhealthy)
                {
                    tracing::warn!(
                        upstream = upstream.balancer().name(),
                        endpoint = %endpoint.address.url(),
                        healthy,
                        "active health check changed the endpoint's state"
                    );
                }
                // A pass while healthy by the checks lifts a passive ejection at once.
                if passed
                    && !endpoint.state.active_down()
                    && endpoint.state.uneject(upstream.balancer().clock().now())
                {
                    tracing::warn!(
                        upstream = upstream.balancer().name(),
                        endpoint = %endpoint.address.url(),
                        "active health check passed: outlier ejection lifted"
                    );
                }
            }
        });
        tokio::select! {
            _ = join_all(checks) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}
