//! The key cache: the issuer's current keys, read lock-free on every request, refreshed in
//! the background, and refreshed early — at most once per cooldown — when a token names a
//! `kid` the cache does not hold (key rotation).
//!
//! # Why a cooldown and a single flight
//!
//! Anyone can send a token with a random `kid`. Without a bound, each would make the gateway
//! fetch the JWKS again, turning the gateway into an amplifier against the identity
//! provider. So: refreshes never overlap (one mutex; a request that finds a refresh running
//! waits for it instead of starting another), and a refresh *triggered by an unknown kid*
//! starts at most once per `jwks_refresh_cooldown`. Inside the cooldown an unknown kid is
//! refused at once. A real rotation costs its first callers one fetch; a flood of random
//! kids costs one fetch per cooldown. (keyfunc, the common Go JWKS client, does the same
//! with its `RefreshRateLimit`; Envoy never refetches on an unknown kid.)
//!
//! A failed refresh (endpoint down, 500, garbage) keeps the last good keys.

use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::time::Instant;

use super::fetch::{FetchError, JwksSource};
use super::jwk::KeySet;

/// The issuer's keys and how they are kept fresh.
pub(crate) struct KeyCache {
    current: ArcSwap<KeySet>,
    source: Box<dyn JwksSource>,
    /// Held while a refresh runs: refreshes never overlap.
    refreshing: tokio::sync::Mutex<()>,
    /// When the last unknown-kid refresh started.
    last_forced: std::sync::Mutex<Option<Instant>>,
    cooldown: Duration,
}

// === impl KeyCache ===

impl KeyCache {
    /// A cache starting with `initial` keys (empty until the first fetch for a URL).
    pub(crate) fn new(source: Box<dyn JwksSource>, initial: KeySet, cooldown: Duration) -> Self {
        Self {
            current: ArcSwap::from_pointee(initial),
            source,
            refreshing: tokio::sync::Mutex::new(()),
            last_forced: std::sync::Mutex::new(None),
            cooldown,
        }
    }

    /// The current keys.
    pub(crate) fn keys(&self) -> Arc<KeySet> {
        self.current.load_full()
    }

    /// Whether the current keys hold `kid`.
    pub(crate) fn knows(&self, kid: &str) -> bool {
        self.current.load().has_kid(kid)
    }

    /// Makes sure the keys are as fresh as the rate limit allows for a token naming `kid`:
    /// waits for a refresh already running; starts one if none ran for this reason within
    /// the cooldown. Returns without fetching when the key is (or became) known.
    pub(crate) async fn refresh_for_kid(&self, kid: &str) {
        if self.knows(kid) {
            return;
        }
        let allowed = {
            let now = Instant::now();
            match self.last_forced.lock() {
                Ok(mut last) => {
                    let allowed = last.is_none_or(|at| now.duration_since(at) >= self.cooldown);
                    if allowed {
                        *last = Some(now);
                    }
                    allowed
                }
                Err(_) => false,
            }
        };
        // Either way, a refresh already running may bring the key: wait for it.
        let _running = self.refreshing.lock().await;
        if !allowed || self.knows(kid) {
            return;
        }
        self.refresh_locked("unknown_kid").await;
    }

    /// One refresh, after any running one.
    pub(crate) async fn refresh(&self, reason: &'static str) {
        let _running = self.refreshing.lock().await;
        self.refresh_locked(reason).await;
    }

    async fn refresh_locked(&self, reason: &'static str) {
        let fetched = match self.source.fetch().await {
            Ok(bytes) => KeySet::parse(&bytes).map_err(FetchError::from),
            Err(err) => Err(err),
        };
        match fetched {
            Ok(keys) => {
                tracing::debug!(keys = keys.len(), reason, "JWKS refreshed");
                metrics::counter!("jwks_refresh_total", "reason" => reason, "outcome" => "ok")
                    .increment(1);
                self.current.store(Arc::new(keys));
            }
            Err(err) => {
                tracing::warn!(error = %err, reason, "JWKS refresh failed; keeping the last good keys");
                metrics::counter!("jwks_refresh_total", "reason" => reason, "outcome" => "error")
                    .increment(1);
            }
        }
    }

    /// Refreshes every `interval` (and, for a file, as soon as it changes) until the cache
    /// is dropped. The first refresh runs at once.
    pub(crate) async fn keep_fresh(cache: Weak<Self>, interval: Duration) {
        let mut last_refresh: Option<Instant> = None;
        loop {
            let Some(this) = cache.upgrade() else {
                return;
            };
            let due = last_refresh.is_none_or(|at| at.elapsed() >= interval);
            if due || this.source.changed() {
                this.refresh(if due { "interval" } else { "file_changed" })
                    .await;
                last_refresh = Some(Instant::now());
            }
            let tick = this
                .source
                .watch_every()
                .map_or(interval, |w| w.min(interval));
            drop(this);
            tokio::time::sleep(tick).await;
        }
    }
}

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCache")
            .field("keys", &self.current.load().len())
            .field("cooldown", &self.cooldown)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use bytes::Bytes;
    use futures_util::future::BoxFuture;

    use super::*;

    /// What the test source serves (the kids of its keys, or an error) and how often it
    /// was asked.
    #[derive(Default)]
    struct Script {
        kids: std::sync::Mutex<Vec<&'static str>>,
        fetches: AtomicUsize,
        fail: std::sync::atomic::AtomicBool,
    }

    struct Counting(Arc<Script>);

    impl JwksSource for Counting {
        fn fetch(&self) -> BoxFuture<'_, Result<Bytes, FetchError>> {
            Box::pin(async move {
                self.0.fetches.fetch_add(1, Ordering::SeqCst);
                // A fetch takes time, so concurrent callers overlap with it.
                tokio::time::sleep(Duration::from_millis(100)).await;
                if self.0.fail.load(Ordering::SeqCst) {
                    return Err(FetchError::Status(503));
                }
                let x = URL_SAFE_NO_PAD.encode([9u8; 32]);
                let keys: Vec<_> = self
                    .0
                    .kids
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|kid| serde_json::json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": x}))
                    .collect();
                Ok(Bytes::from(serde_json::json!({ "keys": keys }).to_string()))
            })
        }
    }

    fn cache(kids: &[&'static str]) -> (Arc<KeyCache>, Arc<Script>) {
        let script = Arc::new(Script {
            kids: std::sync::Mutex::new(kids.to_vec()),
            ..Default::default()
        });
        let source = Box::new(Counting(script.clone()));
        let cache = KeyCache::new(source, KeySet::default(), Duration::from_secs(30));
        (Arc::new(cache), script)
    }

    fn fetches(script: &Script) -> usize {
        script.fetches.load(Ordering::SeqCst)
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_kids_refresh_once_per_cooldown() {
        let (cache, script) = cache(&["a"]);
        // A flood of random kids at once: one fetch, everyone waits for it.
        let waits: Vec<_> = (0..50)
            .map(|i| {
                let cache = cache.clone();
                tokio::spawn(async move { cache.refresh_for_kid(&format!("random-{i}")).await })
            })
            .collect();
        for wait in waits {
            wait.await.unwrap();
        }
        assert_eq!(fetches(&script), 1);
        assert!(cache.knows("a"));
        // Inside the cooldown: refused without a fetch.
        cache.refresh_for_kid("other").await;
        assert_eq!(fetches(&script), 1);
        // A known kid never fetches.
        tokio::time::advance(Duration::from_secs(31)).await;
        cache.refresh_for_kid("a").await;
        assert_eq!(fetches(&script), 1);
        // After the cooldown one more is allowed.
        cache.refresh_for_kid("other").await;
        assert_eq!(fetches(&script), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn rotation_is_picked_up_and_failures_keep_the_last_keys() {
        let (cache, source) = cache(&["old"]);
        cache.refresh("interval").await;
        assert!(cache.knows("old"));
        *source.kids.lock().unwrap() = vec!["new"];
        cache.refresh_for_kid("new").await;
        assert!(cache.knows("new") && !cache.knows("old"));
        source.fail.store(true, Ordering::SeqCst);
        cache.refresh("interval").await;
        assert!(
            cache.knows("new"),
            "a failed refresh keeps the last good keys"
        );
        assert_eq!(fetches(&source), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn the_refresher_runs_on_its_interval_and_stops_with_the_cache() {
        let (cache, script) = cache(&["a"]);
        let task = tokio::spawn(KeyCache::keep_fresh(
            Arc::downgrade(&cache),
            Duration::from_secs(60),
        ));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(fetches(&script), 1, "first refresh at once");
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(fetches(&script), 3);
        drop(cache);
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(task.is_finished());
    }
}
