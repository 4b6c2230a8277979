//! [`RateLimitLayer`]: wraps a service in [`RateLimit`](crate::RateLimit) (whose module holds the `Layer` impl).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;

use crate::clock::{Clock, SystemClock};
use crate::limiter::{LimitRequest, Limiter};
use crate::rejection::Rejection;

/// What the layer asks of the surrounding application: the checks that apply to a request,
/// read from its head (typically a `Tenant` extension inserted by an earlier layer and the
/// matched route). `None` (or an empty request) lets the request pass untouched.
pub type Extract = Arc<dyn Fn(&Parts) -> Option<LimitRequest> + Send + Sync>;

/// Told of every answer the layer gives itself (429 rate limited, 503 store unavailable),
/// with the request's extensions, before the answer leaves. Lets the application count
/// rejections by whatever its extensions identify (a tenant, a route) without inferring
/// them from response statuses, which would also count a backend's own 429.
pub type Observe = Arc<dyn Fn(&http::Extensions, &Rejection) + Send + Sync>;

/// `Retry-After` of the 503 answered when the limiter fails and no better hint exists.
pub const DEFAULT_UNAVAILABLE_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A tower layer that rate-limits requests. `Clone + Send + Sync`, cheap to clone.
///
/// ```text
/// … → tenant resolution → load shedder → RateLimitLayer → idempotency → router → …
/// ```
#[derive(Clone)]
pub struct RateLimitLayer {
    pub(crate) limiter: Arc<dyn Limiter>,
    pub(crate) extract: Extract,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) unavailable_retry_after: Duration,
    pub(crate) observe: Option<Observe>,
}

// === impl RateLimitLayer ===

impl RateLimitLayer {
    /// A layer deciding with `limiter` the checks `extract` returns for each request.
    pub fn new<F>(limiter: Arc<dyn Limiter>, extract: F) -> Self
    where
        F: Fn(&Parts) -> Option<LimitRequest> + Send + Sync + 'static,
    {
        Self::from_shared(limiter, Arc::new(extract))
    }

    /// Like [`RateLimitLayer::new`], with an already shared extractor.
    pub fn from_shared(limiter: Arc<dyn Limiter>, extract: Extract) -> Self {
        Self {
            limiter,
            extract,
            clock: Arc::new(SystemClock),
            unavailable_retry_after: DEFAULT_UNAVAILABLE_RETRY_AFTER,
            observe: None,
        }
    }

    /// The wall clock used for `X-RateLimit-Reset` and the problem's `reset` (default:
    /// [`SystemClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Calls `observe` for each rejection the layer answers itself (see [`Observe`]); it runs
    /// on the request path, so it should be cheap (an atomic add, a metric).
    pub fn with_observer<F>(mut self, observe: F) -> Self
    where
        F: Fn(&http::Extensions, &Rejection) + Send + Sync + 'static,
    {
        self.observe = Some(Arc::new(observe));
        self
    }

    /// `Retry-After` of the 503 answered when the limiter cannot decide (default 1 s).
    pub fn with_unavailable_retry_after(mut self, retry_after: Duration) -> Self {
        self.unavailable_retry_after = retry_after;
        self
    }
}

impl fmt::Debug for RateLimitLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("limiter", &self.limiter)
            .field("clock", &self.clock)
            .field("unavailable_retry_after", &self.unavailable_retry_after)
            .field("observe", &self.observe.is_some())
            .finish_non_exhaustive()
    }
}
