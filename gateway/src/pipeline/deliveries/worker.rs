//! The delivery worker of one asynchronous route: leases due messages of the route's queue
//! and sends each through the stack's delivery service — the same retry layer (breaker,
//! adaptive throttling, budget, attempt timeout) and pooled upstream client (outlier
//! ejection) as synchronous traffic, assembled in `crate::stack` — then records the
//! outcome with the lease's fencing token.
//!
//! - Pace: at most `delivery.max_in_flight` deliveries at once, and with `delivery.max_rate`
//!   starts spaced `1 / max_rate` apart, so a backlog never floods a recovering upstream.
//!   A paced worker leases one message at a time, when it may start: a lease never runs out
//!   while its message waits for its turn.
//! - Every attempt carries `Idempotency-Key: delivery-<id>` (the same on every attempt and
//!   after a redelivery) and `Portcullis-Delivery-Id`.
//! - Classification as for synchronous calls: 2xx delivered; 4xx other than 408 and 429 dead
//!   at once with the reason; anything else (and the gateway's own 502/503/504 for an
//!   upstream that failed, timed out or whose breaker is open) retried on the route's
//!   schedule (`portcullis_retry::DeliverySchedule`) with `Retry-After` as a floor, or dead
//!   past `max_retries` or `max_age`.
//! - One log line per attempt (correlation id, dependency, attempt, max_attempts,
//!   backoff_ms, error_type, idempotency key; no body, no credential) and an error line per
//!   dead letter; metrics `deliveries_attempted_total`, `deliveries_succeeded_total`,
//!   `dlq_messages_total` (by `queue`), and the `delivery_queue_depth` and
//!   `delivery_queue_oldest_age_seconds` gauges.
//! - With `delivery.alert_webhook`, each dead letter is also announced there
//!   ([`super::alert`]), in the background.

use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::body::Body;
use http::{HeaderName, HeaderValue, Request, Response};
use portcullis_control::Directory;
use portcullis_problem::clock::WallClock;
use portcullis_queue::{Attempt, AttemptOutcome, Leased};
use portcullis_retry::{DeadReason, NextDelivery};
use tokio::sync::{watch, Semaphore};
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::ServiceExt;

use super::alert::{Alerter, DeadLetterAlert};
use super::{Deliveries, PORTCULLIS_DELIVERY_ID, STORED_CLIENT};
use crate::config::DeliverySettings;
use crate::plumbing::client::Client;
use crate::plumbing::context::{Caller, RequestContext};
use crate::plumbing::route::Route;

/// The retry layer and upstream client deliveries go through (see `crate::stack`).
pub(crate) type DeliveryService = BoxCloneSyncService<Request<Body>, Response<Body>, Infallible>;

/// How often an idle worker looks for due messages (an accepted request wakes it sooner).
const POLL: Duration = Duration::from_millis(100);

/// Pause after the queue failed a lease.
const ERROR_PAUSE: Duration = Duration::from_secs(1);

/// Lease beyond the route's total retry time: the attempt's result must be recorded within it.
const LEASE_MARGIN: Duration = Duration::from_secs(2);

/// How often the queue's gauges are read.
const STATS_EVERY: Duration = Duration::from_secs(5);

/// Everything a worker needs.
#[derive(Clone)]
pub(crate) struct WorkerParts {
    pub(crate) deliveries: Arc<Deliveries>,
    pub(crate) service: DeliveryService,
    pub(crate) directory: Arc<Directory>,
    pub(crate) clock: Arc<dyn WallClock>,
}

/// How often delivered messages past their retention (and expired dedupe records) are
/// removed, and how many at most each time.
const SWEEP_EVERY: Duration = Duration::from_secs(60);
const SWEEP_BATCH: usize = 1000;

/// Spawns the sweeper: every minute, one bounded batch of delivered messages older than
/// `portcullis_queue::DEFAULT_RETENTION` and of expired dedupe records is removed.
pub(crate) fn spawn_sweeper(deliveries: Arc<Deliveries>, mut stop: watch::Receiver<bool>) {
    tokio::spawn(async move {
        while !*stop.borrow() {
            pause(SWEEP_EVERY, &mut stop).await;
            let sweep = deliveries
                .queue
                .sweep(portcullis_queue::DEFAULT_RETENTION, SWEEP_BATCH);
            match sweep.await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(removed = n, "delivery queue swept"),
                Err(err) => tracing::warn!(error = %err, "delivery queue sweep failed"),
            }
        }
    });
}

/// Spawns one worker per asynchronous route in `routes`; each stops when `stop` says so.
pub(crate) fn spawn(routes: &[Arc<Route>], parts: &WorkerParts, stop: &watch::Receiver<bool>) {
    for route in routes {
        let Some(delivery) = route.settings.delivery.clone() else {
            continue;
        };
        let queue = route.settings.name.clone();
        for name in [
            "deliveries_attempted_total",
            "deliveries_succeeded_total",
            "dlq_messages_total",
        ] {
            metrics::counter!(name, "queue" => queue.clone()).increment(0);
        }
        let alerter = delivery.alert.clone().map(|webhook| {
            super::alert::register(&queue);
            Alerter::new(webhook)
        });
        let worker = Worker {
            route: route.clone(),
            delivery,
            parts: parts.clone(),
            alerter,
        };
        tokio::spawn(worker.run(stop.clone()));
    }
}

struct Worker {
    route: Arc<Route>,
    delivery: Arc<DeliverySettings>,
    parts: WorkerParts,
    alerter: Option<Alerter>,
}

impl Worker {
    fn queue(&self) -> &str {
        &self.route.settings.name
    }

    async fn run(self, mut stop: watch::Receiver<bool>) {
        let this = Arc::new(self);
        let permits = Arc::new(Semaphore::new(this.delivery.max_in_flight as usize));
        let lease_for = this.route.retry.policy.total() + LEASE_MARGIN;
        let spacing = this
            .delivery
            .max_rate
            .map(|rate| Duration::from_secs_f64(1.0 / rate));
        let wakeup = this.parts.deliveries.wakeup(this.queue());
        let mut next_start = Instant::now();
        let mut next_stats = Instant::now();
        while !*stop.borrow() {
            if Instant::now() >= next_stats {
                this.stats().await;
                next_stats = Instant::now() + STATS_EVERY;
            }
            // Wait for a free slot before leasing: a leased message should not wait.
            let first = tokio::select! {
                permit = permits.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
                _ = stop.changed() => return,
            };
            // Paced: one message per start, leased only when it may start, so no lease runs
            // out while its message waits its turn (another consumer would deliver it too),
            // and a stop while waiting leaves it in the queue.
            let room = match spacing {
                Some(_) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(next_start) => {}
                        _ = stop.changed() => return,
                    }
                    1
                }
                None => permits.available_permits() + 1,
            };
            let batch = match this
                .parts
                .deliveries
                .queue
                .lease(this.queue(), room, lease_for)
                .await
            {
                Ok(batch) => batch,
                Err(err) => {
                    tracing::warn!(queue = this.queue(), error = %err, "delivery queue lease failed");
                    drop(first);
                    pause(ERROR_PAUSE, &mut stop).await;
                    continue;
                }
            };
            if batch.is_empty() {
                drop(first);
                let woken = async {
                    match &wakeup {
                        Some(w) => w.notified().await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = woken => {}
                    () = tokio::time::sleep(POLL) => {}
                    _ = stop.changed() => return,
                }
                continue;
            }
            let mut first = Some(first);
            for message in batch {
                let permit = match first.take() {
                    Some(permit) => permit,
                    None => match permits.clone().acquire_owned().await {
                        Ok(permit) => permit,
                        Err(_) => return,
                    },
                };
                if let Some(spacing) = spacing {
                    next_start = Instant::now() + spacing;
                }
                let this = this.clone();
                tokio::spawn(async move {
                    this.deliver(message).await;
                    drop(permit);
                });
            }
        }
    }

    /// Reads the queue's gauges.
    async fn stats(&self) {
        let queue = self.queue().to_owned();
        match self.parts.deliveries.queue.stats(&queue).await {
            Ok(stats) => {
                metrics::gauge!("delivery_queue_depth", "queue" => queue.clone())
                    .set(stats.depth as f64);
                metrics::gauge!("delivery_queue_oldest_age_seconds", "queue" => queue.clone())
                    .set(stats.oldest_age.map_or(0.0, |age| age.as_secs_f64()));
                metrics::gauge!("delivery_queue_dead", "queue" => queue).set(stats.dead as f64);
            }
            Err(err) => tracing::warn!(queue, error = %err, "delivery queue stats failed"),
        }
    }

    /// One attempt of `message`, and its outcome recorded.
    async fn deliver(&self, message: Leased) {
        let queue = self.queue().to_owned();
        let schedule = &self.delivery.schedule;
        let attempt = message.attempts.saturating_add(1);
        let key = format!("delivery-{}", message.id);
        let correlation =
            header(&message, "x-request-id").unwrap_or_else(|| message.id.to_string());
        let dependency = self.dependency();
        let queue_api = &self.parts.deliveries.queue;
        // Too old to try at all (a message that waited past max_age, e.g. behind a backlog).
        if message.age > schedule.max_age() {
            self.dead(&message, None, DeadReason::MaxAge.as_str(), &key)
                .await;
            return;
        }
        let at_ms = unix_ms(self.parts.clock.as_ref());
        let started = Instant::now();
        let request = match self.request(&message, &key, &correlation) {
            Some(request) => request,
            None => {
                self.dead(&message, None, "stored request unreadable", &key)
                    .await;
                return;
            }
        };
        metrics::counter!("deliveries_attempted_total", "queue" => queue.clone()).increment(1);
        let Ok(response) = self.parts.service.clone().oneshot(request).await;
        let latency = started.elapsed();
        let status = response.status();
        let error_type = error_type(&response);
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| portcullis_retry::parse_retry_after(v, self.parts.clock.now()));
        // The answer is not kept; its body is dropped unread.
        drop(response);
        let record = Attempt {
            at_ms,
            outcome: AttemptOutcome::Status(status.as_u16()),
            latency_ms: u64::try_from(latency.as_millis()).unwrap_or(u64::MAX),
        };
        let log = |backoff: Duration| {
            tracing::info!(
                correlation_id = %correlation,
                delivery_id = %message.id,
                queue = %queue,
                dependency,
                attempt,
                max_attempts = schedule.max_attempts(),
                backoff_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
                status = status.as_u16(),
                error_type,
                idempotency_key = %key,
                "delivery attempt"
            );
        };
        let result = if status.is_success() {
            log(Duration::ZERO);
            metrics::counter!("deliveries_succeeded_total", "queue" => queue.clone()).increment(1);
            queue_api
                .delivered(&message.id, message.token, record)
                .await
        } else if status.is_client_error()
            && status != http::StatusCode::REQUEST_TIMEOUT
            && status != http::StatusCode::TOO_MANY_REQUESTS
        {
            log(Duration::ZERO);
            let reason = format!("upstream answered {}: not retryable", status.as_u16());
            self.dead(&message, Some(record), &reason, &key).await;
            return;
        } else {
            let age = message.age.saturating_add(latency);
            let next = schedule.after_failure(&mut rand::thread_rng(), attempt, age, retry_after);
            match next {
                NextDelivery::After(wait) => {
                    log(wait);
                    queue_api
                        .retry_at(&message.id, message.token, record, wait)
                        .await
                }
                NextDelivery::Dead(reason) => {
                    log(Duration::ZERO);
                    let reason = format!(
                        "{} after {attempt} attempts (last: {})",
                        reason.as_str(),
                        status.as_u16()
                    );
                    self.dead(&message, Some(record), &reason, &key).await;
                    return;
                }
            }
        };
        if let Err(err) = result {
            // A lost lease: another worker owns the message now and will record its own.
            tracing::warn!(delivery_id = %message.id, queue, error = %err, "delivery outcome not recorded");
        }
    }

    /// Dead-letters `message` with `reason`: one error log line and `dlq_messages_total`.
    async fn dead(&self, message: &Leased, attempt: Option<Attempt>, reason: &str, key: &str) {
        let queue = self.queue().to_owned();
        // Attempts made: none now when the message was too old to try.
        let attempts = message
            .attempts
            .saturating_add(u32::from(attempt.is_some()));
        match self
            .parts
            .deliveries
            .queue
            .dead(&message.id, message.token, attempt, reason)
            .await
        {
            Ok(()) => {
                metrics::counter!("dlq_messages_total", "queue" => queue.clone()).increment(1);
                tracing::error!(
                    delivery_id = %message.id,
                    queue,
                    tenant = message.tenant.as_deref().unwrap_or("anonymous"),
                    dependency = self.dependency(),
                    attempts,
                    idempotency_key = key,
                    reason,
                    "delivery dead-lettered"
                );
                if let Some(alerter) = &self.alerter {
                    alerter.announce(DeadLetterAlert {
                        event: "delivery.dead_lettered",
                        queue,
                        delivery_id: message.id.to_string(),
                        reason: reason.to_owned(),
                        attempts,
                        tenant: message.tenant.clone(),
                        dead_at_ms: unix_ms(self.parts.clock.as_ref()),
                    });
                }
            }
            Err(err) => {
                tracing::warn!(delivery_id = %message.id, queue, error = %err, "dead letter not recorded");
            }
        }
    }

    fn dependency(&self) -> &str {
        self.route.retry.upstream.name()
    }

    /// The delivery request: the stored method, path, headers and body, with the
    /// Idempotency-Key and delivery id, in the context of the route (and the tenant, if it
    /// still exists) that accepted it.
    fn request(&self, message: &Leased, key: &str, correlation: &str) -> Option<Request<Body>> {
        let mut request = Request::builder()
            .method(message.method.as_str())
            .uri(message.path_and_query.as_str())
            .body(Body::from(message.body.clone()))
            .ok()?;
        let headers = request.headers_mut();
        let mut client_ip: Option<IpAddr> = None;
        for (name, value) in &message.headers {
            if name.as_slice() == STORED_CLIENT.as_str().as_bytes() {
                client_ip = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                continue;
            }
            let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            else {
                continue;
            };
            headers.append(name, value);
        }
        headers.insert(
            portcullis_retry::IDEMPOTENCY_KEY.clone(),
            HeaderValue::from_str(key).ok()?,
        );
        headers.insert(
            PORTCULLIS_DELIVERY_ID.clone(),
            HeaderValue::from_str(message.id.as_str()).ok()?,
        );
        headers.insert(
            portcullis_retry::X_REQUEST_ID.clone(),
            HeaderValue::from_str(correlation).ok()?,
        );
        let caller = message
            .tenant
            .as_deref()
            .and_then(|id| self.parts.directory.load().by_id(id).cloned())
            .map_or(Caller::Anonymous, Caller::Tenant);
        let ip = client_ip.unwrap_or(IpAddr::from([127, 0, 0, 1]));
        let client = Client {
            ip,
            peer: ip,
            peer_trusted: false,
        };
        request
            .extensions_mut()
            .insert(Arc::new(RequestContext::new(
                self.route.clone(),
                caller,
                client,
            )));
        Some(request)
    }
}

/// The first stored value of header `name`, as text.
fn header(message: &Leased, name: &str) -> Option<String> {
    message
        .headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
        .and_then(|(_, v)| String::from_utf8(v.clone()).ok())
}

/// What went wrong, for the attempt's log line: the gateway's own problem type (the
/// upstream could not be reached, timed out, its breaker is open…), else the status class.
fn error_type(response: &Response<Body>) -> &'static str {
    let status = response.status();
    if status.is_success() {
        return "none";
    }
    let problem = response
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/problem+json"));
    match (problem, status.as_u16()) {
        (true, 502) => "upstream_unreachable",
        (true, 503) => "upstream_unavailable",
        (true, 504) => "upstream_timeout",
        (_, 408 | 429) => "upstream_throttled",
        (_, 400..=499) => "upstream_refused",
        _ => "upstream_error",
    }
}

fn unix_ms(clock: &dyn WallClock) -> i64 {
    clock
        .now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

async fn pause(wait: Duration, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = tokio::time::sleep(wait) => {}
        _ = stop.changed() => {}
    }
}
