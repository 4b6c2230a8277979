//! [`IdempotencyLayer`]: wraps a service in [`Idempotency`].

use std::sync::Arc;

use tower::Layer;

use crate::service::Idempotency;
use crate::settings::IdempotencySettings;
use crate::store::Store;

/// Decides per request whether and how it is deduplicated: `None` passes it through
/// untouched. Typically reads the tenant and route the gateway put in the extensions.
pub type ExtractSettings =
    Arc<dyn Fn(&http::request::Parts) -> Option<IdempotencySettings> + Send + Sync>;

/// Tower layer deduplicating keyed requests against a [`Store`].
#[derive(Clone)]
pub struct IdempotencyLayer {
    store: Arc<dyn Store>,
    extract: ExtractSettings,
}

// === impl IdempotencyLayer ===

impl IdempotencyLayer {
    /// A layer using `store`, with `extract` choosing the settings of each request.
    pub fn new(store: Arc<dyn Store>, extract: ExtractSettings) -> Self {
        Self { store, extract }
    }
}

impl<S> Layer<S> for IdempotencyLayer {
    type Service = Idempotency<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Idempotency::new(inner, self.store.clone(), self.extract.clone())
    }
}

impl std::fmt::Debug for IdempotencyLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotencyLayer").finish_non_exhaustive()
    }
}
