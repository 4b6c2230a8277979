//! The assembled pipeline around an in-memory upstream, for the in-process benchmark of the
//! request path (`benches/pipeline.rs`): every layer of [`super::build`] runs, the sockets and
//! the pooled client do not. Not an API.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use http::{Request, Response};
use http_body_util::BodyExt;
use portcullis_control::{Database, Directory};
use tower::ServiceExt;

use super::{assemble, StackParts};
use crate::config::Config;
use crate::edge::listener::HttpService;
use crate::pipeline::health::Health;
use crate::plumbing::client::{PeerAddr, TrustedProxies};
use crate::upstream::proxy::ProxyError;

/// The pipeline of `config` (memory backends expected), tenants in a SQLite file under `dir`,
/// answering every request with `201 {"ok":true}` after reading its body. Requests come from
/// `127.0.0.1:40000`, as the listener would say.
pub async fn pipeline(config: &Config, dir: &Path) -> Result<HttpService, crate::StartError> {
    let db = Database::sqlite(&dir.join("bench.db")).await?;
    db.upsert_tenants(&crate::start::tenant_seeds(&config.tenants))
        .await?;
    let directory = Arc::new(Directory::open(&db).await?);
    let upstreams = crate::start::upstreams(config);
    let parts = StackParts {
        upstreams,
        limiter: crate::pipeline::ratelimit::build_limiter(config)?,
        idempotency_store: crate::pipeline::idempotency::build_store(config, &directory).await?,
        directory,
        health: Arc::new(Health::new(db, Vec::new())),
        deliveries: None,
    };
    let upstream = tower::service_fn(|request: Request<Body>| async move {
        // Read the body as the pooled client would send it.
        let _ = request.into_body().collect().await;
        let mut response = Response::new(Body::from(r#"{"ok":true}"#));
        *response.status_mut() = http::StatusCode::CREATED;
        Ok::<_, ProxyError>(response)
    });
    let trusted = Arc::new(TrustedProxies::new(config.server.trusted_proxies.clone()));
    let pipeline = assemble(config, parts, trusted, upstream);
    let peer = PeerAddr(SocketAddr::from(([127, 0, 0, 1], 40000)));
    Ok(HttpService::new(pipeline.map_request(
        move |mut request: Request<Body>| {
            request.extensions_mut().insert(peer);
            request
        },
    )))
}
