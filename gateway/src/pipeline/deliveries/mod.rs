//! Asynchronous routes (`delivery = { mode = "async" }`, docs/async-delivery.md): the request
//! path's side of the durable queue (`portcullis_queue`).
//!
//! - [`accept`]: a request on an asynchronous route, once the pipeline let it through, is
//!   stored with `enqueue` instead of being proxied, and answered `202 Accepted` only after
//!   the store returned; a duplicate (by the route's dedupe source) gets the original id.
//! - [`status`]: `GET /_portcullis/deliveries/{id}` on the proxy listener, answered only to
//!   the caller who sent the request (the same tenant, or the same anonymous client address).
//! - [`alert`]: the optional alert webhook POSTed on each dead letter, in the background.
//! - [`worker`]: per asynchronous route, the task that leases due messages and sends each
//!   through the same retry layer and upstream as synchronous traffic.

pub(crate) mod accept;
pub(crate) mod alert;
pub(crate) mod status;
pub(crate) mod worker;

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderName;
use portcullis_queue::Queue;
use tokio::sync::Notify;

use crate::config::RouteSettings;
use crate::plumbing::headers::X_API_KEY;

/// Where the status of an accepted request is read, on the proxy listener.
pub(crate) const STATUS_PREFIX: &str = "/_portcullis/deliveries/";

/// The delivery id, on the 202 and on every delivery attempt.
pub(crate) static PORTCULLIS_DELIVERY_ID: HeaderName =
    HeaderName::from_static("portcullis-delivery-id");

/// Stored with a message (never delivered): the address of the client that sent it, so that
/// only that client reads an anonymous request's status, and deliveries forward it.
pub(crate) static STORED_CLIENT: HeaderName = HeaderName::from_static("portcullis-stored-client");

/// The queue and a wake-up per asynchronous route's queue (an accepted request wakes its
/// worker at once instead of waiting for the next poll).
pub(crate) struct Deliveries {
    pub(crate) queue: Arc<dyn Queue>,
    wakeups: HashMap<String, Arc<Notify>>,
}

impl Deliveries {
    /// The deliveries of the asynchronous routes in `routes`, stored in `queue`.
    pub(crate) fn new(queue: Arc<dyn Queue>, routes: &[RouteSettings]) -> Self {
        let wakeups = routes
            .iter()
            .filter(|r| r.delivery.is_some())
            .map(|r| (r.name.clone(), Arc::new(Notify::new())))
            .collect();
        Self { queue, wakeups }
    }

    /// The wake-up of `queue`'s worker.
    pub(crate) fn wakeup(&self, queue: &str) -> Option<Arc<Notify>> {
        self.wakeups.get(queue).cloned()
    }
}

/// Whether a request header is stored with an accepted message: not credentials (the
/// `Authorization`, `Proxy-Authorization`, `Cookie` and API key headers, the route's
/// signature header), not the framing (`Host`, `Content-Length`; the delivery sets its own),
/// not the client's `Idempotency-Key` (each delivery forwards one derived from the id).
pub(crate) fn stored(name: &HeaderName, route: &RouteSettings) -> bool {
    let credential = name == http::header::AUTHORIZATION
        || name == http::header::PROXY_AUTHORIZATION
        || name == http::header::COOKIE
        || *name == X_API_KEY
        || route.verify.as_ref().is_some_and(|v| v.header == name);
    let framing = name == http::header::CONTENT_LENGTH || name == http::header::TRANSFER_ENCODING;
    let ours = name == portcullis_retry::IDEMPOTENCY_KEY
        || *name == PORTCULLIS_DELIVERY_ID
        || *name == STORED_CLIENT;
    !(credential || framing || ours)
}
