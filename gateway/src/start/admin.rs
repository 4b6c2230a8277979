//! The admin listener: the operations routes (`/healthz`, `/readyz`, `/metrics`), and with
//! an admin token the admin API and the console, served by the same accept loop as the proxy.

use std::future::Future;
use std::sync::Arc;

use portcullis_control::admin;
use portcullis_redis::{ConnectOptions, RedisClient};

use super::stores::Stores;
use crate::config::{self, Config, StateBackend};
use crate::edge::listener::ServeOptions;
use crate::{edge, plumbing};

/// Serves the admin listener until `stopped`: the same accept loop as the proxy listener,
/// so it gets TLS (its own certificate), HTTP/2 and the same slow-client bounds, and the
/// connection guard's refusals are answered here too.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    service: Arc<edge::listener::Swap>,
    options: ServeOptions,
    stopped: impl Future<Output = ()> + Send + 'static,
) {
    edge::listener::serve(listener, service, options, stopped).await;
}

/// The admin listener's service around `app`: the connection guard's refusals answered.
pub(crate) fn service(app: axum::Router) -> edge::listener::HttpService {
    edge::listener::HttpService::new(
        tower::ServiceBuilder::new()
            .layer(plumbing::step::StepLayer::new(edge::framing::Smuggling))
            .service(app),
    )
}

/// The admin listener's app: operations routes, plus the admin API when a token is set.
/// Without a token the admin API is not served at all (404 problem saying why) rather than
/// refusing to start the gateway: the proxy and `/metrics` stay useful, and the embedded
/// default must run for a newcomer who has not set a token.
pub(crate) fn router(
    config: &Config,
    stores: &Stores,
    upstreams: Arc<dyn admin::UpstreamsView>,
    ops: axum::Router,
    deliveries: Option<&Arc<crate::pipeline::deliveries::Deliveries>>,
) -> axum::Router {
    let Some(token) = &config.admin_token else {
        tracing::warn!(
            "admin API disabled: {} is not set; the admin listener serves only /healthz, /readyz and /metrics",
            config::ENV_ADMIN_TOKEN
        );
        return ops.merge(admin::disabled_router());
    };
    let routes = config
        .routes
        .iter()
        .map(|r| admin::ConfiguredRoute {
            name: r.name.clone(),
            cost: r.cost,
        })
        .collect();
    tracing::info!(base = admin::BASE, "admin API enabled (bearer token)");
    // With shared rate-limit state the replicas also share their throttled-tenant counts.
    let options = ConnectOptions::default();
    let board_client = match &config.storage.state {
        StateBackend::Memory => None,
        StateBackend::Redis(url) => RedisClient::single(url, &options).ok(),
        StateBackend::RedisCluster(nodes) => RedisClient::cluster(nodes, &options).ok(),
    };
    let throttled_board = board_client.map(|client| {
        Arc::new(portcullis_control::usage_history::RedisBoard::new(client))
            as Arc<dyn portcullis_control::usage_history::ThrottledBoard>
    });
    ops.merge(admin::router(admin::AdminContext {
        db: stores.db.clone(),
        directory: stores.directory.clone(),
        limiter: stores.limiter.clone(),
        idempotency: stores.idempotency.clone(),
        token: Arc::from(token.expose()),
        routes,
        upstreams,
        throttled_board,
        deliveries: deliveries.map(|d| d.queue.clone()),
    }))
    // The console is a client of the admin API, so it is served only where the API is.
    .merge(portcullis_control::console::router())
}
