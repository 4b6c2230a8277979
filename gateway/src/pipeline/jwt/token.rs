//! A compact JWS (RFC 7515 §7.1) taken apart, and its claims checked (RFC 7519 §4.1) against
//! a wall-clock time the caller passes in, so tests choose the time.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::JwtError;

/// Longest token looked at; the head limit bounds it already, this keeps decoding cheap.
const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// The JOSE header members the gateway reads.
#[derive(Debug, Deserialize)]
pub(crate) struct Header {
    /// The signing algorithm the token claims.
    pub(crate) alg: String,
    /// Which key signed it.
    pub(crate) kid: Option<String>,
    /// Critical extensions (any → refused).
    crit: Option<Value>,
}

/// A token split at its dots, header decoded.
#[derive(Debug)]
pub(crate) struct Parsed<'a> {
    pub(crate) header: Header,
    /// `base64url(header) '.' base64url(payload)`: what the signature covers.
    pub(crate) signing_input: &'a str,
    payload: &'a str,
    signature: &'a str,
}

/// What a token must say to be accepted.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules<'a> {
    pub(crate) issuer: &'a str,
    pub(crate) audiences: &'a [String],
    pub(crate) skew_secs: u64,
    pub(crate) tenant_claim: &'a str,
}

// === impl Parsed ===

impl<'a> Parsed<'a> {
    /// Splits `token` and decodes its header; `Err` for anything but three base64url
    /// segments with a JSON object header naming `alg`.
    pub(crate) fn parse(token: &'a str) -> Result<Self, JwtError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(JwtError::Malformed);
        }
        let mut parts = token.split('.');
        let (Some(header), Some(payload), Some(signature), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed);
        };
        let bytes = URL_SAFE_NO_PAD
            .decode(header)
            .map_err(|_| JwtError::Malformed)?;
        let header: Header = serde_json::from_slice(&bytes).map_err(|_| JwtError::Malformed)?;
        if header.crit.is_some() {
            return Err(JwtError::Critical);
        }
        Ok(Self {
            header,
            signing_input: &token[..token.len() - signature.len() - 1],
            payload,
            signature,
        })
    }

    /// The signature bytes.
    pub(crate) fn signature(&self) -> Result<Vec<u8>, JwtError> {
        URL_SAFE_NO_PAD
            .decode(self.signature)
            .map_err(|_| JwtError::Malformed)
    }

    /// The claims object (read only after the signature verified).
    pub(crate) fn claims(&self) -> Result<Map<String, Value>, JwtError> {
        let bytes = URL_SAFE_NO_PAD
            .decode(self.payload)
            .map_err(|_| JwtError::Malformed)?;
        serde_json::from_slice(&bytes).map_err(|_| JwtError::Malformed)
    }
}

/// Whether a bearer credential is a JWT rather than an API key: three segments whose first
/// decodes to a JSON header naming `alg`. An opaque API key never does.
pub(crate) fn looks_like_jwt(token: &str) -> bool {
    token.bytes().filter(|b| *b == b'.').count() == 2
        && matches!(Parsed::parse(token), Ok(_) | Err(JwtError::Critical))
}

/// Checks time, issuer and audience, and returns the tenant id. `now` is Unix seconds.
pub(crate) fn check_claims(
    claims: &Map<String, Value>,
    rules: Rules<'_>,
    now: u64,
) -> Result<String, JwtError> {
    let skew = rules.skew_secs as f64;
    let now = now as f64;
    // A token without an expiry would be valid forever once leaked: refused.
    match claims.get("exp").and_then(Value::as_f64) {
        Some(exp) if now < exp + skew => {}
        _ => return Err(JwtError::Expired),
    }
    match claims.get("nbf") {
        None => {}
        Some(nbf) => match nbf.as_f64() {
            Some(nbf) if nbf <= now + skew => {}
            Some(_) => return Err(JwtError::NotYetValid),
            None => return Err(JwtError::Malformed),
        },
    }
    if claims.get("iss").and_then(Value::as_str) != Some(rules.issuer) {
        return Err(JwtError::Issuer);
    }
    let accepted = |aud: &Value| {
        aud.as_str()
            .is_some_and(|a| rules.audiences.iter().any(|want| want == a))
    };
    let audience_ok = match claims.get("aud") {
        Some(Value::Array(values)) => values.iter().any(accepted),
        Some(value) => accepted(value),
        None => false,
    };
    if !audience_ok {
        return Err(JwtError::Audience);
    }
    claims
        .get(rules.tenant_claim)
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .ok_or(JwtError::MissingTenant)
}

/// A claim's value as a header value: strings as they are, numbers and booleans as JSON,
/// arrays of those joined with `,` (the list syntax of RFC 9110 §5.6.1); objects and nulls
/// are not forwarded.
pub(crate) fn claim_header_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(_) | Value::Bool(_) => Some(value.to_string()),
        Value::Array(items) => {
            let parts: Option<Vec<String>> = items
                .iter()
                .map(|v| match v {
                    Value::Array(_) => None,
                    other => claim_header_text(other),
                })
                .collect();
            parts.map(|p| p.join(","))
        }
        Value::Null | Value::Object(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const NOW: u64 = 1_700_000_000;

    fn rules(audiences: &[String]) -> Rules<'_> {
        Rules {
            issuer: "https://idp",
            audiences,
            skew_secs: 60,
            tenant_claim: "org_id",
        }
    }

    fn claims(extra: Value) -> Map<String, Value> {
        let mut base =
            json!({"iss": "https://idp", "aud": "api", "exp": NOW + 300, "org_id": "acme"});
        if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
            base.extend(extra);
        }
        base.as_object().cloned().unwrap()
    }

    #[test]
    fn accepts_a_good_token_and_returns_the_tenant() {
        let aud = vec!["api".to_owned()];
        assert_eq!(
            check_claims(&claims(json!({})), rules(&aud), NOW).unwrap(),
            "acme"
        );
        let list = claims(json!({"aud": ["other", "api"]}));
        assert_eq!(check_claims(&list, rules(&aud), NOW).unwrap(), "acme");
    }

    #[test]
    fn time_is_checked_with_the_skew() {
        let aud = vec!["api".to_owned()];
        let exp = claims(json!({"exp": NOW - 30}));
        assert!(check_claims(&exp, rules(&aud), NOW).is_ok(), "within skew");
        let exp = claims(json!({"exp": NOW - 60}));
        assert_eq!(check_claims(&exp, rules(&aud), NOW), Err(JwtError::Expired));
        let mut none = claims(json!({}));
        none.remove("exp");
        assert_eq!(
            check_claims(&none, rules(&aud), NOW),
            Err(JwtError::Expired)
        );
        let nbf = claims(json!({"nbf": NOW + 60}));
        assert!(check_claims(&nbf, rules(&aud), NOW).is_ok(), "within skew");
        let nbf = claims(json!({"nbf": NOW + 61}));
        assert_eq!(
            check_claims(&nbf, rules(&aud), NOW),
            Err(JwtError::NotYetValid)
        );
        let nbf = claims(json!({"nbf": "soon"}));
        assert_eq!(
            check_claims(&nbf, rules(&aud), NOW),
            Err(JwtError::Malformed)
        );
    }

    #[test]
    fn issuer_audience_and_tenant_are_required() {
        let aud = vec!["api".to_owned()];
        let cases = [
            (json!({"iss": "https://evil"}), JwtError::Issuer),
            (json!({"aud": "web"}), JwtError::Audience),
            (json!({"aud": ["web", 7]}), JwtError::Audience),
            (json!({"org_id": 42}), JwtError::MissingTenant),
            (json!({"org_id": ""}), JwtError::MissingTenant),
        ];
        for (extra, want) in cases {
            let c = claims(extra.clone());
            assert_eq!(check_claims(&c, rules(&aud), NOW), Err(want), "{extra}");
        }
        let mut no_aud = claims(json!({}));
        no_aud.remove("aud");
        assert_eq!(
            check_claims(&no_aud, rules(&aud), NOW),
            Err(JwtError::Audience)
        );
    }

    #[test]
    fn parses_only_compact_jws_with_a_json_header() {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256","kid":"k1"}"#);
        let token = format!("{header}.e30.c2ln");
        let parsed = Parsed::parse(&token).unwrap();
        assert_eq!(parsed.header.kid.as_deref(), Some("k1"));
        assert_eq!(parsed.signing_input, format!("{header}.e30"));
        assert!(looks_like_jwt(&token));
        for bad in ["acme-key-0001", "a.b.c", "a.b", &format!("{token}.x"), ""] {
            assert!(!looks_like_jwt(bad), "{bad}");
        }
        let crit = URL_SAFE_NO_PAD.encode(br#"{"alg":"ES256","crit":["b64"]}"#);
        assert_eq!(
            Parsed::parse(&format!("{crit}.e30.c2ln")).unwrap_err(),
            JwtError::Critical
        );
    }

    #[test]
    fn claims_become_header_text() {
        assert_eq!(claim_header_text(&json!("u1")).as_deref(), Some("u1"));
        assert_eq!(claim_header_text(&json!(7)).as_deref(), Some("7"));
        assert_eq!(
            claim_header_text(&json!(["a", "b"])).as_deref(),
            Some("a,b")
        );
        assert_eq!(claim_header_text(&json!({"a": 1})), None);
        assert_eq!(claim_header_text(&json!([["a"]])), None);
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics(token in ".{0,200}") {
            let _ = looks_like_jwt(&token);
            if let Ok(parsed) = Parsed::parse(&token) {
                let _ = parsed.signature();
                let _ = parsed.claims();
            }
        }
    }
}
