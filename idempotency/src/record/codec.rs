//! Serialization of [`StoredResponse`] for out-of-process stores.
//!
//! Two encodings, each chosen for its store:
//!
//! - **Binary** (Redis): one length-prefixed blob, `v1 | status u16 | n u32 | (name u16,
//!   value u32)* | body`. A body is opaque bytes and must round-trip exactly; JSON would
//!   need base64 (+33 %) and a second copy, and Redis only needs an opaque value.
//! - **JSON headers** (PostgreSQL `jsonb`): `[["content-type","application/json"], …]`, in
//!   order, duplicates kept, so an operator can read them in `psql`. Header values may carry
//!   obs-text bytes (0x80–0xFF) that are not UTF-8; each byte is mapped to the code point of
//!   the same number (Latin-1), which is lossless both ways. The body goes to `bytea`.

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::StoredResponse;

const VERSION: u8 = 1;

/// A stored response could not be decoded (corrupt or foreign data in the store).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored response is corrupt: {0}")]
pub struct DecodeError(pub &'static str);

// === impl StoredResponse ===

impl StoredResponse {
    /// Encodes into the compact binary form (see module docs).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.size_bytes());
        out.push(VERSION);
        out.extend_from_slice(&self.status.as_u16().to_be_bytes());
        out.extend_from_slice(&(self.headers.len() as u32).to_be_bytes());
        for (name, value) in &self.headers {
            // Header names are at most 64 KiB in `http`; values are checked by `hyper` limits.
            out.extend_from_slice(&(name.as_str().len() as u16).to_be_bytes());
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(&(value.len() as u32).to_be_bytes());
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&self.body);
        out
    }

    /// Decodes the binary form produced by [`encode`](Self::encode).
    pub fn decode(data: &[u8]) -> Result<Self, DecodeError> {
        let mut r = Reader(data);
        if r.take(1)? != [VERSION] {
            return Err(DecodeError("unknown version"));
        }
        let status = StatusCode::from_u16(r.u16()?).map_err(|_| DecodeError("bad status"))?;
        let count = r.u32()? as usize;
        let mut headers = HeaderMap::with_capacity(count.min(256));
        for _ in 0..count {
            let n = r.u16()? as usize;
            let name =
                HeaderName::from_bytes(r.take(n)?).map_err(|_| DecodeError("bad header name"))?;
            let v = r.u32()? as usize;
            let value =
                HeaderValue::from_bytes(r.take(v)?).map_err(|_| DecodeError("bad header value"))?;
            headers.append(name, value);
        }
        Ok(Self {
            status,
            headers,
            body: Bytes::copy_from_slice(r.0),
        })
    }
}

/// Encodes headers as a JSON array of `[name, value]` pairs (values Latin-1 mapped).
pub fn headers_to_json(headers: &HeaderMap) -> String {
    let pairs: Vec<[String; 2]> = headers
        .iter()
        .map(|(n, v)| {
            let value: String = v.as_bytes().iter().map(|&b| char::from(b)).collect();
            [n.as_str().to_owned(), value]
        })
        .collect();
    // Serializing strings cannot fail.
    serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".to_owned())
}

/// Decodes [`headers_to_json`] output.
pub fn headers_from_json(json: &str) -> Result<HeaderMap, DecodeError> {
    let pairs: Vec<(String, String)> =
        serde_json::from_str(json).map_err(|_| DecodeError("headers are not a JSON pair list"))?;
    let mut headers = HeaderMap::with_capacity(pairs.len());
    for (name, value) in pairs {
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| DecodeError("bad header name"))?;
        let bytes = value
            .chars()
            .map(|c| u8::try_from(u32::from(c)).map_err(|_| DecodeError("bad header byte")))
            .collect::<Result<Vec<u8>, _>>()?;
        let value = HeaderValue::from_bytes(&bytes).map_err(|_| DecodeError("bad header value"))?;
        headers.append(name, value);
    }
    Ok(headers)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError("truncated"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(body: Vec<u8>) -> StoredResponse {
        let mut h = HeaderMap::new();
        h.insert("content-type", "application/octet-stream".parse().unwrap());
        h.append("set-cookie", "a=1".parse().unwrap());
        h.append("set-cookie", "b=2".parse().unwrap());
        h.insert("x-latin", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        StoredResponse {
            status: StatusCode::CREATED,
            headers: h,
            body: Bytes::from(body),
        }
    }

    #[test]
    fn binary_round_trip_and_corruption() {
        let r = sample(vec![0, 255, 10, 13]);
        assert_eq!(StoredResponse::decode(&r.encode()).unwrap(), r);
        let enc = r.encode();
        assert!(StoredResponse::decode(&enc[..5]).is_err());
        assert!(StoredResponse::decode(&[9]).is_err());
    }

    #[test]
    fn json_headers_round_trip_including_obs_text() {
        let r = sample(vec![]);
        let json = headers_to_json(&r.headers);
        assert_eq!(headers_from_json(&json).unwrap(), r.headers);
        assert!(headers_from_json("{}").is_err());
    }

    proptest! {
        #[test]
        fn any_body_round_trips(body in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let r = sample(body);
            prop_assert_eq!(StoredResponse::decode(&r.encode()).unwrap(), r);
        }
    }
}
