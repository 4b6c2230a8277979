//! Parsing and validation of the `Idempotency-Key` request header.
//!
//! The IETF draft (draft-ietf-httpapi-idempotency-key-header) defines the header as a
//! structured-field *string* (`Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"`), while
//! most clients in the wild (Stripe's SDKs among them) send a bare token. Both forms are
//! accepted; the key is the unescaped content. Validation is deliberately strict — 1 to
//! `max_len` *visible* ASCII characters (0x21–0x7E) — because the key ends up in storage keys,
//! logs and upstream headers, where whitespace and control bytes only cause trouble.

use std::fmt;

use http::HeaderMap;

/// The request header carrying the key.
pub use portcullis_problem::headers::IDEMPOTENCY_KEY;

/// Default maximum key length: docs/retry-policy.md (keys of at most 64 characters).
pub const DEFAULT_MAX_KEY_LEN: usize = 64;

/// Largest `max_key_len` a route may configure.
pub const MAX_KEY_LEN_LIMIT: usize = 255;

/// A validated idempotency key: 1..=max visible ASCII characters, escapes already removed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

/// Why an `Idempotency-Key` header was refused (each becomes a 400 problem+json).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The header was absent on a route that requires it.
    #[error("the Idempotency-Key header is required on this route")]
    Missing,
    /// The header appeared more than once.
    #[error("the Idempotency-Key header must appear exactly once")]
    Repeated,
    /// The key is empty after parsing.
    #[error("the Idempotency-Key must not be empty")]
    Empty,
    /// The key is longer than allowed.
    #[error("the Idempotency-Key is {len} characters long; at most {max} are allowed")]
    TooLong {
        /// Length of the presented key.
        len: usize,
        /// Configured maximum.
        max: usize,
    },
    /// A character outside visible ASCII (0x21–0x7E) was found.
    #[error("the Idempotency-Key contains a character outside visible ASCII (0x21-0x7E) at position {position}")]
    InvalidChar {
        /// Zero-based byte offset in the header value.
        position: usize,
    },
    /// A quoted key is not a valid RFC 8941 sf-string (bad escape, missing closing quote,
    /// or trailing data).
    #[error("the Idempotency-Key is not a valid structured-field string: {0}")]
    MalformedString(&'static str),
}

// === impl IdempotencyKey ===

impl IdempotencyKey {
    /// Parses one header value (bare token or sf-string) and checks `1..=max_len` visible
    /// ASCII characters. `max_len` is clamped to `1..=255`.
    pub fn parse(raw: &[u8], max_len: usize) -> Result<Self, KeyError> {
        let max = max_len.clamp(1, MAX_KEY_LEN_LIMIT);
        let raw = trim_ows(raw);
        let key = match raw.first() {
            Some(b'"') => parse_sf_string(raw)?,
            _ => {
                if let Some(position) = raw.iter().position(|b| !is_visible(*b)) {
                    return Err(KeyError::InvalidChar { position });
                }
                // All bytes are ASCII, so this conversion cannot fail.
                String::from_utf8_lossy(raw).into_owned()
            }
        };
        match key.len() {
            0 => Err(KeyError::Empty),
            len if len > max => Err(KeyError::TooLong { len, max }),
            _ => Ok(Self(key)),
        }
    }

    /// Reads the key from request headers: `Ok(None)` when absent, an error when repeated or
    /// invalid.
    pub fn from_headers(headers: &HeaderMap, max_len: usize) -> Result<Option<Self>, KeyError> {
        let mut values = headers.get_all(&IDEMPOTENCY_KEY).iter();
        let Some(first) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(KeyError::Repeated);
        }
        Self::parse(first.as_bytes(), max_len).map(Some)
    }

    /// The key as a string slice (visible ASCII only).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Keys are client secrets of a sort (they correlate payments); `Debug` shows only a prefix so
/// a stray `?lock` in a log line does not leak them whole.
impl fmt::Debug for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self.0.chars().take(6).collect();
        write!(f, "IdempotencyKey({shown}…, len={})", self.0.len())
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn is_visible(b: u8) -> bool {
    (0x21..=0x7e).contains(&b)
}

fn trim_ows(mut raw: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = raw {
        raw = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = raw {
        raw = rest;
    }
    raw
}

/// RFC 8941 §4.2.5: `"` then `\"`/`\\` escapes or chars in 0x20–0x7E, then `"` ending the
/// value. Space is legal in an sf-string but not in a key, so it is refused afterwards by the
/// visibility check (reported at its position).
fn parse_sf_string(raw: &[u8]) -> Result<String, KeyError> {
    let mut out = String::with_capacity(raw.len());
    let mut i = 1;
    while i < raw.len() {
        match raw[i] {
            b'\\' => match raw.get(i + 1) {
                Some(&c @ (b'"' | b'\\')) => {
                    out.push(char::from(c));
                    i += 2;
                }
                _ => return Err(KeyError::MalformedString("invalid escape")),
            },
            b'"' => {
                if i + 1 != raw.len() {
                    return Err(KeyError::MalformedString("data after the closing quote"));
                }
                return Ok(out);
            }
            c if is_visible(c) => {
                out.push(char::from(c));
                i += 1;
            }
            _ => return Err(KeyError::InvalidChar { position: i }),
        }
    }
    Err(KeyError::MalformedString("missing closing quote"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bare_and_quoted_forms() {
        let k = IdempotencyKey::parse(b"8e03978e-40d5-43e8", 64).unwrap();
        assert_eq!(k.as_str(), "8e03978e-40d5-43e8");
        let q = IdempotencyKey::parse(br#""8e03978e-40d5-43e8""#, 64).unwrap();
        assert_eq!(k, q);
        let esc = IdempotencyKey::parse(br#""a\"b\\c""#, 64).unwrap();
        assert_eq!(esc.as_str(), r#"a"b\c"#);
        assert_eq!(
            IdempotencyKey::parse(b"  abc\t", 64).unwrap().as_str(),
            "abc"
        );
    }

    #[test]
    fn length_limits() {
        assert!(IdempotencyKey::parse(&[b'a'; 64], 64).is_ok());
        assert_eq!(
            IdempotencyKey::parse(&[b'a'; 65], 64),
            Err(KeyError::TooLong { len: 65, max: 64 })
        );
        assert!(IdempotencyKey::parse(&[b'a'; 255], 255).is_ok());
        // Configured values above 255 are clamped.
        assert!(IdempotencyKey::parse(&[b'a'; 256], 1000).is_err());
        assert_eq!(IdempotencyKey::parse(b"", 64), Err(KeyError::Empty));
        assert_eq!(IdempotencyKey::parse(b"\"\"", 64), Err(KeyError::Empty));
    }

    #[test]
    fn refuses_invalid_characters_and_strings() {
        assert_eq!(
            IdempotencyKey::parse(b"ab cd", 64),
            Err(KeyError::InvalidChar { position: 2 })
        );
        assert!(IdempotencyKey::parse("ké".as_bytes(), 64).is_err());
        assert!(IdempotencyKey::parse(br#""a b""#, 64).is_err());
        assert!(matches!(
            IdempotencyKey::parse(br#""abc"#, 64),
            Err(KeyError::MalformedString(_))
        ));
        assert!(matches!(
            IdempotencyKey::parse(br#""a\nb""#, 64),
            Err(KeyError::MalformedString(_))
        ));
        assert!(matches!(
            IdempotencyKey::parse(br#""abc"x"#, 64),
            Err(KeyError::MalformedString(_))
        ));
    }

    #[test]
    fn repeated_header_is_refused() {
        let mut h = HeaderMap::new();
        assert_eq!(IdempotencyKey::from_headers(&h, 64), Ok(None));
        h.append(&IDEMPOTENCY_KEY, "a".parse().unwrap());
        h.append(&IDEMPOTENCY_KEY, "b".parse().unwrap());
        assert_eq!(
            IdempotencyKey::from_headers(&h, 64),
            Err(KeyError::Repeated)
        );
    }

    proptest! {
        #[test]
        fn any_visible_ascii_key_round_trips_through_sf_string(key in "[!-~]{1,64}") {
            let quoted = format!(
                "\"{}\"",
                key.replace('\\', "\\\\").replace('"', "\\\"")
            );
            let parsed = IdempotencyKey::parse(quoted.as_bytes(), 64).unwrap();
            prop_assert_eq!(parsed.as_str(), key.as_str());
        }

        #[test]
        fn never_panics(raw in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = IdempotencyKey::parse(&raw, 64);
        }
    }
}
