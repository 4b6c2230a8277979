//! Live reload of the whole configuration file ([`Reloader`]): on SIGHUP, on
//! `POST /admin/v1/config/reload`, and with `server.watch_config = true` when the file
//! changes (re-checked once a second, following a symlink swap as a Kubernetes ConfigMap
//! update does).
//!
//! The file is parsed and validated in full first (`Config::parse`); a bad file, or a change
//! to a field that only a restart can apply ([`RESTART_ONLY`]), is refused and nothing
//! changes. A good one builds a new pipeline and swaps it into both listeners at once
//! (`edge::listener::Swap`): a request runs wholly on the old or the new configuration. What carries over:
//! the stores (rate-limit buckets and quota counters, idempotency records, the database and
//! tenant directory), readiness state, and every upstream whose settings did not change
//! (the same `Upstream`: pools, breaker, outlier, adaptive and latency state, and its
//! balancing and health-check tasks). Changed and new upstreams are built afresh with their
//! tasks started; removed and replaced ones have their tasks stopped once the swap is done.
//! The delivery workers of asynchronous routes are started afresh for the new routes and
//! upstreams (the queue itself, `storage.queue`, stays open; leased messages finish on the
//! worker that leased them).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{header, StatusCode};
use metrics_exporter_prometheus::PrometheusHandle;
use portcullis_control::admin::{UpstreamStatus, UpstreamsView};
use portcullis_control::DbError;
use portcullis_problem::Problem;
use serde::Serialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::watch;

use super::stores::{tenant_seeds, Stores};
use super::{admin, stopped, upstream_for};
use crate::config::{Config, ConfigError, LogFormat, ProcessEnv, Secret, TenantSettings};
use crate::edge::listener::{HttpService, Swap};
use crate::pipeline::deliveries::worker::{self, WorkerParts};
use crate::pipeline::deliveries::Deliveries;
use crate::pipeline::health::Health;
use crate::plumbing::hangup::Hangup;
use crate::upstream::balance::status;
use crate::upstream::proxy::Upstream;
use crate::{pipeline, stack, upstream};

/// How often the file is checked with `server.watch_config = true`: one `stat` a second,
/// as the certificate files are (`tls::watch`).
const WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// The admin endpoint that reloads.
pub(crate) const RELOAD_PATH: &str = "/admin/v1/config/reload";

/// Where the running configuration came from, so it can be read again.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    path: PathBuf,
    log_format: Option<LogFormat>,
}

impl ConfigSource {
    /// The configuration file the gateway was started with.
    pub fn file(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            log_format: None,
        }
    }

    /// A log format that overrides the file's `server.log_format` (the `--log-format` flag),
    /// applied to every reloaded file too.
    pub fn with_log_format(mut self, format: LogFormat) -> Self {
        self.log_format = Some(format);
        self
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Why a field cannot change without a restart.
const LISTENER_ADDRESS: &str =
    "the listening socket is bound once at start-up; restart (or upgrade the binary) to move it";
const LISTENER: &str = "listener settings are fixed when the listener starts";
const WORKERS: &str = "the worker threads are started once";
const STORAGE: &str = "the stores are opened once (their state carries over a reload)";
const LIMITER: &str = "built into the rate limiter, whose state carries over a reload";
const LOGGING: &str = "the log output is set up once";
const TRACING: &str = "the trace exporter is installed once";
const CERT_PATHS: &str = "certificates reload by themselves when their files change; a new path, or turning TLS on or off, needs a restart";
const DEMO: &str = "the demo upstream is started once";
const QUEUE: &str = "storage.queue is opened at start-up only when some route is asynchronous; restart to add the first asynchronous route";

/// A field of the running configuration that only a restart can change.
struct Fixed {
    field: &'static str,
    value: fn(&Config) -> String,
    reason: &'static str,
}

macro_rules! fixed {
    ($field:literal, $reason:expr, $c:ident => $value:expr) => {
        Fixed {
            field: $field,
            value: |$c: &Config| format!("{:?}", $value),
            reason: $reason,
        }
    };
}

/// Every field a reload refuses to change, with the reason (`docs/operations.md` lists them).
const RESTART_ONLY: &[Fixed] = &[
    fixed!("server.listen", LISTENER_ADDRESS, c => c.server.listen),
    fixed!("server.admin_listen", LISTENER_ADDRESS, c => c.server.admin_listen),
    fixed!("server.worker_threads", WORKERS, c => c.server.worker_threads),
    fixed!("server.max_connections", LISTENER, c => c.server.max_connections),
    fixed!("server.max_header_bytes", LISTENER, c => c.server.max_header_bytes),
    fixed!("server.response_buffer_bytes", LISTENER, c => c.server.response_buffer_bytes),
    fixed!("server.header_read_timeout", LISTENER, c => c.server.header_read_timeout),
    fixed!("server.keep_alive_timeout", LISTENER, c => c.server.keep_alive_timeout),
    fixed!("server.send_timeout", LISTENER, c => c.server.send_timeout),
    fixed!("server.shutdown_grace", LISTENER, c => c.server.shutdown_grace),
    fixed!("server.h2c", LISTENER, c => c.server.h2c),
    fixed!("server.http2", LISTENER, c => c.server.http2),
    fixed!("server.tls", CERT_PATHS, c => c.server.tls),
    fixed!("server.admin_tls", CERT_PATHS, c => c.server.admin_tls),
    fixed!("server.log_format", LOGGING, c => c.server.log_format),
    fixed!("storage.state", STORAGE, c => c.storage.state),
    fixed!("storage.idempotency", STORAGE, c => c.storage.idempotency),
    fixed!("storage.database", STORAGE, c => c.storage.database),
    fixed!("storage.memory_max_bytes", STORAGE, c => c.storage.memory_max_bytes),
    fixed!("storage.memory_shares", STORAGE, c => c.storage.memory_shares),
    fixed!("storage.state_timeout", STORAGE, c => c.storage.state_timeout),
    fixed!("storage.postgres_pool_size", STORAGE, c => c.storage.postgres_pool_size),
    fixed!("storage.queue", STORAGE, c => c.storage.queue),
    fixed!("rate_limit.on_store_error", LIMITER, c => c.rate_limit.on_store_error),
    fixed!("rate_limit.replicas", LIMITER, c => c.rate_limit.replicas),
    fixed!("rate_limit.sync", LIMITER, c => c.rate_limit.sync),
    fixed!("telemetry.otlp_endpoint", TRACING, c => c.telemetry.otlp_endpoint),
    fixed!("telemetry.sampling_ratio", TRACING, c => c.telemetry.sampling_ratio),
    fixed!("telemetry.service_name", TRACING, c => c.telemetry.service_name),
    fixed!("demo", DEMO, c => (c.demo.enabled, c.demo.listen)),
];

/// The first restart-only field that differs between `running` and `next`.
fn needs_restart(running: &Config, next: &Config) -> Result<(), ReloadError> {
    match RESTART_ONLY
        .iter()
        .find(|f| (f.value)(running) != (f.value)(next))
    {
        Some(fixed) => Err(ReloadError::NeedsRestart {
            field: fixed.field.to_owned(),
            reason: fixed.reason,
        }),
        None => Ok(()),
    }
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    /// Started without `--config`.
    #[error("no configuration file to reload: the gateway runs on the embedded default; start it with --config FILE")]
    NoFile,
    /// The file does not parse or validate.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// A field that only a restart can change.
    #[error("{field}: cannot change without a restart: {reason}")]
    NeedsRestart { field: String, reason: &'static str },
    /// The file's tenants could not be written to the database.
    #[error("tenants: {0}")]
    Tenants(#[source] DbError),
}

impl ReloadError {
    /// The configuration fields the failure names.
    fn fields(&self) -> Vec<String> {
        match self {
            Self::NoFile => Vec::new(),
            Self::Invalid(err) => err.paths(),
            Self::NeedsRestart { field, .. } => vec![field.clone()],
            Self::Tenants(_) => vec!["tenants".to_owned()],
        }
    }

    fn problem(&self) -> Problem {
        let problem = match self {
            // The gateway runs, but there is nothing this request could reload.
            Self::NoFile => Problem::new(
                StatusCode::CONFLICT,
                "config-no-file",
                "No configuration file to reload",
                self.to_string(),
            ),
            Self::Invalid(_) | Self::Tenants(DbError::KeyConflict { .. }) => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "config-invalid",
                "Configuration refused; the running one stays",
                self.to_string(),
            ),
            Self::NeedsRestart { reason, .. } => Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "config-needs-restart",
                "Configuration change needs a restart; the running one stays",
                self.to_string(),
            )
            .with("reason", *reason),
            Self::Tenants(_) => Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "config-reload-failed",
                "Configuration not applied; the running one stays",
                self.to_string(),
            ),
        };
        let fields = self.fields();
        match fields.first() {
            Some(first) => problem.with("field", first.clone()).with("fields", fields),
            None => problem,
        }
    }
}

/// What set a reload off (log field).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Trigger {
    Signal,
    File,
    Admin,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Self::Signal => "SIGHUP",
            Self::File => "file change",
            Self::Admin => "admin API",
        }
    }
}

/// The endpoint's 200 body: what the reload changed.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Summary {
    /// `false`: the file is the one already running; nothing was rebuilt.
    changed: bool,
    /// Configurations applied since start-up (0: the one started with).
    generation: u64,
    routes: Changes,
    upstreams: Changes,
    /// The file's tenants were written to the database and the directory reloaded.
    tenants_changed: bool,
}

/// Names added, removed, changed (rebuilt) and kept as they were.
#[derive(Debug, Default, Serialize)]
struct Changes {
    added: Vec<String>,
    removed: Vec<String>,
    changed: Vec<String>,
    kept: Vec<String>,
}

/// An upstream in service with the stop signal of its background tasks.
pub(crate) struct Running {
    name: String,
    /// Its settings and everything else `Upstream::new` reads, as compared across reloads.
    fingerprint: String,
    upstream: Arc<Upstream>,
    stop: watch::Sender<bool>,
}

impl Running {
    pub(crate) fn upstream(&self) -> &Arc<Upstream> {
        &self.upstream
    }

    /// Builds `settings`' upstream and starts its balancing and health-check tasks (the
    /// first resolution is done before it serves).
    async fn start(config: &Config, index: usize) -> Option<Self> {
        let settings = config.upstreams.get(index)?;
        let upstream = upstream_for(config, settings);
        let (stop, stop_rx) = watch::channel(false);
        upstream::balance::start(std::slice::from_ref(&upstream), &stop_rx).await;
        Some(Self {
            name: settings.name.clone(),
            fingerprint: fingerprint(config, index),
            upstream,
            stop,
        })
    }
}

/// Everything that decides an upstream's `Upstream` (`start::upstream_for`): equal
/// fingerprints keep the running one.
fn fingerprint(config: &Config, index: usize) -> String {
    format!(
        "{:?}|{:?}|{}",
        config.upstreams.get(index),
        config.discovery.hosts_file,
        config.server.response_buffer_bytes
    )
}

/// Starts every configured upstream, each with its own stop signal.
pub(crate) async fn start_upstreams(config: &Config) -> Vec<Running> {
    let mut running = Vec::with_capacity(config.upstreams.len());
    for index in 0..config.upstreams.len() {
        if let Some(started) = Running::start(config, index).await {
            running.push(started);
        }
    }
    running
}

/// The fleet task of adaptive upstreams (`upstream::fleet`), with its own stop signal.
pub(crate) fn spawn_fleet(
    config: &Config,
    upstreams: &[Arc<Upstream>],
) -> Result<watch::Sender<bool>, redis::RedisError> {
    let (stop, stop_rx) = watch::channel(false);
    upstream::fleet::spawn(config, upstreams, stopped(&stop_rx))?;
    Ok(stop)
}

/// The admin API's view of the upstreams, replaced by each reload.
pub(crate) struct LiveUpstreams(ArcSwap<status::Upstreams>);

impl LiveUpstreams {
    pub(crate) fn new(config: &Config, upstreams: &[Arc<Upstream>]) -> Arc<Self> {
        Arc::new(Self(ArcSwap::from_pointee(Self::of(config, upstreams))))
    }

    fn set(&self, config: &Config, upstreams: &[Arc<Upstream>]) {
        self.0.store(Arc::new(Self::of(config, upstreams)));
    }

    fn of(config: &Config, upstreams: &[Arc<Upstream>]) -> status::Upstreams {
        status::Upstreams(
            upstreams
                .iter()
                .zip(&config.upstreams)
                .map(|(u, settings)| (u.clone(), settings.retry.clone()))
                .collect(),
        )
    }
}

impl UpstreamsView for LiveUpstreams {
    fn upstreams(&self) -> Vec<UpstreamStatus> {
        self.0.load().upstreams()
    }
}

/// The configuration in force and what was started for it.
struct Live {
    config: Config,
    /// The file's text last applied (`None`: the one started with).
    text: Option<String>,
    upstreams: Vec<Running>,
    fleet: watch::Sender<bool>,
    /// The asynchronous routes' deliveries and the stop of their workers.
    deliveries: Option<Arc<Deliveries>>,
    workers: watch::Sender<bool>,
    generation: u64,
}

/// What start-up hands over to the reloader.
pub(crate) struct Parts {
    pub(crate) source: Option<ConfigSource>,
    pub(crate) config: Config,
    pub(crate) stores: Stores,
    pub(crate) health: Arc<Health>,
    pub(crate) metrics: Option<PrometheusHandle>,
    pub(crate) upstreams: Vec<Running>,
    pub(crate) view: Arc<LiveUpstreams>,
    pub(crate) fleet: watch::Sender<bool>,
    /// The asynchronous routes' deliveries (`None`: no queue open) and their workers.
    pub(crate) deliveries: Option<Arc<Deliveries>>,
    pub(crate) workers: watch::Sender<bool>,
    /// The proxy listener's first pipeline.
    pub(crate) proxy: HttpService,
}

/// Reloads the configuration; owns the listeners' [`Swap`]s.
pub(crate) struct Reloader {
    source: Option<ConfigSource>,
    stores: Stores,
    health: Arc<Health>,
    metrics: Option<PrometheusHandle>,
    view: Arc<LiveUpstreams>,
    proxy: Arc<Swap>,
    admin: Arc<Swap>,
    /// `storage.queue`, when it was opened at start-up.
    queue: Option<Arc<dyn portcullis_queue::Queue>>,
    /// `server.watch_config` of the configuration in force.
    watching: AtomicBool,
    applied: AtomicU64,
    live: tokio::sync::Mutex<Live>,
    /// The admin endpoint refers back to the reloader weakly (no reference cycle).
    me: Weak<Self>,
}

impl Reloader {
    pub(crate) fn new(parts: Parts) -> Arc<Self> {
        // Both results visible from the first scrape.
        for result in ["applied", "rejected"] {
            metrics::counter!("config_reloads_total", "result" => result).increment(0);
        }
        Arc::new_cyclic(|reloader: &Weak<Self>| {
            let admin = admin_service(
                &parts.config,
                &parts.stores,
                &parts.health,
                parts.metrics.clone(),
                parts.view.clone(),
                parts.deliveries.as_ref(),
                reloader.clone(),
            );
            Self {
                queue: parts.deliveries.as_ref().map(|d| d.queue.clone()),
                source: parts.source,
                watching: AtomicBool::new(parts.config.server.watch_config),
                stores: parts.stores,
                health: parts.health,
                metrics: parts.metrics,
                view: parts.view,
                proxy: Swap::new(parts.proxy),
                admin: Swap::new(admin),
                applied: AtomicU64::new(0),
                live: tokio::sync::Mutex::new(Live {
                    config: parts.config,
                    text: None,
                    upstreams: parts.upstreams,
                    fleet: parts.fleet,
                    deliveries: parts.deliveries,
                    workers: parts.workers,
                    generation: 0,
                }),
                me: reloader.clone(),
            }
        })
    }

    /// The proxy listener's pipeline.
    pub(crate) fn proxy_service(&self) -> Arc<Swap> {
        self.proxy.clone()
    }

    /// The admin listener's service.
    pub(crate) fn admin_service(&self) -> Arc<Swap> {
        self.admin.clone()
    }

    /// Stops every upstream's and the fleet's background tasks (after the drain).
    pub(crate) async fn stop(&self) {
        let live = self.live.lock().await;
        for running in &live.upstreams {
            let _ = running.stop.send(true);
        }
        let _ = live.fleet.send(true);
        let _ = live.workers.send(true);
    }

    /// Reloads, logs the outcome and counts it in `config_reloads_total{result}`.
    pub(crate) async fn reload(&self, trigger: Trigger) -> Result<Summary, ReloadError> {
        let result = self.try_reload(trigger).await;
        match &result {
            Ok(summary) => {
                metrics::counter!("config_reloads_total", "result" => "applied").increment(1);
                tracing::info!(
                    trigger = trigger.as_str(),
                    changed = summary.changed,
                    generation = summary.generation,
                    routes_added = ?summary.routes.added,
                    routes_removed = ?summary.routes.removed,
                    upstreams_rebuilt = ?(&summary.upstreams.added, &summary.upstreams.changed),
                    upstreams_removed = ?summary.upstreams.removed,
                    tenants_changed = summary.tenants_changed,
                    "configuration reloaded"
                );
            }
            Err(err) => {
                metrics::counter!("config_reloads_total", "result" => "rejected").increment(1);
                tracing::error!(
                    trigger = trigger.as_str(),
                    field = err.fields().first().map(String::as_str).unwrap_or(""),
                    error = %err,
                    "configuration reload refused; the running configuration stays"
                );
            }
        }
        result
    }

    async fn try_reload(&self, trigger: Trigger) -> Result<Summary, ReloadError> {
        let source = self.source.as_ref().ok_or(ReloadError::NoFile)?;
        // One reload at a time; the file is read under the lock, so the last one wins.
        let mut live = self.live.lock().await;
        let text =
            std::fs::read_to_string(&source.path).map_err(|source_err| ConfigError::Read {
                path: source.path.display().to_string(),
                source: source_err,
            })?;
        if live.text.as_deref() == Some(text.as_str()) {
            return Ok(Summary {
                generation: live.generation,
                ..Summary::default()
            });
        }
        let mut config = Config::parse(&text, &ProcessEnv)?;
        if let Some(format) = source.log_format {
            config.server.log_format = format;
        }
        needs_restart(&live.config, &config)?;
        // Named by the first asynchronous route's place in the file.
        let first_async = config.routes.iter().position(|r| r.delivery.is_some());
        if let (None, Some(index)) = (&self.queue, first_async) {
            return Err(ReloadError::NeedsRestart {
                field: format!("routes[{index}].delivery"),
                reason: QUEUE,
            });
        }
        // Same paths (checked above): the running certificates stay, with their own reload.
        config.server.tls = live.config.server.tls.clone();
        config.server.admin_tls = live.config.server.admin_tls.clone();
        for renamed in &config.renamed {
            tracing::warn!(trigger = trigger.as_str(), "configuration: {renamed}");
        }

        // The only step that can fail once the file is accepted, so it goes first.
        let tenants_changed = !same_tenants(&live.config.tenants, &config.tenants);
        if tenants_changed {
            let db = &self.stores.db;
            db.upsert_tenants(&tenant_seeds(&config.tenants))
                .await
                .map_err(ReloadError::Tenants)?;
            if let Err(err) = self.stores.directory.reload(db).await {
                tracing::warn!(%err, "tenant directory reload after a configuration reload failed; the poll will catch up");
            }
        }

        let mut summary = Summary {
            changed: true,
            tenants_changed,
            routes: route_changes(&live.config, &config),
            ..Summary::default()
        };
        let mut previous: Vec<Option<Running>> = std::mem::take(&mut live.upstreams)
            .into_iter()
            .map(Some)
            .collect();
        let mut next = Vec::with_capacity(config.upstreams.len());
        for (index, settings) in config.upstreams.iter().enumerate() {
            let fingerprint = fingerprint(&config, index);
            let same_name = previous
                .iter_mut()
                .find(|r| r.as_ref().is_some_and(|r| r.name == settings.name));
            match same_name {
                Some(slot) if slot.as_ref().is_some_and(|r| r.fingerprint == fingerprint) => {
                    if let Some(kept) = slot.take() {
                        summary.upstreams.kept.push(kept.name.clone());
                        next.push(kept);
                    }
                }
                found => {
                    let list = if found.is_some() {
                        &mut summary.upstreams.changed
                    } else {
                        &mut summary.upstreams.added
                    };
                    list.push(settings.name.clone());
                    if let Some(started) = Running::start(&config, index).await {
                        next.push(started);
                    }
                }
            }
        }
        let upstreams: Vec<Arc<Upstream>> = next.iter().map(|r| r.upstream.clone()).collect();
        let deliveries = self
            .queue
            .as_ref()
            .map(|queue| Arc::new(Deliveries::new(queue.clone(), &config.routes)));
        let parts = stack::StackParts {
            deliveries: deliveries.clone(),
            upstreams: upstreams.clone(),
            limiter: self.stores.limiter.clone(),
            idempotency_store: self.stores.idempotency.clone(),
            directory: self.stores.directory.clone(),
            health: self.health.clone(),
        };
        // The swap: new requests on both listeners run on the new configuration from here.
        self.proxy.replace(stack::build(&config, parts));
        self.health.set_upstreams(upstreams.clone());
        self.view.set(&config, &upstreams);
        if admin_differs(&live.config, &config) {
            self.admin.replace(admin_service(
                &config,
                &self.stores,
                &self.health,
                self.metrics.clone(),
                self.view.clone(),
                deliveries.as_ref(),
                self.me.clone(),
            ));
        }
        // The old routes' workers stop leasing; the new ones deliver through the new
        // upstreams.
        let workers = start_deliveries(
            &config,
            deliveries.as_ref(),
            &upstreams,
            &self.stores.directory,
        );
        let _ = std::mem::replace(&mut live.workers, workers).send(true);
        live.deliveries = deliveries;

        // Tasks of the upstreams no longer in service stop; their pools go with the last
        // request still using them.
        let mut rebuilt = !summary.upstreams.added.is_empty();
        for gone in previous.into_iter().flatten() {
            rebuilt = true;
            if !summary.upstreams.changed.contains(&gone.name) {
                summary.upstreams.removed.push(gone.name.clone());
            }
            let _ = gone.stop.send(true);
        }
        if rebuilt {
            match spawn_fleet(&config, &upstreams) {
                Ok(fleet) => {
                    let _ = std::mem::replace(&mut live.fleet, fleet).send(true);
                }
                Err(err) => {
                    tracing::error!(%err, "adaptive concurrency sync not restarted after the reload")
                }
            }
        }
        self.watching
            .store(config.server.watch_config, Ordering::Relaxed);
        live.generation = self.applied.fetch_add(1, Ordering::Relaxed) + 1;
        summary.generation = live.generation;
        live.config = config;
        live.text = Some(text);
        live.upstreams = next;
        Ok(summary)
    }

    /// Reloads on SIGHUP and, with `server.watch_config`, when the file changes, until
    /// `stop` resolves.
    pub(crate) async fn watch(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        let mut hangup = Hangup::install("the configuration reloads through the admin API only");
        let mut poll = tokio::time::interval(WATCH_INTERVAL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let path = self.source.as_ref().map(|s| s.path.clone());
        let mut seen = path.as_deref().map(signature);
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = hangup.received() => {
                    if self.source.is_none() {
                        tracing::info!("SIGHUP: running on the embedded default configuration; no file to reload");
                        continue;
                    }
                    let _ = self.reload(Trigger::Signal).await;
                }
                _ = poll.tick(), if path.is_some() => {
                    let Some(path) = path.as_deref() else { continue };
                    let now = signature(path);
                    if seen.as_ref() == Some(&now) {
                        continue;
                    }
                    seen = Some(now);
                    if self.watching.load(Ordering::Relaxed) {
                        let _ = self.reload(Trigger::File).await;
                    }
                }
            }
        }
    }
}

/// What tells a changed file: where the path resolves to (a ConfigMap's symlink swap
/// changes it), and the target's size and modification time.
#[derive(Debug, PartialEq, Eq)]
struct Signature(Option<PathBuf>, Option<(u64, SystemTime)>);

fn signature(path: &Path) -> Signature {
    Signature(
        std::fs::canonicalize(path).ok(),
        std::fs::metadata(path)
            .ok()
            .and_then(|m| Some((m.len(), m.modified().ok()?))),
    )
}

/// Tenants equal in everything the database and the pipeline read.
fn same_tenants(a: &[TenantSettings], b: &[TenantSettings]) -> bool {
    let key = |t: &TenantSettings| {
        (
            t.id.clone(),
            t.api_keys.clone(),
            t.bucket,
            t.daily_quota,
            t.monthly_quota,
            t.concurrency_limit,
            t.max_websockets,
        )
    };
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| key(a) == key(b))
}

/// Route names added, removed and changed.
fn route_changes(running: &Config, next: &Config) -> Changes {
    let mut changes = Changes::default();
    for route in &next.routes {
        match running.routes.iter().find(|r| r.name == route.name) {
            None => changes.added.push(route.name.clone()),
            Some(old) if format!("{old:?}") != format!("{route:?}") => {
                changes.changed.push(route.name.clone())
            }
            Some(_) => changes.kept.push(route.name.clone()),
        }
    }
    for route in &running.routes {
        if !next.routes.iter().any(|r| r.name == route.name) {
            changes.removed.push(route.name.clone());
        }
    }
    changes
}

/// Starts a delivery worker for every asynchronous route of `config`, sending through
/// `upstreams`; they stop when the returned sender says so (a reload, or the gateway
/// stopping).
pub(crate) fn start_deliveries(
    config: &Config,
    deliveries: Option<&Arc<Deliveries>>,
    upstreams: &[Arc<Upstream>],
    directory: &Arc<portcullis_control::Directory>,
) -> watch::Sender<bool> {
    let (stop, stopped) = watch::channel(false);
    if let Some(deliveries) = deliveries {
        let states: Vec<_> = upstreams.iter().map(|u| u.state().clone()).collect();
        let table = pipeline::router::RouteTable::new(&config.routes, &states);
        let parts = WorkerParts {
            deliveries: deliveries.clone(),
            service: stack::delivery(upstreams.to_vec()),
            directory: directory.clone(),
            clock: Arc::new(portcullis_retry::SystemWallClock),
        };
        worker::spawn(table.routes(), &parts, &stopped);
    }
    stop
}

/// The admin API reads the token and the routes' names and costs when it is built.
fn admin_differs(running: &Config, next: &Config) -> bool {
    let routes = |c: &Config| -> Vec<(String, u32)> {
        c.routes.iter().map(|r| (r.name.clone(), r.cost)).collect()
    };
    running.admin_token != next.admin_token || routes(running) != routes(next)
}

/// The admin listener's service: operations routes, the admin API and console when a token
/// is set, and then also the reload endpoint.
fn admin_service(
    config: &Config,
    stores: &Stores,
    health: &Arc<Health>,
    metrics: Option<PrometheusHandle>,
    view: Arc<LiveUpstreams>,
    deliveries: Option<&Arc<Deliveries>>,
    reloader: Weak<Reloader>,
) -> HttpService {
    let ops = pipeline::health::router(health.clone(), metrics);
    let app = admin::router(config, stores, view, ops, deliveries);
    let app = match &config.admin_token {
        Some(token) => app.layer(axum::middleware::from_fn_with_state(
            Arc::new(Endpoint::new(token, reloader)),
            endpoint,
        )),
        None => app,
    };
    admin::service(app)
}

/// `POST /admin/v1/config/reload`, behind the admin token.
struct Endpoint {
    /// SHA-256 of the token, compared in constant time (as the admin API does).
    token: [u8; 32],
    reloader: Weak<Reloader>,
}

impl Endpoint {
    fn new(token: &Secret, reloader: Weak<Reloader>) -> Self {
        Self {
            token: Sha256::digest(token.expose().as_bytes()).into(),
            reloader,
        }
    }

    fn authorized(&self, request: &Request) -> bool {
        let Some(presented) = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, token)| token.trim())
        else {
            return false;
        };
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        digest.ct_eq(&self.token).into()
    }
}

async fn endpoint(State(endpoint): State<Arc<Endpoint>>, request: Request, next: Next) -> Response {
    if request.uri().path() != RELOAD_PATH {
        return next.run(request).await;
    }
    if !endpoint.authorized(&request) {
        metrics::counter!("admin_auth_failures_total").increment(1);
        tracing::warn!(
            path = RELOAD_PATH,
            "admin request refused: missing or invalid token"
        );
        return Problem::new(
            StatusCode::UNAUTHORIZED,
            "admin-unauthorized",
            "Admin token required",
            "send the admin token (PORTCULLIS_ADMIN_TOKEN) as Authorization: Bearer <token>",
        )
        .into_response();
    }
    if request.method() != http::Method::POST {
        let mut response = Problem::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "Method not allowed",
            "the configuration reload is POST /admin/v1/config/reload",
        )
        .into_response();
        response
            .headers_mut()
            .insert(header::ALLOW, http::HeaderValue::from_static("POST"));
        return response;
    }
    let Some(reloader) = endpoint.reloader.upgrade() else {
        return Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting-down",
            "Shutting down",
            "the gateway is stopping",
        )
        .into_response();
    };
    match reloader.reload(Trigger::Admin).await {
        Ok(summary) => axum::Json(summary).into_response(),
        Err(err) => err.problem().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Config {
        Config::parse(text, &ProcessEnv).unwrap()
    }

    const BASE: &str = r#"
[server]
worker_threads = 1

[[upstreams]]
name = "a"
endpoints = ["http://127.0.0.1:9"]

[[routes]]
prefix = "/"
upstream = "a"
"#;

    #[test]
    fn restart_only_fields_are_named_with_their_reason() {
        let running = parse(BASE);
        let next = parse(&BASE.replace("worker_threads = 1", "worker_threads = 2"));
        let err = needs_restart(&running, &next).unwrap_err();
        assert_eq!(err.fields(), ["server.worker_threads"]);
        assert!(err.to_string().contains("restart"), "{err}");
        let next = parse(&BASE.replace("[server]", "[server]\nlisten = \"127.0.0.1:18080\""));
        assert_eq!(
            needs_restart(&running, &next).unwrap_err().fields(),
            ["server.listen"]
        );
        // Routes, upstreams and watch_config are not restart-only.
        let next = parse(
            &BASE
                .replace("127.0.0.1:9", "127.0.0.1:10")
                .replace("[server]", "[server]\nwatch_config = true"),
        );
        assert!(needs_restart(&running, &next).is_ok());
    }

    #[test]
    fn without_a_file_a_reload_is_a_conflict_and_a_bad_file_unprocessable() {
        assert_eq!(ReloadError::NoFile.problem().status(), StatusCode::CONFLICT);
        let bad = BASE.replace("upstream = \"a\"", "upstream = \"b\"");
        let err = ReloadError::from(Config::parse(&bad, &ProcessEnv).unwrap_err());
        assert_eq!(err.fields(), ["routes[0].upstream"]);
        assert_eq!(err.problem().status(), StatusCode::UNPROCESSABLE_ENTITY);
    }

    #[test]
    fn an_upstream_is_kept_only_when_nothing_it_is_built_from_changed() {
        let running = parse(BASE);
        assert_eq!(fingerprint(&running, 0), fingerprint(&parse(BASE), 0));
        let moved = parse(&BASE.replace("127.0.0.1:9", "127.0.0.1:10"));
        assert_ne!(fingerprint(&running, 0), fingerprint(&moved, 0));
    }
}
