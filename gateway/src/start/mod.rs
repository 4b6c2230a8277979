//! Starting and stopping the gateway ([`run`]): the stores opened, the upstreams and the
//! pipeline built, the background tasks spawned, both listeners served, then the drain and
//! an orderly stop. Each step is a function here; `run` reads as the sequence.

mod admin;
mod error;
mod reload;
mod stores;
mod swap;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use error::StartError;
pub use reload::ConfigSource;
pub(crate) use stores::tenant_seeds;
use stores::Stores;

use crate::config::{Config, IdempotencyBackend, StateBackend, UpstreamSettings};
use crate::edge::listener::ServeOptions;
use crate::pipeline::health::Health;
use crate::upstream::proxy::Upstream;
use crate::{banner, edge, plumbing, stack, telemetry, tls, upstream};
use portcullis_redis::{ConnectOptions, RedisClient};
use portcullis_retry::UpstreamState;

/// Starts everything the configuration asks for and serves until `shutdown` resolves; then
/// stops accepting, marks itself not ready, and drains within `server.shutdown_grace`.
/// Without a file to read again, a reload (SIGHUP, the admin endpoint) answers that there
/// is none: see [`run_with`].
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    run_with(config, None, shutdown).await
}

/// [`run`], with the file `config` was loaded from: it is read again on SIGHUP, on
/// `POST /admin/v1/config/reload`, and with `server.watch_config` when it changes
/// (`reload`).
pub async fn run_with(
    config: Config,
    source: Option<ConfigSource>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    for renamed in &config.renamed {
        tracing::warn!("configuration: {renamed}");
    }
    let metrics = telemetry::observe::install();
    telemetry::export::install(&config.telemetry)?;
    let stores = Stores::open(&config).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Before the upstreams: their pools are per worker.
    let workers = match config.server.worker_threads {
        0 => std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
        n => n,
    };
    plumbing::worker::set_count(workers);
    // Names resolved (and endpoint files read) before the first request; then kept current,
    // each upstream's tasks until a reload removes it or the gateway stops.
    let running = reload::start_upstreams(&config).await;
    let upstreams: Vec<Arc<Upstream>> = running.iter().map(|r| r.upstream().clone()).collect();

    let redis_clients = redis_health_clients(&config)?;
    let health =
        Arc::new(Health::new(stores.db.clone(), redis_clients).with_upstreams(upstreams.clone()));
    if config.demo.enabled {
        upstream::demo::serve(config.demo.listen, stopped(&stop_rx))
            .await
            .map_err(|source| StartError::Bind {
                addr: config.demo.listen,
                what: "demo.listen",
                source,
            })?;
    }
    let admin_upstreams = reload::LiveUpstreams::new(&config, &upstreams);
    let fleet = reload::spawn_fleet(&config, &upstreams)?;
    let directory = stores.directory.clone();
    tokio::spawn(directory.keep_fresh(stores.db.clone(), stopped(&stop_rx)));
    let parts = stack::StackParts {
        upstreams,
        directory: stores.directory.clone(),
        idempotency_store: stores.idempotency.clone(),
        limiter: stores.limiter.clone(),
        health: health.clone(),
    };
    let service = stack::build(&config, parts);
    // Both listeners serve through the reloader, which swaps in a reloaded configuration.
    let reloader = reload::Reloader::new(reload::Parts {
        source,
        config: config.clone(),
        stores: stores.clone(),
        health: health.clone(),
        metrics,
        upstreams: running,
        view: admin_upstreams,
        fleet,
        proxy: service,
    });
    tokio::spawn(reloader.clone().watch(stopped(&stop_rx)));

    let listener = bind(config.server.listen, "server.listen").await?;
    let admin_listener = bind(config.server.admin_listen, "server.admin_listen").await?;
    let options = serve_options(&config, Listener::Proxy)?;
    let admin_options = serve_options(&config, Listener::Admin)?;
    ensure_descriptors(options.max_connections + admin_options.max_connections);
    // Certificates reload on SIGHUP and on file change until the proxy listener has drained.
    let reloadable = [&config.server.tls, &config.server.admin_tls];
    tokio::spawn(tls::watch(
        reloadable.into_iter().flatten().cloned().collect(),
        stopped(&stop_rx),
    ));
    tracing::info!(listen = %config.server.listen, admin = %config.server.admin_listen, "portcullis listening");
    banner::print(&config);

    let admin = tokio::spawn(admin::serve(
        admin_listener,
        reloader.admin_service(),
        admin_options,
        stopped(&stop_rx),
    ));
    let service = reloader.proxy_service();
    edge::listener::serve_workers(listener, service, options, workers, async move {
        shutdown.await;
        tracing::info!("shutdown requested");
        health.start_draining();
    })
    .await;

    let _ = stop_tx.send(true);
    reloader.stop().await;
    let _ = admin.await;
    stores.close().await;
    // Queued spans are flushed (bounded by the exporter's timeout) on a blocking thread.
    let _ = tokio::task::spawn_blocking(telemetry::export::shutdown).await;
    tracing::info!("portcullis stopped");
    Ok(())
}

/// Resolves once `stop` says so (or its sender is gone): how every background task and
/// listener started by [`run`] learns that the gateway is stopping.
fn stopped(stop: &tokio::sync::watch::Receiver<bool>) -> impl Future<Output = ()> + Send + 'static {
    let mut stop = stop.clone();
    async move {
        let _ = stop.wait_for(|stop| *stop).await;
    }
}

/// The pool and the retry state (budget, breaker) of every configured upstream, indexed alike.
pub(crate) fn upstreams(config: &Config) -> Vec<Arc<Upstream>> {
    config
        .upstreams
        .iter()
        .map(|u| upstream_for(config, u))
        .collect()
}

/// One upstream's pool and retry state. What it reads (`u`, `discovery.hosts_file`,
/// `server.response_buffer_bytes`) is what `reload` compares to keep a running one.
pub(crate) fn upstream_for(config: &Config, u: &UpstreamSettings) -> Arc<Upstream> {
    let state = UpstreamState::new(
        u.name.as_str(),
        u.endpoints.len(),
        u.dedupes_idempotency_keys,
        u.budget,
        u.circuit_breaker,
    )
    .with_client_retry_window(u.client_retry_window);
    let state = Arc::new(match u.adaptive {
        Some(adaptive) => state.with_adaptive(adaptive),
        None => state,
    });
    let hosts_file = config.discovery.hosts_file.as_deref();
    let buffer = config.server.response_buffer_bytes;
    Arc::new(Upstream::new(u, hosts_file, state, buffer))
}

/// Open connections at most on the admin listener: apart from the proxy listener's cap, so
/// health checks and `/metrics` stay reachable when the proxy listener is full.
const ADMIN_MAX_CONNECTIONS: usize = 256;
/// File descriptors kept for everything but client connections (upstream pools, stores,
/// the database, logs).
const RESERVED_DESCRIPTORS: u64 = 1024;

/// The two listeners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listener {
    Proxy,
    Admin,
}

/// The Redis deployments readiness depends on (state and idempotency, each once). Does no
/// I/O: `/readyz` connects and pings, and on a cluster every master must answer.
fn redis_health_clients(
    config: &Config,
) -> Result<Vec<(&'static str, RedisClient)>, redis::RedisError> {
    let options = ConnectOptions::default();
    let mut clients = Vec::new();
    const STATE: &str = "storage.state";
    const IDEMPOTENCY: &str = "storage.idempotency";
    match &config.storage.state {
        StateBackend::Memory => {}
        StateBackend::Redis(url) => clients.push((STATE, RedisClient::single(url, &options)?)),
        StateBackend::RedisCluster(nodes) => {
            clients.push((STATE, RedisClient::cluster(nodes, &options)?))
        }
    }
    if IdempotencyBackend::from(&config.storage.state) != config.storage.idempotency {
        match &config.storage.idempotency {
            IdempotencyBackend::Redis(url) => {
                clients.push((IDEMPOTENCY, RedisClient::single(url, &options)?))
            }
            IdempotencyBackend::RedisCluster(nodes) => {
                clients.push((IDEMPOTENCY, RedisClient::cluster(nodes, &options)?))
            }
            IdempotencyBackend::Memory | IdempotencyBackend::Postgres(_) => {}
        }
    }
    Ok(clients)
}

/// Listener settings from `[server]`, terminating TLS when the listener's table is set.
fn serve_options(config: &Config, listener: Listener) -> Result<ServeOptions, StartError> {
    let (name, cert, what, max_connections) = match listener {
        Listener::Proxy => (
            "proxy",
            config.server.tls.as_ref(),
            "server.tls",
            config.server.max_connections,
        ),
        Listener::Admin => (
            "admin",
            config.server.admin_tls.as_ref(),
            "server.admin_tls",
            ADMIN_MAX_CONNECTIONS,
        ),
    };
    let tls = cert
        .map(|cert| tls::acceptor(cert.clone()))
        .transpose()
        .map_err(|source| StartError::Tls { what, source })?;
    Ok(ServeOptions {
        name,
        header_read_timeout: config.server.header_read_timeout,
        keep_alive_timeout: config.server.keep_alive_timeout,
        send_timeout: config.server.send_timeout,
        response_buffer_bytes: config.server.response_buffer_bytes,
        max_connections,
        max_header_bytes: config.server.max_header_bytes,
        shutdown_grace: config.server.shutdown_grace,
        h2c: config.server.h2c,
        http2: config.server.http2,
        tls,
    })
}

/// Raises the soft open-files limit toward the hard one when the connection caps need
/// more, and warns when even the hard limit is too low: past it, accepting fails and
/// connections beyond the cap are never reached.
fn ensure_descriptors(connections: usize) {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let needed = connections as u64 + RESERVED_DESCRIPTORS;
    let limit = getrlimit(Resource::Nofile);
    let current = limit.current.unwrap_or(u64::MAX);
    if current >= needed {
        return;
    }
    let target = limit.maximum.unwrap_or(u64::MAX).min(needed);
    let raised = rustix::process::Rlimit {
        current: Some(target),
        maximum: limit.maximum,
    };
    let now = if target > current && setrlimit(Resource::Nofile, raised).is_ok() {
        target
    } else {
        current
    };
    if now < needed {
        tracing::warn!(
            open_files = now,
            needed,
            "server.max_connections = {}: the open-files limit is too low for it; raise `ulimit -n` or lower the cap",
            connections.saturating_sub(ADMIN_MAX_CONNECTIONS)
        );
    }
}

async fn bind(addr: SocketAddr, what: &'static str) -> Result<tokio::net::TcpListener, StartError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, what, source })
}
