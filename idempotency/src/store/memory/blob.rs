//! The variable-size part of a record in one exact-size allocation: the record's key and, once
//! completed, its response.
//!
//! Why not keep `RecordKey` and `StoredResponse` as they are: a stored 23-byte JSON answer
//! with three headers cost about 1.4 KB of resident memory that way (two `String`s and an
//! `IdempotencyKey` in the map, a clone of all three in the expiry index, a `HeaderMap` with
//! its index and bucket vectors, one allocation per header value, a `Bytes` with its shared
//! header), against ≈ 190 bytes for the same content encoded here. The price is a decode on
//! replay (headers rebuilt, body copied: a replay is an answer the upstream did not have to
//! compute, and the copy is smaller than the response it writes).
//!
//! Layout (lengths little-endian `u32`):
//!
//! ```text
//! tenant_len route_len key_len tenant route key            -- always
//! header_count { sensitive:u8 name_len value_len name value }* body   -- completed only
//! ```

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::record::StoredResponse;
use crate::store::RecordKey;

const LEN: usize = 4;
const KEY_HEAD: usize = 3 * LEN;

/// Encoded key, optionally followed by a response.
#[derive(Debug)]
pub(super) struct Blob(Box<[u8]>);

// === impl Blob ===

impl Blob {
    /// The key alone (an in-flight or too-large record). `None` if a part exceeds 4 GiB.
    pub(super) fn key_only(key: &RecordKey) -> Option<Self> {
        let mut out = Vec::with_capacity(key_len(key));
        push_key(&mut out, key)?;
        Some(Self(out.into_boxed_slice()))
    }

    /// This blob's key followed by `response`. `None` if a part exceeds 4 GiB (the caller
    /// keeps a too-large tombstone instead).
    pub(super) fn with_response(&self, response: &StoredResponse) -> Option<Self> {
        let key = &self.0[..self.key_end()];
        let headers: usize = response
            .headers
            .iter()
            .map(|(n, v)| 1 + 2 * LEN + n.as_str().len() + v.len())
            .sum();
        let mut out = Vec::with_capacity(key.len() + LEN + headers + response.body.len());
        out.extend_from_slice(key);
        push_len(&mut out, response.headers.len())?;
        for (name, value) in &response.headers {
            out.push(u8::from(value.is_sensitive()));
            push_len(&mut out, name.as_str().len())?;
            push_len(&mut out, value.len())?;
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&response.body);
        Some(Self(out.into_boxed_slice()))
    }

    /// Whether this blob encodes `key`.
    pub(super) fn key_is(&self, key: &RecordKey) -> bool {
        let (t, r, k) = self.key_parts();
        t == key.tenant.as_bytes() && r == key.route.as_bytes() && k == key.key.as_str().as_bytes()
    }

    /// The key's (tenant, route, key) bytes.
    fn key_parts(&self) -> (&[u8], &[u8], &[u8]) {
        let t = read_len(&self.0, 0);
        let r = read_len(&self.0, LEN);
        let k = read_len(&self.0, 2 * LEN);
        let rest = self.0.get(KEY_HEAD..).unwrap_or_default();
        let (tenant, rest) = rest.split_at_checked(t).unwrap_or_default();
        let (route, rest) = rest.split_at_checked(r).unwrap_or_default();
        let key = rest.get(..k).unwrap_or_default();
        (tenant, route, key)
    }

    /// Rebuilds the stored response (headers re-parsed, body copied out).
    pub(super) fn response(&self, status: StatusCode) -> StoredResponse {
        let mut at = self.key_end();
        let count = read_len(&self.0, at);
        at += LEN;
        let mut headers = HeaderMap::with_capacity(count.min(self.0.len()));
        // Bounded by the count written, and by the bytes left (each header takes ≥ 9).
        for _ in 0..count {
            let (Some(&sensitive), n, v) = (
                self.0.get(at),
                read_len(&self.0, at + 1),
                read_len(&self.0, at + 1 + LEN),
            ) else {
                break;
            };
            at += 1 + 2 * LEN;
            let name = self.0.get(at..at + n).unwrap_or_default();
            let value = self.0.get(at + n..at + n + v).unwrap_or_default();
            at += n + v;
            // Both were valid when encoded; a failure here could only be a bug, and a replay
            // missing a header beats a panic on the request path.
            if let (Ok(name), Ok(mut value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                value.set_sensitive(sensitive == 1);
                headers.append(name, value);
            }
        }
        let body = Bytes::copy_from_slice(self.0.get(at..).unwrap_or_default());
        StoredResponse {
            status,
            headers,
            body,
        }
    }

    /// Encoded length (what the allocation holds).
    pub(super) fn len(&self) -> usize {
        self.0.len()
    }

    fn key_end(&self) -> usize {
        KEY_HEAD + read_len(&self.0, 0) + read_len(&self.0, LEN) + read_len(&self.0, 2 * LEN)
    }
}

fn key_len(key: &RecordKey) -> usize {
    KEY_HEAD + key.tenant.len() + key.route.len() + key.key.as_str().len()
}

fn push_key(out: &mut Vec<u8>, key: &RecordKey) -> Option<()> {
    push_len(out, key.tenant.len())?;
    push_len(out, key.route.len())?;
    push_len(out, key.key.as_str().len())?;
    out.extend_from_slice(key.tenant.as_bytes());
    out.extend_from_slice(key.route.as_bytes());
    out.extend_from_slice(key.key.as_str().as_bytes());
    Some(())
}

fn push_len(out: &mut Vec<u8>, n: usize) -> Option<()> {
    out.extend_from_slice(&u32::try_from(n).ok()?.to_le_bytes());
    Some(())
}

/// Reads a length written by [`push_len`]; 0 past the end (never happens for our own bytes).
fn read_len(b: &[u8], at: usize) -> usize {
    b.get(at..at + LEN)
        .and_then(|s| <[u8; LEN]>::try_from(s).ok())
        .map_or(0, |a| u32::from_le_bytes(a) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::IdempotencyKey;

    fn key(t: &str, r: &str, k: &str) -> RecordKey {
        RecordKey::new(t, r, IdempotencyKey::parse(k.as_bytes(), 64).unwrap())
    }

    #[test]
    fn round_trips_key_and_response_byte_for_byte() {
        let k = key("ip:127.0.0.1", "/orders", "abc-123");
        let blob = Blob::key_only(&k).unwrap();
        assert!(blob.key_is(&k));
        assert!(!blob.key_is(&key("ip:127.0.0.1", "/order", "sabc-123")));
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/json".parse().unwrap());
        h.append("set-cookie", "a=1".parse().unwrap());
        h.append("set-cookie", "b=2".parse().unwrap());
        let mut secret = HeaderValue::from_static("s3cr3t");
        secret.set_sensitive(true);
        h.insert("x-custom-token", secret);
        let r = StoredResponse::new(StatusCode::CREATED, &h, Bytes::from_static(b"{\"id\":1}"));
        let full = blob.with_response(&r).unwrap();
        assert!(full.key_is(&k));
        let back = full.response(StatusCode::CREATED);
        assert_eq!(back, r);
        assert!(back.headers["x-custom-token"].is_sensitive());
        assert_eq!(back.headers.get_all("set-cookie").iter().count(), 2);
    }

    #[test]
    fn empty_response_and_empty_parts() {
        let k = key("", "", "k");
        let blob = Blob::key_only(&k).unwrap();
        let r = StoredResponse::new(StatusCode::NO_CONTENT, &HeaderMap::new(), Bytes::new());
        let full = blob.with_response(&r).unwrap();
        assert_eq!(full.response(StatusCode::NO_CONTENT), r);
        assert_eq!(full.len(), KEY_HEAD + 1 + LEN);
    }
}
