//! Operations endpoints: `/healthz` (the process serves), `/readyz` (the configured stores
//! accept a write — the database, a PostgreSQL idempotency store, on a Redis Cluster every
//! slot range's master —, every upstream has a
//! usable endpoint, and the process is not draining) and `/metrics` (Prometheus), on the admin listener;
//! `/healthz` and `/readyz` also answer on the proxy listener for load-balancer checks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use axum::Router;
use http::{Response, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;

use portcullis_control::Database;
use portcullis_problem::Problem;
use portcullis_redis::RedisClient;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::upstream::proxy::Upstream;

/// Each readiness check must answer within this.
const CHECK_TIMEOUT: Duration = Duration::from_secs(1);

/// `application_name` of the readiness probe's connection (apart from the store's own).
const PROBE_APPLICATION: &str = "portcullis-readyz";

/// The write probe of a PostgreSQL idempotency store: a row in its table, as `try_lock`
/// writes, under a tenant no configuration can have (ids are not empty), expiring in 10 s
/// (invisible to the store after it, then reaped). Every replica updates the same row.
const IDEMPOTENCY_PROBE: &str = "INSERT INTO idempotency_records \
     (tenant, route, key, fingerprint, state, fencing_token, expires_at) \
     VALUES ('', 'portcullis:readyz', 'probe', decode(repeat('00', 32), 'hex'), 'too_large', 0, \
     now() + interval '10 seconds') \
     ON CONFLICT (tenant, route, key) DO UPDATE SET expires_at = EXCLUDED.expires_at";

/// What readiness depends on.
#[derive(Debug)]
pub struct Health {
    draining: AtomicBool,
    db: Database,
    /// Each Redis deployment in use, with the configuration field that names it.
    redis: Vec<(&'static str, RedisClient)>,
    /// A PostgreSQL idempotency store (`storage.idempotency`): one lazily connected
    /// connection of its own, so a busy store pool cannot fail the probe.
    idempotency: Option<PgPool>,
    /// Replaced by a configuration reload.
    upstreams: ArcSwap<Vec<Arc<Upstream>>>,
}

// === impl Health ===

impl Health {
    /// Health over the database and any Redis servers or clusters in use.
    pub fn new(db: Database, redis: Vec<(&'static str, RedisClient)>) -> Self {
        Self {
            draining: AtomicBool::new(false),
            db,
            redis,
            idempotency: None,
            upstreams: ArcSwap::from_pointee(Vec::new()),
        }
    }

    /// Also not ready while the PostgreSQL idempotency store at `url` refuses a write. The
    /// connection is made by the first probe (the store has connected already).
    pub(crate) fn with_postgres_idempotency(mut self, url: &str) -> Result<Self, sqlx::Error> {
        let options = url
            .parse::<PgConnectOptions>()?
            .application_name(PROBE_APPLICATION);
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .acquire_timeout(CHECK_TIMEOUT)
            .connect_lazy_with(options);
        self.idempotency = Some(pool);
        Ok(self)
    }

    /// Also not ready while an upstream has no usable endpoint (see `ready`).
    pub(crate) fn with_upstreams(self, upstreams: Vec<Arc<Upstream>>) -> Self {
        self.set_upstreams(upstreams);
        self
    }

    /// The upstreams of a reloaded configuration.
    pub(crate) fn set_upstreams(&self, upstreams: Vec<Arc<Upstream>>) {
        self.upstreams.store(Arc::new(upstreams));
    }

    /// Marks the process as draining: `/readyz` answers 503 from now on.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
    }

    /// `Ok` when every store answers in time, the process is not draining, and every
    /// upstream has at least one usable endpoint (Envoy-style: an upstream with some
    /// endpoints down still serves; one with all down makes this replica not ready, named).
    pub async fn ready(&self) -> Result<(), String> {
        if self.draining.load(Ordering::SeqCst) {
            return Err("shutting down".into());
        }
        let upstreams = self.upstreams.load_full();
        let down: Vec<&str> = upstreams
            .iter()
            .filter(|u| !u.balancer().any_usable())
            .map(|u| u.balancer().name())
            .collect();
        if !down.is_empty() {
            return Err(format!(
                "upstreams with no healthy endpoint: {}",
                down.join(", ")
            ));
        }
        // A write, as the directory writes: `SELECT 1` still answers on a read-only database.
        match tokio::time::timeout(CHECK_TIMEOUT, self.db.check_writes()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => return Err(format!("database: {err}")),
            Err(_) => return Err("database: timed out".into()),
        }
        if let Some(pool) = &self.idempotency {
            let probe = sqlx::query(IDEMPOTENCY_PROBE).execute(pool);
            match tokio::time::timeout(CHECK_TIMEOUT, probe).await {
                Ok(Ok(_)) => {}
                Ok(Err(err)) => return Err(format!("storage.idempotency (postgres): {err}")),
                Err(_) => return Err("storage.idempotency (postgres): timed out".into()),
            }
        }
        for (field, client) in &self.redis {
            // A write, as the stores write: a cluster's remaining masters still answer PING
            // while the slots of a dead one refuse every keyed write.
            let kind = if client.is_cluster() {
                "redis cluster"
            } else {
                "redis"
            };
            let check = async {
                let mut conn = client.connect().await.map_err(|e| e.to_string())?;
                conn.check_writes().await.map_err(|e| e.to_string())
            };
            match tokio::time::timeout(CHECK_TIMEOUT, check).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => return Err(format!("{field} ({kind}): {err}")),
                Err(_) => return Err(format!("{field} ({kind}): timed out")),
            }
        }
        Ok(())
    }
}

/// `200 ok`.
pub fn healthz() -> Response<Body> {
    Response::new(Body::from("ok\n"))
}

/// `200 ready` or a 503 problem naming the failing dependency.
pub async fn readyz(health: &Health) -> Response<Body> {
    match health.ready().await {
        Ok(()) => Response::new(Body::from("ready\n")),
        Err(reason) => Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not-ready",
            "Not ready",
            reason,
        )
        .retry_after(Duration::from_secs(1))
        .into_response(),
    }
}

/// Answers `/healthz` and `/readyz` on the proxy listener before the pipeline (load balancers
/// probe the port they send traffic to); every other request goes to the inner service.
#[derive(Debug, Clone)]
pub struct HealthRoutesLayer {
    health: Arc<Health>,
}

/// The service of [`HealthRoutesLayer`].
#[derive(Debug, Clone)]
pub struct HealthRoutes<S> {
    inner: S,
    health: Arc<Health>,
}

impl HealthRoutesLayer {
    /// Health endpoints over `health`.
    pub fn new(health: Arc<Health>) -> Self {
        Self { health }
    }
}

impl<S> tower::Layer<S> for HealthRoutesLayer {
    type Service = HealthRoutes<S>;
    fn layer(&self, inner: S) -> Self::Service {
        HealthRoutes {
            inner,
            health: self.health.clone(),
        }
    }
}

impl<S> tower::Service<http::Request<Body>> for HealthRoutes<S>
where
    S: tower::Service<http::Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = futures_util::future::Either<
        futures_util::future::BoxFuture<'static, Result<Response<Body>, S::Error>>,
        S::Future,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        use futures_util::future::{Either, FutureExt};
        match request.uri().path() {
            "/healthz" => Either::Left(std::future::ready(Ok(healthz())).boxed()),
            "/readyz" => {
                let health = self.health.clone();
                Either::Left(async move { Ok(readyz(&health).await) }.boxed())
            }
            _ => Either::Right(self.inner.call(request)),
        }
    }
}

#[derive(Clone)]
struct OpsState {
    health: Arc<Health>,
    metrics: Option<PrometheusHandle>,
}

/// The admin listener's operations routes.
pub fn router(health: Arc<Health>, metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { healthz() }))
        .route(
            "/readyz",
            get(|State(s): State<OpsState>| async move { readyz(&s.health).await }),
        )
        .route(
            "/metrics",
            get(|State(s): State<OpsState>| async move {
                let text = s.metrics.as_ref().map(|m| m.render()).unwrap_or_default();
                Response::builder()
                    .header("content-type", "text/plain; version=0.0.4")
                    .body(Body::from(text))
                    .unwrap_or_else(|_| Response::new(Body::empty()))
            }),
        )
        .with_state(OpsState { health, metrics })
}
