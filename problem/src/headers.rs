//! Header names more than one crate reads or writes, defined once here. A name only one crate
//! uses is defined in that crate.

use http::HeaderName;

/// The client's key for one operation (`Idempotency-Key`): read by the idempotency layer,
/// forwarded on every attempt and logged by the retry layer.
pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The request's correlation id (`X-Request-Id`): set at the edge when missing, forwarded
/// unchanged, logged.
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
