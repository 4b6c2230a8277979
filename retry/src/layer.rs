//! `RetryLayer`: configuration shared by every [`Retry<S>`](crate::Retry) it builds, and the
//! `Layer` that builds them.

#[cfg(test)]
use std::sync::atomic::{AtomicU64, Ordering};
use std::{fmt, sync::Arc};

use rand::{rngs::StdRng, SeedableRng};

use super::{clock::WallClock, handoff::FindHandoff, service::Retry, RetryTarget};

/// Tells whether a request holds the gateway's idempotency lock, from its extensions.
pub type IsProtected = fn(&http::Extensions) -> bool;

/// Names the caller of a request, from its extensions, as an opaque key: the circuit
/// breaker attributes failures to callers so no single caller can open it for everyone.
/// Requests of one tenant (or one anonymous client) must map to one key.
pub type CallerKey = fn(&http::Extensions) -> u64;

/// Finds a request's [`RetryTarget`] in its extensions. By default the layer reads a
/// `RetryTarget` extension; a gateway that keeps the target in its own request context
/// points the layer there instead ([`RetryLayer::with_target`]), so it is never copied.
pub type FindTarget = for<'a> fn(&'a http::Extensions) -> Option<&'a RetryTarget>;

/// Wraps the upstream client in the retry loop. Cheap to clone.
#[derive(Clone)]
pub struct RetryLayer {
    pub(super) shared: Arc<Shared>,
}

pub(super) struct Shared {
    pub(super) is_protected: IsProtected,
    pub(super) caller_key: CallerKey,
    pub(super) target: FindTarget,
    /// Where a request's timed-out attempt may be left running (`handoff`).
    pub(super) handoff: Option<FindHandoff>,
    pub(super) clock: Arc<dyn WallClock>,
    rng: RngSource,
}

fn target_extension(extensions: &http::Extensions) -> Option<&RetryTarget> {
    extensions.get()
}

enum RngSource {
    /// Per request, seeded from the thread-local generator.
    Thread,
    /// Per request, seeded from `seed + n` (reproducible tests).
    #[cfg(test)]
    Seeded { seed: u64, next: AtomicU64 },
}

// === impl RetryLayer ===

impl RetryLayer {
    /// `is_protected` says whether a POST/PATCH holds the idempotency lock (the gateway
    /// passes `|e| e.get::<IdempotencyLock>().is_some()`); `caller_key` names the caller
    /// for the circuit breaker (the gateway passes its tenant, else the client address);
    /// `clock` gives wall-clock time for `X-Request-Deadline` and `Retry-After` dates.
    pub fn new(
        is_protected: IsProtected,
        caller_key: CallerKey,
        clock: Arc<dyn WallClock>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                is_protected,
                caller_key,
                target: target_extension,
                handoff: None,
                clock,
                rng: RngSource::Thread,
            }),
        }
    }

    /// Reads each request's [`RetryTarget`] with `target` instead of from a `RetryTarget`
    /// extension.
    pub fn with_target(self, target: FindTarget) -> Self {
        self.rebuild(target, RngSource::Thread)
    }

    /// Lets a request's caller keep a timed-out attempt running: `find` takes the request's
    /// [`Handoff`](crate::Handoff) from its extensions (see the `handoff` module).
    pub fn with_handoff(self, find: FindHandoff) -> Self {
        let target = self.shared.target;
        let mut layer = self.rebuild(target, RngSource::Thread);
        if let Some(shared) = Arc::get_mut(&mut layer.shared) {
            shared.handoff = Some(find);
        }
        layer
    }

    fn rebuild(self, target: FindTarget, rng: RngSource) -> Self {
        Self {
            shared: Arc::new(Shared {
                is_protected: self.shared.is_protected,
                caller_key: self.shared.caller_key,
                target,
                handoff: self.shared.handoff,
                clock: self.shared.clock.clone(),
                rng,
            }),
        }
    }

    /// Makes backoff draws reproducible (tests).
    #[cfg(test)]
    pub(crate) fn with_rng_seed(self, seed: u64) -> Self {
        let target = self.shared.target;
        self.rebuild(
            target,
            RngSource::Seeded {
                seed,
                next: AtomicU64::new(0),
            },
        )
    }
}

impl fmt::Debug for RetryLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryLayer").finish_non_exhaustive()
    }
}

// === impl Shared ===

impl Shared {
    /// A generator for one request's backoff sequence.
    pub(super) fn rng(&self) -> StdRng {
        match &self.rng {
            RngSource::Thread => StdRng::from_rng(rand::thread_rng())
                .unwrap_or_else(|_| StdRng::seed_from_u64(rand::random())),
            #[cfg(test)]
            RngSource::Seeded { seed, next } => {
                StdRng::seed_from_u64(seed.wrapping_add(next.fetch_add(1, Ordering::Relaxed)))
            }
        }
    }
}

impl<S> tower::Layer<S> for RetryLayer {
    type Service = Retry<S>;

    fn layer(&self, inner: S) -> Retry<S> {
        Retry::new(inner, self.shared.clone())
    }
}
