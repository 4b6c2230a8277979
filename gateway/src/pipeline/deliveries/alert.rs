//! The optional alert webhook of an asynchronous route (`delivery.alert_webhook`,
//! docs/async-delivery.md#dead-letters): on each dead letter, one POST of a small JSON —
//! queue, delivery id, reason, attempts, tenant — never the payload, headers or a credential.
//!
//! - It never holds up delivery: the worker hands the alert to a task and goes on; at most
//!   [`MAX_ALERTS_IN_FLIGHT`] alerts of one route are in flight, and one more while they all
//!   are is dropped (the dead letter itself is stored either way).
//! - One HTTP/1.1 POST on a fresh connection (`https://` verified against the system roots),
//!   the whole exchange bounded by `alert_timeout`; not retried. Dead letters are rare and
//!   the dead-letter queue keeps them, so a pool or a retry would buy nothing.
//! - Every outcome is counted in `delivery_alerts_total{queue, outcome}` (`sent`, `failed`,
//!   `dropped`); a failure is logged at warn with the webhook's host, never its path (a
//!   webhook URL's path is often its secret).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Semaphore;

use crate::config::AlertWebhook;

/// Alerts of one route in flight at once, at most.
pub(crate) const MAX_ALERTS_IN_FLIGHT: usize = 16;

/// Largest answer body read from the webhook (then dropped).
const MAX_ANSWER_BYTES: usize = 64 * 1024;

/// What one alert says about a dead letter.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct DeadLetterAlert {
    /// Always `delivery.dead_lettered`.
    pub(crate) event: &'static str,
    /// The route's name (its queue).
    pub(crate) queue: String,
    pub(crate) delivery_id: String,
    pub(crate) reason: String,
    /// Attempts made, this one included.
    pub(crate) attempts: u32,
    /// The tenant that sent the request; `None` for an anonymous caller.
    pub(crate) tenant: Option<String>,
    /// When the gateway dead-lettered it, Unix milliseconds.
    pub(crate) dead_at_ms: i64,
}

/// Why an alert was not delivered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AlertError {
    #[error("cannot connect to the alert webhook: {0}")]
    Connect(#[source] std::io::Error),
    #[error("TLS handshake with the alert webhook failed: {0}")]
    Tls(#[source] std::io::Error),
    #[error("alert webhook request failed: {0}")]
    Http(#[from] hyper::Error),
    #[error("the alert webhook answered {0}")]
    Status(u16),
    #[error("the alert could not be built")]
    Build,
    #[error("the alert webhook did not answer within {0:?}")]
    Timeout(Duration),
}

/// The alert webhook of one route, with its in-flight bound.
#[derive(Clone)]
pub(crate) struct Alerter {
    webhook: AlertWebhook,
    slots: Arc<Semaphore>,
}

impl Alerter {
    pub(crate) fn new(webhook: AlertWebhook) -> Self {
        Self {
            webhook,
            slots: Arc::new(Semaphore::new(MAX_ALERTS_IN_FLIGHT)),
        }
    }

    /// Sends `alert` in the background; returns at once.
    pub(crate) fn announce(&self, alert: DeadLetterAlert) {
        let queue = alert.queue.clone();
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            count(&queue, "dropped");
            tracing::warn!(queue, delivery_id = %alert.delivery_id,
                limit = MAX_ALERTS_IN_FLIGHT, "dead-letter alert dropped: too many in flight");
            return;
        };
        let webhook = self.webhook.clone();
        tokio::spawn(async move {
            let sent = tokio::time::timeout(webhook.timeout, post(&webhook, &alert)).await;
            let result = sent.unwrap_or(Err(AlertError::Timeout(webhook.timeout)));
            match result {
                Ok(()) => count(&queue, "sent"),
                Err(err) => {
                    count(&queue, "failed");
                    tracing::warn!(queue, delivery_id = %alert.delivery_id,
                        webhook = webhook.uri.host().unwrap_or_default(), error = %err,
                        "dead-letter alert not delivered");
                }
            }
            drop(slot);
        });
    }
}

/// Registers the alert counters of `queue` at 0.
pub(crate) fn register(queue: &str) {
    for outcome in ["sent", "failed", "dropped"] {
        metrics::counter!("delivery_alerts_total", "queue" => queue.to_owned(), "outcome" => outcome)
            .increment(0);
    }
}

fn count(queue: &str, outcome: &'static str) {
    metrics::counter!("delivery_alerts_total", "queue" => queue.to_owned(), "outcome" => outcome)
        .increment(1);
}

async fn post(webhook: &AlertWebhook, alert: &DeadLetterAlert) -> Result<(), AlertError> {
    let body = serde_json::to_vec(alert).map_err(|_| AlertError::Build)?;
    let uri = &webhook.uri;
    let host = uri.host().unwrap_or_default();
    // An IPv6 literal comes bracketed; neither connect nor a server name wants that.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri
        .port_u16()
        .unwrap_or(if webhook.tls.is_some() { 443 } else { 80 });
    let tcp = TcpStream::connect((host, port))
        .await
        .map_err(AlertError::Connect)?;
    match &webhook.tls {
        None => exchange(tcp, uri, body).await,
        Some(tls) => {
            let name = rustls_pki_types::ServerName::try_from(host.to_owned()).map_err(|e| {
                AlertError::Tls(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
            })?;
            let stream = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name, tcp)
                .await
                .map_err(AlertError::Tls)?;
            exchange(stream, uri, body).await
        }
    }
}

async fn exchange<T>(io: T, uri: &Uri, body: Vec<u8>) -> Result<(), AlertError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let authority = uri
        .authority()
        .map(|a| a.as_str().to_owned())
        .unwrap_or_default();
    let request = async move {
        let request = Request::post(path)
            .header(header::HOST, authority)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, "portcullis")
            .body(Full::new(Bytes::from(body)))
            .map_err(|_| AlertError::Build)?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        // Read (bounded) and drop the answer, so the server sees a complete exchange.
        let _ = http_body_util::Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await;
        if status.is_success() {
            Ok(())
        } else {
            Err(AlertError::Status(status.as_u16()))
        }
    };
    // The connection is driven here rather than spawned, so nothing outlives the timeout.
    let mut conn = std::pin::pin!(conn);
    let mut request = std::pin::pin!(request);
    tokio::select! {
        result = &mut request => result,
        _ = &mut conn => request.await,
    }
}
