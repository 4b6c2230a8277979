//! Connection handling: the lazily made connection, the options it is made with, and the
//! timeout every call runs under.

use std::time::Duration;

use portcullis_redis::{ConnectOptions, RedisConnection};

use super::{RedisLimiter, RedisLimiterConfig};
use crate::limiter::LimiterError;

impl RedisLimiter {
    /// The shared connection, made on first use (then reconnecting by itself).
    pub(super) async fn connection(&self) -> Result<RedisConnection, LimiterError> {
        let conn = self.conn.get_or_try_init(|| self.client.connect()).await?;
        Ok(conn.clone())
    }

    /// Runs `fut` under the decision timeout.
    pub(super) async fn bounded<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, LimiterError>>,
    ) -> Result<T, LimiterError> {
        tokio::time::timeout(self.config.timeout, fut)
            .await
            .unwrap_or(Err(LimiterError::Timeout(self.config.timeout)))
    }
}

/// How the limiter connects: every bound is the decision timeout; a single server's
/// connection manager retries in the background quickly at first, then at most 1 s apart.
pub(super) fn connect_options(config: &RedisLimiterConfig) -> ConnectOptions {
    ConnectOptions {
        connection_timeout: config.timeout,
        response_timeout: config.timeout,
        retries: 3,
        retry_factor_ms: 10,
        max_retry_delay: Duration::from_secs(1),
    }
}
