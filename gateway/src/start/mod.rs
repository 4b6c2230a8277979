//! Starting and stopping the gateway ([`run`]): the stores opened, the upstreams and the
//! pipeline built, the background tasks spawned, both listeners served, then the drain and
//! an orderly stop. Each step is a function here; `run` reads as the sequence.

mod admin;
mod error;
mod reload;
mod stores;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

pub use error::StartError;
pub use reload::ConfigSource;
pub(crate) use stores::tenant_seeds;
use stores::Stores;

use crate::config::{Config, IdempotencyBackend, QueueBackend, StateBackend, UpstreamSettings};
use crate::edge::listener::ServeOptions;
use crate::pipeline::health::Health;
use crate::upstream::proxy::Upstream;
use crate::{banner, edge, pipeline, plumbing, stack, telemetry, tls, upstream};
use portcullis_idempotency::store::postgres::default_pool_size;
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
    // A successor started by a running gateway (`edge::listener::handover`) takes its
    // listening sockets first; a fresh start has none and binds its own.
    let mut inherited = edge::listener::handover::receive()?;
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
    let mut health =
        Health::new(stores.db.clone(), redis_clients).with_upstreams(upstreams.clone());
    if let IdempotencyBackend::Postgres(url) = &config.storage.idempotency {
        // The store connected with the same URL already, so it parses.
        health = health
            .with_postgres_idempotency(url)
            .map_err(|err| StartError::Database(err.into()))?;
    }
    let health = Arc::new(health);
    let demo = match config.demo.enabled {
        true => Some(bind(config.demo.listen, "demo.listen", &mut inherited).await?),
        false => None,
    };
    if let Some(demo) = &demo {
        let demo = clone_listener(demo).map_err(|source| StartError::Bind {
            addr: config.demo.listen,
            what: "demo.listen",
            source,
        })?;
        upstream::demo::serve(demo, stopped(&stop_rx));
    }
    let admin_upstreams = reload::LiveUpstreams::new(&config, &upstreams);
    let fleet = reload::spawn_fleet(&config, &upstreams)?;
    let directory = stores.directory.clone();
    tokio::spawn(directory.keep_fresh(stores.db.clone(), stopped(&stop_rx)));
    let deliveries = open_queue(&config).await?;
    if let Some(deliveries) = &deliveries {
        pipeline::deliveries::worker::spawn_sweeper(deliveries.clone(), stop_rx.clone());
    }
    let delivery_workers =
        reload::start_deliveries(&config, deliveries.as_ref(), &upstreams, &stores.directory);
    let parts = stack::StackParts {
        deliveries: deliveries.clone(),
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
        deliveries,
        workers: delivery_workers,
        proxy: service,
    });
    tokio::spawn(reloader.clone().watch(stopped(&stop_rx)));

    let listener = bind(config.server.listen, "server.listen", &mut inherited).await?;
    let admin_listener = bind(
        config.server.admin_listen,
        "server.admin_listen",
        &mut inherited,
    )
    .await?;
    // SIGUSR2: hand these sockets to a successor, then stop accepting and drain.
    let handed_over = edge::listener::handover::watch(
        &[Some(&listener), Some(&admin_listener), demo.as_ref()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>(),
    );
    drop(demo);
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

    // Handed over: the admin listener stops accepting at once too (the successor answers
    // `/readyz` on the same socket); on a plain shutdown it keeps saying "draining".
    let admin_stop = {
        let (stopped, handed) = (stopped(&stop_rx), handed_over.wait());
        async move {
            tokio::select! {
                () = stopped => {},
                () = handed => {},
            }
        }
    };
    let admin = tokio::spawn(admin::serve(
        admin_listener,
        reloader.admin_service(),
        admin_options,
        admin_stop,
    ));
    // Started: a predecessor that handed its sockets over stops accepting now.
    inherited.ready();
    let handed = handed_over.wait();
    let service = reloader.proxy_service();
    edge::listener::serve_workers(listener, service, options, workers, async move {
        tokio::select! {
            () = shutdown => tracing::info!("shutdown requested"),
            () = handed => tracing::info!("handed over to the successor; draining"),
        }
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

/// The queue of asynchronous routes (`storage.queue`), opened only when a route is
/// asynchronous.
async fn open_queue(
    config: &Config,
) -> Result<Option<Arc<pipeline::deliveries::Deliveries>>, StartError> {
    if !config.routes.iter().any(|r| r.delivery.is_some()) {
        return Ok(None);
    }
    // A PostgreSQL queue gets as many connections as the idempotency store
    // (`storage.postgres_pool_size`): with fewer than the requests in flight, an enqueue
    // waits for a connection rather than for the database.
    let mut options = portcullis_queue::ConnectOptions::default();
    if matches!(config.storage.queue, QueueBackend::Postgres(_)) {
        let size = config
            .storage
            .postgres_pool_size
            .map_or_else(default_pool_size, |n| n as usize);
        options.pool_size = u32::try_from(size).unwrap_or(u32::MAX);
    }
    let queue = portcullis_queue::connect(config.storage.queue_url.expose(), &options)
        .await
        .map_err(|source| StartError::Queue {
            url: format!("{:?}", config.storage.queue),
            source,
        })?;
    tracing::info!(engine = queue.engine(), "delivery queue open");
    Ok(Some(Arc::new(pipeline::deliveries::Deliveries::new(
        queue,
        &config.routes,
    ))))
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
        // RFC 8441 WebSockets over HTTP/2: advertised only where a route can take one.
        extended_connect: matches!(listener, Listener::Proxy)
            && config.routes.iter().any(|r| r.websocket.is_some()),
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

/// The listening socket for `addr`: the one a predecessor handed over, else a new one.
async fn bind(
    addr: SocketAddr,
    what: &'static str,
    inherited: &mut edge::listener::handover::Inherited,
) -> Result<tokio::net::TcpListener, StartError> {
    let bound = match inherited.take(addr) {
        Some(socket) => tokio::net::TcpListener::from_std(socket),
        None => tokio::net::TcpListener::bind(addr).await,
    };
    bound.map_err(|source| StartError::Bind { addr, what, source })
}

/// A second handle on a listening socket (the demo upstream serves one, the hand-over
/// passes the other).
fn clone_listener(listener: &tokio::net::TcpListener) -> std::io::Result<tokio::net::TcpListener> {
    use std::os::fd::AsFd;
    let socket = std::net::TcpListener::from(listener.as_fd().try_clone_to_owned()?);
    tokio::net::TcpListener::from_std(socket)
}
