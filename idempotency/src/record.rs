//! What a store keeps per key: the record states and the stored response.
//!
//! A record is born `InFlight` by `try_lock` and ends either deleted (`release`) or completed
//! (`complete`), as `Completed` with a replayable response or as `TooLarge` when the response
//! exceeded the storable size. `TooLarge` is a tombstone that still blocks re-execution: the
//! backend acted, the gateway just could not keep the answer.

use std::time::SystemTime;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};

use crate::fingerprint::Fingerprint;

mod codec;

pub use codec::DecodeError;
pub(crate) use codec::{headers_from_json, headers_to_json};

/// A record's states in plain Rust types. Every store keeps these states in its own encoding:
/// [`MemoryStore`](crate::MemoryStore) as one compact allocation per record, Redis and
/// PostgreSQL on server time.
#[derive(Debug, Clone)]
pub enum Record {
    /// The first copy of the request holds the lock and is being executed.
    InFlight {
        /// Fencing token of the current holder.
        fencing: u64,
        /// When the lease expires and another request may take the lock over.
        lease_until: tokio::time::Instant,
        /// Fingerprint of the request that took the lock.
        fingerprint: Fingerprint,
    },
    /// The request finished with a storable response, replayed to duplicates.
    Completed {
        /// Fingerprint of the original request.
        fingerprint: Fingerprint,
        /// The response to replay.
        response: StoredResponse,
    },
    /// The request finished but its response was too large to store; never re-executed.
    TooLarge {
        /// Fingerprint of the original request.
        fingerprint: Fingerprint,
        /// Status of the response that could not be stored.
        status: StatusCode,
    },
}

/// A response as stored for replay: status, end-to-end headers, body bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    /// Status code.
    pub status: StatusCode,
    /// Headers, hop-by-hop ones removed.
    pub headers: HeaderMap,
    /// The complete body, byte for byte.
    pub body: Bytes,
}

/// How a holder finishes a request it executed (argument of [`Store::complete`](crate::Store::complete)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// Keep this response and replay it to duplicates.
    Response(StoredResponse),
    /// The response (of this status) exceeded the storable size: remember that the request
    /// ran, so duplicates get a 409 instead of a second execution.
    TooLarge(StatusCode),
}

/// State of a record, as shown by admin lookups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordState {
    /// Locked by a request in progress.
    InFlight,
    /// Completed; the response is replayed.
    Completed,
    /// Completed; the response was too large to store.
    TooLarge,
}

/// Admin view of one record (see [`Store::get`](crate::Store::get)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordInfo {
    /// Current state.
    pub state: RecordState,
    /// Request fingerprint, lower-case hex.
    pub fingerprint_hex: String,
    /// Fencing token of the latest holder.
    pub fencing: u64,
    /// Stored response status, when completed.
    pub status: Option<u16>,
    /// When the latest holder took the lock (wall clock).
    pub created_at: SystemTime,
    /// When the record will be forgotten if nothing else happens (wall clock). For an
    /// in-flight record this is the retention end in memory and PostgreSQL, and the lease
    /// end in Redis, where the lease is the key's TTL.
    pub expires_at: SystemTime,
}

/// Header whose presence marks a replayed response.
pub static IDEMPOTENT_REPLAYED: HeaderName = HeaderName::from_static("idempotent-replayed");

// === impl RecordState ===

impl RecordState {
    /// Stable string form used in storage (`in_flight`, `completed`, `too_large`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "in_flight",
            Self::Completed => "completed",
            Self::TooLarge => "too_large",
        }
    }

    /// Inverse of [`as_str`](Self::as_str).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "in_flight" => Some(Self::InFlight),
            "completed" => Some(Self::Completed),
            "too_large" => Some(Self::TooLarge),
            _ => None,
        }
    }
}

// === impl StoredResponse ===

impl StoredResponse {
    /// Captures a response for storage, dropping hop-by-hop headers: they describe one
    /// connection, and replaying e.g. `Transfer-Encoding: chunked` over a full body would
    /// corrupt the replay.
    pub fn new(status: StatusCode, headers: &HeaderMap, body: Bytes) -> Self {
        Self {
            status,
            headers: end_to_end_headers(headers),
            body,
        }
    }

    /// Approximate bytes this response occupies in a store (for memory accounting).
    pub fn size_bytes(&self) -> usize {
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| n.as_str().len() + v.len() + 16)
            .sum();
        self.body.len() + headers + 32
    }

    /// Builds the replay: stored status, headers and body byte for byte, plus
    /// `Idempotent-Replayed: true`.
    pub fn to_replay(&self) -> http::Response<axum::body::Body> {
        let mut resp = http::Response::new(axum::body::Body::from(self.body.clone()));
        *resp.status_mut() = self.status;
        *resp.headers_mut() = self.headers.clone();
        resp.headers_mut().insert(
            IDEMPOTENT_REPLAYED.clone(),
            http::HeaderValue::from_static("true"),
        );
        resp
    }
}

/// Copies `headers` without hop-by-hop fields (RFC 9110 §7.6.1): `Connection`, `Keep-Alive`,
/// `Proxy-*`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, and every field named in
/// `Connection`.
pub fn end_to_end_headers(headers: &HeaderMap) -> HeaderMap {
    let named_in_connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        let hop_by_hop = matches!(
            n,
            "connection" | "keep-alive" | "te" | "trailer" | "transfer-encoding" | "upgrade"
        ) || n.starts_with("proxy-")
            || named_in_connection.iter().any(|c| c == n);
        if !hop_by_hop {
            out.append(owned_name(name), owned_value(value));
        }
    }
    out
}

/// A copy that owns its bytes. Header names and values parsed by hyper are slices of the
/// connection's read buffer (8 KiB and more); a stored record keeping one would pin that
/// whole buffer for its 24 h retention — measured at ~9.5 KB per record instead of ~0.5 KB.
fn owned_value(value: &HeaderValue) -> HeaderValue {
    let mut copy = HeaderValue::from_bytes(value.as_bytes()).unwrap_or_else(|_| value.clone());
    copy.set_sensitive(value.is_sensitive());
    copy
}

/// See [`owned_value`]; standard names are static and cost nothing.
fn owned_name(name: &HeaderName) -> HeaderName {
    HeaderName::from_bytes(name.as_str().as_bytes()).unwrap_or_else(|_| name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_hop_by_hop_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-hop".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("proxy-authenticate", "Basic".parse().unwrap());
        h.insert("te", "trailers".parse().unwrap());
        h.insert("trailer", "x-sum".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("upgrade", "h2c".parse().unwrap());
        h.insert("x-hop", "1".parse().unwrap());
        h.insert("content-type", "application/json".parse().unwrap());
        h.append("set-cookie", "a=1".parse().unwrap());
        h.append("set-cookie", "b=2".parse().unwrap());
        let r = StoredResponse::new(StatusCode::CREATED, &h, Bytes::from_static(b"{}"));
        let names: Vec<_> = r.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(names, ["content-type", "set-cookie"]);
        assert_eq!(r.headers.get_all("set-cookie").iter().count(), 2);
    }

    #[test]
    fn replay_marks_header() {
        let r = StoredResponse::new(StatusCode::OK, &HeaderMap::new(), Bytes::new());
        let resp = r.to_replay();
        assert_eq!(resp.headers()[&IDEMPOTENT_REPLAYED], "true");
    }

    #[test]
    fn state_strings_round_trip() {
        for s in [
            RecordState::InFlight,
            RecordState::Completed,
            RecordState::TooLarge,
        ] {
            assert_eq!(RecordState::parse(s.as_str()), Some(s));
        }
    }
}
