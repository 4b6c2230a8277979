//! [`IdempotencyLayer`]: wraps a service in [`Idempotency`].

use std::sync::Arc;

use tower::Layer;

use crate::service::Idempotency;
use crate::settings::ExtractSettings;
use crate::store::Store;

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
