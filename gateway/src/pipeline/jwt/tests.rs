//! The verifier end to end in process: real signatures (testkit keys), a SQLite tenant
//! directory, and a clock the test sets.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use portcullis_control::{Database, TenantSeed};
use portcullis_testkit::jwt::{jwks, unsigned, SigningKey};
use serde_json::{json, Value};

use super::*;
use crate::config::Config;

const NOW: u64 = 1_700_000_000;

/// A wall clock the test moves.
struct ManualClock(Mutex<SystemTime>);

impl WallClock for ManualClock {
    fn now(&self) -> SystemTime {
        *self.0.lock().unwrap()
    }
}

struct Fixture {
    auth: JwtAuth,
    directory: Arc<Directory>,
    clock: Arc<ManualClock>,
    _dir: tempfile::TempDir,
}

async fn fixture(keys: &[&SigningKey], extra: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks(keys)).unwrap();
    let text = format!(
        "[auth.jwt]\nissuer = \"https://idp\"\naudiences = [\"api\"]\ntenant_claim = \"org_id\"\njwks_file = {:?}\n{extra}",
        file.display()
    );
    let config = Config::parse(&text, &HashMap::<String, String>::new()).unwrap();
    let db = Database::sqlite(&dir.path().join("t.db")).await.unwrap();
    let seed = |id| TenantSeed {
        id,
        api_keys: Vec::new(),
        rate: 10,
        per: Duration::from_secs(1),
        burst: 10,
        daily_quota: None,
        monthly_quota: None,
        max_in_flight: None,
        max_websockets: None,
        websocket_idle_timeout: None,
        websocket_max_lifetime: None,
    };
    db.upsert_tenants(&[seed("acme")]).await.unwrap();
    let directory = Arc::new(Directory::open(&db).await.unwrap());
    let clock = Arc::new(ManualClock(Mutex::new(
        UNIX_EPOCH + Duration::from_secs(NOW),
    )));
    let settings = config.auth.jwt.unwrap();
    Fixture {
        auth: JwtAuth::new(settings, clock.clone()),
        directory,
        clock,
        _dir: dir,
    }
}

fn claims(extra: Value) -> Value {
    let mut base = json!({"iss": "https://idp", "aud": ["api"], "exp": NOW + 600,
        "org_id": "acme", "sub": "user-1", "scope": ["read", "write"]});
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

#[tokio::test]
async fn all_three_algorithms_verify_and_forward_claims() {
    let keys = [
        SigningKey::rs256("r"),
        SigningKey::es256("e"),
        SigningKey::ed25519("d"),
    ];
    let f = fixture(
        &keys.iter().collect::<Vec<_>>(),
        "claims_to_headers = { sub = \"x-user\", scope = \"x-scope\" }",
    )
    .await;
    for key in &keys {
        let verified = f.auth.verify(&key.sign(&claims(json!({}))), &f.directory);
        let verified = verified.unwrap_or_else(|e| panic!("{}: {e}", key.alg()));
        assert_eq!(&*verified.tenant.id, "acme");
        let headers: Vec<(String, String)> = verified
            .headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        assert!(headers.contains(&("x-user".into(), "user-1".into())));
        assert!(headers.contains(&("x-scope".into(), "read,write".into())));
    }
}

#[tokio::test]
async fn refusals_say_why() {
    let key = SigningKey::ed25519("d");
    let other = SigningKey::ed25519("d");
    let f = fixture(&[&key], "algorithms = [\"EdDSA\"]").await;
    let es = SigningKey::es256("d");
    let cases = [
        (
            key.sign(&claims(json!({"exp": NOW - 61}))),
            JwtError::Expired,
        ),
        (
            key.sign(&claims(json!({"nbf": NOW + 61}))),
            JwtError::NotYetValid,
        ),
        (
            key.sign(&claims(json!({"iss": "https://evil"}))),
            JwtError::Issuer,
        ),
        (key.sign(&claims(json!({"aud": "web"}))), JwtError::Audience),
        (
            key.sign(&claims(json!({"org_id": null}))),
            JwtError::MissingTenant,
        ),
        (
            key.sign(&claims(json!({"org_id": "ghost"}))),
            JwtError::UnknownTenant,
        ),
        (other.sign(&claims(json!({}))), JwtError::Signature),
        (es.sign(&claims(json!({}))), JwtError::Algorithm),
        (unsigned("d", &claims(json!({}))), JwtError::Algorithm),
        (
            key.sign_with_header(&json!({"alg": "EdDSA", "kid": "nope"}), &claims(json!({}))),
            JwtError::UnknownKey,
        ),
        (
            key.sign_with_header(&json!({"alg": "HS256", "kid": "d"}), &claims(json!({}))),
            JwtError::Algorithm,
        ),
    ];
    for (token, want) in cases {
        assert_eq!(f.auth.verify(&token, &f.directory).unwrap_err(), want);
    }
}

#[tokio::test]
async fn expiry_follows_the_injected_clock() {
    let key = SigningKey::ed25519("d");
    let f = fixture(&[&key], "clock_skew = \"0s\"").await;
    let token = key.sign(&claims(json!({"exp": NOW + 10})));
    assert!(f.auth.verify(&token, &f.directory).is_ok());
    *f.clock.0.lock().unwrap() += Duration::from_secs(10);
    assert_eq!(
        f.auth.verify(&token, &f.directory).unwrap_err(),
        JwtError::Expired
    );
}

#[tokio::test]
async fn only_jwt_shaped_bearer_values_are_presented() {
    let key = SigningKey::ed25519("d");
    let f = fixture(&[&key], "").await;
    let token = key.sign(&claims(json!({})));
    let mut headers = HeaderMap::new();
    headers.insert(
        header::AUTHORIZATION,
        "Bearer acme-key-0001".parse().unwrap(),
    );
    assert!(f.auth.presented(&headers).is_none(), "an API key");
    headers.insert(
        header::AUTHORIZATION,
        format!("Bearer {token}").parse().unwrap(),
    );
    assert_eq!(f.auth.presented(&headers), Some(token.as_str()));
    assert!(f.auth.unknown_kid(&headers).is_none(), "kid d is known");
    let stranger = SigningKey::ed25519("new").sign(&claims(json!({})));
    headers.insert(
        header::AUTHORIZATION,
        format!("bearer {stranger}").parse().unwrap(),
    );
    assert_eq!(f.auth.unknown_kid(&headers).as_deref(), Some("new"));
    headers.insert("x-api-key", "k".parse().unwrap());
    assert!(f.auth.presented(&headers).is_none(), "X-API-Key wins");
}
