//! Signing keys and tokens for the JWT tests: Ed25519 and ES256 keys generated per test,
//! and one committed 2048-bit RSA key (`keys/jwt-rs256.pem`; ring cannot generate RSA keys
//! and generating one per test would be slow). Tokens are compact JWS strings built by hand,
//! so tests can also make the malformed ones (`alg: none`, a bad signature).

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use serde_json::{json, Value};

/// The committed RSA test key (PKCS#8 PEM). Test material only.
const RSA_PEM: &str = include_str!("../keys/jwt-rs256.pem");

/// A private key with its `kid`.
pub struct SigningKey {
    kid: String,
    inner: Inner,
}

enum Inner {
    Ed25519(Ed25519KeyPair),
    Es256(EcdsaKeyPair),
    Rs256(RsaKeyPair),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("kid", &self.kid)
            .field("alg", &self.alg())
            .finish()
    }
}

// === impl SigningKey ===

impl SigningKey {
    /// A fresh Ed25519 key (`EdDSA`).
    pub fn ed25519(kid: &str) -> Self {
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).expect("ed25519 key");
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).expect("ed25519 pkcs8");
        Self::new(kid, Inner::Ed25519(pair))
    }

    /// A fresh P-256 key (`ES256`).
    pub fn es256(kid: &str) -> Self {
        let alg = &signature::ECDSA_P256_SHA256_FIXED_SIGNING;
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(alg, &rng).expect("p256 key");
        let pair = EcdsaKeyPair::from_pkcs8(alg, pkcs8.as_ref(), &rng).expect("p256 pkcs8");
        Self::new(kid, Inner::Es256(pair))
    }

    /// The committed 2048-bit RSA key (`RS256`).
    pub fn rs256(kid: &str) -> Self {
        let body: String = RSA_PEM
            .lines()
            .filter(|l| !l.starts_with("-----"))
            .collect();
        let der = STANDARD.decode(body).expect("PEM body");
        Self::new(
            kid,
            Inner::Rs256(RsaKeyPair::from_pkcs8(&der).expect("rsa pkcs8")),
        )
    }

    fn new(kid: &str, inner: Inner) -> Self {
        Self {
            kid: kid.to_owned(),
            inner,
        }
    }

    /// The `kid`.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// The JOSE `alg`.
    pub fn alg(&self) -> &'static str {
        match self.inner {
            Inner::Ed25519(_) => "EdDSA",
            Inner::Es256(_) => "ES256",
            Inner::Rs256(_) => "RS256",
        }
    }

    /// The public JWK.
    pub fn jwk(&self) -> Value {
        let b64 = |bytes: &[u8]| URL_SAFE_NO_PAD.encode(bytes);
        match &self.inner {
            Inner::Ed25519(pair) => json!({"kty": "OKP", "crv": "Ed25519", "kid": self.kid,
                "use": "sig", "x": b64(pair.public_key().as_ref())}),
            Inner::Es256(pair) => {
                let point = pair.public_key().as_ref();
                json!({"kty": "EC", "crv": "P-256", "kid": self.kid, "alg": "ES256",
                    "x": b64(&point[1..33]), "y": b64(&point[33..65])})
            }
            Inner::Rs256(pair) => {
                let public = signature::RsaPublicKeyComponents::<Vec<u8>>::from(pair.public());
                json!({"kty": "RSA", "kid": self.kid, "alg": "RS256", "use": "sig",
                    "n": b64(&public.n), "e": b64(&public.e)})
            }
        }
    }

    /// A token with the usual header (`alg`, `kid`, `typ`) over `claims`.
    pub fn sign(&self, claims: &Value) -> String {
        self.sign_with_header(
            &json!({"alg": self.alg(), "kid": self.kid, "typ": "JWT"}),
            claims,
        )
    }

    /// A token with exactly `header` over `claims`, signed with this key.
    pub fn sign_with_header(&self, header: &Value, claims: &Value) -> String {
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = SystemRandom::new();
        let signature = match &self.inner {
            Inner::Ed25519(pair) => pair.sign(input.as_bytes()).as_ref().to_vec(),
            Inner::Es256(pair) => pair
                .sign(&rng, input.as_bytes())
                .expect("ecdsa sign")
                .as_ref()
                .to_vec(),
            Inner::Rs256(pair) => {
                let mut out = vec![0; pair.public().modulus_len()];
                pair.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rng,
                    input.as_bytes(),
                    &mut out,
                )
                .expect("rsa sign");
                out
            }
        };
        format!("{input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

/// A JWKS document holding `keys`' public halves.
pub fn jwks(keys: &[&SigningKey]) -> String {
    json!({ "keys": keys.iter().map(|k| k.jwk()).collect::<Vec<_>>() }).to_string()
}

/// An unsigned token (`alg: none`, empty signature), as an attacker would send it.
pub fn unsigned(kid: &str, claims: &Value) -> String {
    let header = json!({"alg": "none", "kid": kid, "typ": "JWT"});
    format!(
        "{}.{}.",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string())
    )
}
