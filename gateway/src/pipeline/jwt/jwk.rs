//! JSON Web Key sets (RFC 7517) and the three JWS algorithms the gateway verifies, on `ring`
//! (already built for rustls): RS256 (RFC 7518 §3.3), ES256 (§3.4, `r‖s` signatures) and
//! EdDSA with Ed25519 (RFC 8037).
//!
//! Each key is bound to one algorithm when the set is parsed (RSA → RS256, EC P-256 →
//! ES256, OKP Ed25519 → EdDSA, and the key's own `alg` must agree), so a token can never
//! pick how a key is used: the classic confusions (`alg: none`, an RSA public key used as an
//! HMAC secret) have no code path here at all.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Deserialize;

/// A key set bigger than this is cut: a token without `kid` is tried against every key of
/// its algorithm, so the bound is also the worst-case verification work per request.
pub(crate) const MAX_KEYS: usize = 64;
/// RSA moduli below 2048 bits are refused (ring refuses them too; skipping them at parse
/// time makes the log say why).
const MIN_RSA_BYTES: usize = 256;

/// A JWS algorithm the gateway verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    Rs256,
    /// ECDSA on P-256 with SHA-256.
    Es256,
    /// Ed25519.
    EdDsa,
}

/// One usable public key.
#[derive(Clone)]
pub(crate) struct Jwk {
    kid: Option<String>,
    alg: Algorithm,
    key: PublicKey,
}

#[derive(Clone)]
enum PublicKey {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// Uncompressed SEC1 point: `0x04 ‖ x ‖ y`.
    P256(Vec<u8>),
    Ed25519(Vec<u8>),
}

/// The usable keys of a JWKS document.
#[derive(Debug, Clone, Default)]
pub struct KeySet {
    keys: Vec<Jwk>,
}

/// A JWKS document that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JwksError {
    /// Not JSON, or not `{"keys": [...]}`.
    #[error("not a JWK set: {0}")]
    Json(#[from] serde_json::Error),
    /// No key of a supported type (RSA ≥ 2048 bits, EC P-256, OKP Ed25519, `use` = sig).
    #[error("no usable key ({0} skipped: unsupported type, curve, algorithm or use)")]
    NoUsableKey(usize),
}

#[derive(Deserialize)]
struct RawSet {
    keys: Vec<RawKey>,
}

/// The members of a JWK the gateway reads; others (`x5c`, `key_ops`…) are ignored.
#[derive(Deserialize)]
struct RawKey {
    kty: String,
    kid: Option<String>,
    alg: Option<String>,
    #[serde(rename = "use")]
    use_: Option<String>,
    crv: Option<String>,
    n: Option<String>,
    e: Option<String>,
    x: Option<String>,
    y: Option<String>,
}

// === impl Algorithm ===

impl Algorithm {
    /// Every supported algorithm, the default of `auth.jwt.algorithms`.
    pub const ALL: [Self; 3] = [Self::Rs256, Self::Es256, Self::EdDsa];

    /// The algorithm a JOSE `alg` names, if supported.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "RS256" => Some(Self::Rs256),
            "ES256" => Some(Self::Es256),
            "EdDSA" => Some(Self::EdDsa),
            _ => None,
        }
    }

    /// The JOSE name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rs256 => "RS256",
            Self::Es256 => "ES256",
            Self::EdDsa => "EdDSA",
        }
    }
}

// === impl Jwk ===

impl Jwk {
    fn from_raw(raw: RawKey) -> Option<Self> {
        if raw.use_.as_deref().is_some_and(|u| u != "sig") {
            return None;
        }
        let b64 = |v: &Option<String>| URL_SAFE_NO_PAD.decode(v.as_deref()?).ok();
        let (alg, key) = match (raw.kty.as_str(), raw.crv.as_deref()) {
            ("RSA", _) => {
                let (n, e) = (b64(&raw.n)?, b64(&raw.e)?);
                let significant = n.iter().skip_while(|b| **b == 0).count();
                if significant < MIN_RSA_BYTES || e.is_empty() {
                    return None;
                }
                (Algorithm::Rs256, PublicKey::Rsa { n, e })
            }
            ("EC", Some("P-256")) => {
                let (x, y) = (b64(&raw.x)?, b64(&raw.y)?);
                if x.len() != 32 || y.len() != 32 {
                    return None;
                }
                let mut point = Vec::with_capacity(65);
                point.push(0x04);
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                (Algorithm::Es256, PublicKey::P256(point))
            }
            ("OKP", Some("Ed25519")) => {
                let x = b64(&raw.x)?;
                if x.len() != 32 {
                    return None;
                }
                (Algorithm::EdDsa, PublicKey::Ed25519(x))
            }
            _ => return None,
        };
        // A key that declares its algorithm is used with that one only.
        if raw.alg.as_deref().is_some_and(|a| a != alg.name()) {
            return None;
        }
        Some(Self {
            kid: raw.kid,
            alg,
            key,
        })
    }

    /// Whether `signature` over `message` is valid under this key.
    pub(crate) fn verify(&self, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature as sig;
        match &self.key {
            PublicKey::Rsa { n, e } => sig::RsaPublicKeyComponents {
                n: n.as_slice(),
                e: e.as_slice(),
            }
            .verify(&sig::RSA_PKCS1_2048_8192_SHA256, message, signature)
            .is_ok(),
            PublicKey::P256(point) => {
                sig::UnparsedPublicKey::new(&sig::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
            PublicKey::Ed25519(x) => sig::UnparsedPublicKey::new(&sig::ED25519, x)
                .verify(message, signature)
                .is_ok(),
        }
    }
}

impl std::fmt::Debug for Jwk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwk")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

// === impl KeySet ===

impl KeySet {
    /// The usable keys of a JWKS document; unusable ones are skipped, and a document with
    /// none at all is an error (so a broken refresh never replaces good keys).
    pub fn parse(json: &[u8]) -> Result<Self, JwksError> {
        let raw: RawSet = serde_json::from_slice(json)?;
        let total = raw.keys.len();
        let keys: Vec<Jwk> = raw
            .keys
            .into_iter()
            .filter_map(Jwk::from_raw)
            .take(MAX_KEYS)
            .collect();
        if keys.is_empty() {
            return Err(JwksError::NoUsableKey(total));
        }
        Ok(Self { keys })
    }

    /// Number of usable keys.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the set has no key (before the first fetch).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether some key carries this `kid`.
    pub(crate) fn has_kid(&self, kid: &str) -> bool {
        self.keys.iter().any(|k| k.kid.as_deref() == Some(kid))
    }

    /// The keys a token with `alg` and `kid` may be verified with: the key with that `kid`
    /// (and algorithm), or without a `kid` every key of the algorithm.
    pub(crate) fn candidates<'a>(
        &'a self,
        alg: Algorithm,
        kid: Option<&'a str>,
    ) -> impl Iterator<Item = &'a Jwk> + 'a {
        self.keys
            .iter()
            .filter(move |k| k.alg == alg && (kid.is_none() || k.kid.as_deref() == kid))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_keys_to_algorithms_and_skips_the_rest() {
        let x = URL_SAFE_NO_PAD.encode([7u8; 32]);
        let n = URL_SAFE_NO_PAD.encode([0xC5u8; 256]);
        let small_n = URL_SAFE_NO_PAD.encode([0xC5u8; 128]);
        let doc = serde_json::json!({"keys": [
            {"kty": "OKP", "crv": "Ed25519", "kid": "ed", "x": x},
            {"kty": "EC", "crv": "P-256", "kid": "ec", "x": x, "y": x},
            {"kty": "RSA", "kid": "rsa", "n": n, "e": "AQAB", "alg": "RS256", "use": "sig"},
            {"kty": "RSA", "kid": "small", "n": small_n, "e": "AQAB"},
            {"kty": "RSA", "kid": "pss", "n": n, "e": "AQAB", "alg": "PS256"},
            {"kty": "RSA", "kid": "enc", "n": n, "e": "AQAB", "use": "enc"},
            {"kty": "EC", "crv": "P-384", "kid": "p384", "x": x, "y": x},
            {"kty": "oct", "kid": "hmac", "k": x},
        ]});
        let set = KeySet::parse(doc.to_string().as_bytes()).unwrap();
        assert_eq!(set.len(), 3);
        assert!(set.has_kid("ed") && set.has_kid("ec") && set.has_kid("rsa"));
        assert!(!set.has_kid("hmac") && !set.has_kid("small") && !set.has_kid("pss"));
        assert_eq!(set.candidates(Algorithm::Rs256, Some("ed")).count(), 0);
        assert_eq!(set.candidates(Algorithm::EdDsa, None).count(), 1);
    }

    #[test]
    fn a_set_without_usable_keys_is_an_error() {
        assert!(matches!(
            KeySet::parse(br#"{"keys": [{"kty": "oct", "k": "AAAA"}]}"#),
            Err(JwksError::NoUsableKey(1))
        ));
        assert!(matches!(KeySet::parse(b"<html>"), Err(JwksError::Json(_))));
    }

    #[test]
    fn verifies_ed25519_signatures() {
        use ring::signature::{Ed25519KeyPair, KeyPair};
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let doc = serde_json::json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k",
            "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())}]});
        let set = KeySet::parse(doc.to_string().as_bytes()).unwrap();
        let key = set.candidates(Algorithm::EdDsa, Some("k")).next().unwrap();
        let signature = pair.sign(b"message");
        assert!(key.verify(b"message", signature.as_ref()));
        assert!(!key.verify(b"massage", signature.as_ref()));
    }
}
