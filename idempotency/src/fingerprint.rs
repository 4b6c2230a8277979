//! Request fingerprints: what makes two requests "the same request".
//!
//! A key alone is not enough: a client bug that reuses a key for a *different* payment must
//! not be answered with the first payment's receipt. The fingerprint is SHA-256 over the
//! method, path and query, tenant, content type and body bytes. Every field is
//! length-prefixed (u64, big endian) after a version tag, so no two different field tuples
//! can produce the same hash input (`("ab", "c")` vs `("a", "bc")`), and an absent
//! content type is distinguished from an empty one.
//!
//! Not included, deliberately: headers other than content type (clients add tracing and
//! auth headers that legitimately change between retries), the route (already part of the
//! record scope) and the key itself (same reason).

use std::fmt;

use sha2::{Digest, Sha256};

/// Bumped if the hashed layout ever changes, so old records mismatch instead of colliding.
const DOMAIN: &[u8] = b"portcullis-idempotency-fingerprint-v1";

/// SHA-256 of a request's identifying parts.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// The parts of a request that are fingerprinted.
#[derive(Debug, Clone, Copy)]
pub struct FingerprintInput<'a> {
    /// HTTP method, e.g. `POST`.
    pub method: &'a str,
    /// Path and query exactly as received, e.g. `/orders?dry_run=1`.
    pub path_and_query: &'a str,
    /// Tenant the request was resolved to.
    pub tenant: &'a str,
    /// Raw `Content-Type` header bytes, `None` when absent.
    pub content_type: Option<&'a [u8]>,
    /// The complete request body.
    pub body: &'a [u8],
}

// === impl Fingerprint ===

impl Fingerprint {
    /// Computes the fingerprint of a request.
    pub fn compute(input: &FingerprintInput<'_>) -> Self {
        let mut h = Sha256::new();
        h.update(DOMAIN);
        field(&mut h, input.method.as_bytes());
        field(&mut h, input.path_and_query.as_bytes());
        field(&mut h, input.tenant.as_bytes());
        match input.content_type {
            None => h.update([0u8]),
            Some(ct) => {
                h.update([1u8]);
                field(&mut h, ct);
            }
        }
        field(&mut h, input.body);
        Self(h.finalize().into())
    }

    /// Wraps raw digest bytes (as read back from a store).
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// Parses raw digest bytes of any length; `None` unless exactly 32 bytes.
    pub fn from_slice(bytes: &[u8]) -> Option<Self> {
        bytes.try_into().ok().map(Self)
    }

    /// The raw 32 digest bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lower-case hex, for admin views and logs.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({})", &self.to_hex()[..16])
    }
}

fn field(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input<'a>(path: &'a str, tenant: &'a str, body: &'a [u8]) -> FingerprintInput<'a> {
        FingerprintInput {
            method: "POST",
            path_and_query: path,
            tenant,
            content_type: Some(b"application/json"),
            body,
        }
    }

    #[test]
    fn stable_and_sensitive_to_every_field() {
        let base = Fingerprint::compute(&input("/orders", "acme", b"{}"));
        assert_eq!(base, Fingerprint::compute(&input("/orders", "acme", b"{}")));
        assert_ne!(
            base,
            Fingerprint::compute(&input("/orders?x=1", "acme", b"{}"))
        );
        assert_ne!(
            base,
            Fingerprint::compute(&input("/orders", "acme2", b"{}"))
        );
        assert_ne!(
            base,
            Fingerprint::compute(&input("/orders", "acme", b"{ }"))
        );
        let mut patch = input("/orders", "acme", b"{}");
        patch.method = "PATCH";
        assert_ne!(base, Fingerprint::compute(&patch));
        let mut no_ct = input("/orders", "acme", b"{}");
        no_ct.content_type = None;
        let mut empty_ct = no_ct;
        empty_ct.content_type = Some(b"");
        assert_ne!(base, Fingerprint::compute(&no_ct));
        assert_ne!(
            Fingerprint::compute(&no_ct),
            Fingerprint::compute(&empty_ct)
        );
    }

    #[test]
    fn field_boundaries_cannot_be_shifted() {
        // Same concatenation "/ab" + "c" vs "/a" + "bc": different fingerprints.
        let a = Fingerprint::compute(&input("/ab", "c", b""));
        let b = Fingerprint::compute(&input("/a", "bc", b""));
        assert_ne!(a, b);
    }

    #[test]
    fn hex_round_trip() {
        let f = Fingerprint::compute(&input("/", "t", b"x"));
        assert_eq!(f.to_hex().len(), 64);
        assert_eq!(Fingerprint::from_slice(f.as_bytes()), Some(f));
        assert_eq!(Fingerprint::from_slice(&[0; 31]), None);
    }
}
