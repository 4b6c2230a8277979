//! What every Portcullis layer needs to answer a client itself: one RFC 9457 problem type,
//! one `Retry-After` rounding, one walk down an error's cause chain, and the gRPC status
//! vocabulary ([`grpc`]) for calls that do not read problem+json.
//!
//! It is the smallest crate of the workspace so that each concern crate (rate limiting,
//! idempotency, retries) and the gateway build their answers the same way, and each stays
//! usable on its own in any axum or hyper service.
//!
//! ```
//! use std::time::Duration;
//! use http::StatusCode;
//! use portcullis_problem::{Problem, retry_after_secs};
//!
//! let response = Problem::new(
//!     StatusCode::SERVICE_UNAVAILABLE,
//!     "overloaded",
//!     "Gateway overloaded",
//!     "the gateway is at its concurrent request limit",
//! )
//! .retry_after(Duration::from_millis(1500)) // `Retry-After: 2` and `"retry_after": 2`
//! .into_response();
//! assert_eq!(response.headers()["retry-after"], "2");
//! assert_eq!(retry_after_secs(Duration::ZERO), 1);
//! ```
//!
//! # Rounding
//!
//! A wait told to a client is whole seconds, rounded up, and never 0 ([`retry_after_secs`]):
//! `Retry-After: 0` invites a client to retry at once, in a loop.

mod chain;
pub mod clock;
pub mod grpc;
pub mod headers;
mod problem;

pub use chain::{caused_by, is_caused_by};
pub use problem::{Problem, CONTENT_TYPE, TYPE_BASE};

use std::time::Duration;

/// Whole seconds, rounded up: 0 s → 0, 1 ns → 1, 1 s → 1, 1.000001 s → 2.
pub fn ceil_secs(wait: Duration) -> u64 {
    wait.as_secs() + u64::from(wait.subsec_nanos() > 0)
}

/// A wait as `Retry-After` carries it: whole seconds, rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    ceil_secs(wait).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_and_is_never_zero() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(3)), 3);
        assert_eq!(ceil_secs(Duration::ZERO), 0);
        assert_eq!(ceil_secs(Duration::from_nanos(1)), 1);
    }

    proptest::proptest! {
        #[test]
        fn retry_after_is_never_below_the_wait_nor_zero(nanos in 0u64..1u64 << 40) {
            let wait = Duration::from_nanos(nanos);
            let secs = retry_after_secs(wait);
            proptest::prop_assert!(secs >= 1);
            proptest::prop_assert!(Duration::from_secs(secs) >= wait);
            proptest::prop_assert!(Duration::from_secs(secs) < wait + Duration::from_secs(1) || secs == 1);
        }
    }
}
