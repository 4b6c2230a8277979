//! The headers that carry a caller's identity: what a client presents, and what the gateway
//! alone tells backends. A leaf module, so that tenant resolution and JWT verification, which
//! both read them, do not depend on each other for a name.

use http::HeaderName;

/// Header carrying an API key.
pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
/// Header telling backends which tenant called (set by the gateway only).
pub static X_PORTCULLIS_TENANT: HeaderName = HeaderName::from_static("x-portcullis-tenant");
