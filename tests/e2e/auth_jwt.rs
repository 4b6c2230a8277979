//! `[auth.jwt]` through the real binary, over raw sockets: the JWKS is served by a scripted
//! upstream, tokens are signed in the test (RS256 from a committed key, ES256 and EdDSA
//! generated), and every assertion on what passed is made on what the backend received.

use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::jwt::{jwks, unsigned, SigningKey};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use serde_json::{json, Value};

use crate::common::{single_route_config, BIN};

/// The tenant `acme`: one request an hour beyond a burst of `burst` (so its quota shows
/// without waiting).
fn tenant(burst: u32) -> String {
    format!("[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-key-0001\"]\nrate = 1\nper = \"1h\"\nburst = {burst}\n")
}

fn jwks_step(keys: &[&SigningKey]) -> Step {
    Step::respond(200, &[("content-type", "application/json")], &jwks(keys))
}

async fn jwks_server(keys: &[&SigningKey]) -> ScriptedUpstream {
    ScriptedUpstream::start_with_fallback(vec![], jwks_step(keys)).await
}

fn config(backend: &ScriptedUpstream, jwks: &ScriptedUpstream, burst: u32, extra: &str) -> String {
    format!(
        "{}\n[auth.jwt]\nissuer = \"https://idp.test\"\naudiences = [\"orders-api\", \"other\"]\n\
         jwks_url = \"{}/.well-known/jwks.json\"\ntenant_claim = \"org_id\"\n\
         claims_to_headers = {{ sub = \"x-user-id\", scope = \"x-scopes\" }}\n{extra}\n\n{}",
        tenant(burst),
        jwks.url(),
        single_route_config(&backend.url(), "")
    )
}

/// `text` without the failed-authentication limit: for tests that send more refused tokens
/// than it allows from one address on purpose.
fn no_failure_limit(text: &str) -> String {
    text.replacen("[auth.jwt]", "[auth]\nfailure_limit = 0\n\n[auth.jwt]", 1)
}

fn now() -> u64 {
    #[allow(clippy::disallowed_methods)] // tokens carry real Unix times for the real gateway
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn claims(extra: Value) -> Value {
    let mut base = json!({"iss": "https://idp.test", "aud": "orders-api", "exp": now() + 600,
        "org_id": "acme", "sub": "user-1", "scope": ["orders:read"]});
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    base
}

/// One raw HTTP/1.1 GET with `headers`; (status, whole response text).
async fn get(gateway: &GatewayProcess, path: &str, headers: &[(&str, &str)]) -> (u16, String) {
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let response = raw_request(gateway.addr, head.as_bytes())
        .await
        .expect("an answer");
    let status = parse_status(&response).expect("a status line");
    (status, String::from_utf8_lossy(&response).into_owned())
}

async fn bearer(gateway: &GatewayProcess, token: &str, extra: &[(&str, &str)]) -> (u16, String) {
    let auth = format!("Bearer {token}");
    let mut headers = vec![("Authorization", auth.as_str())];
    headers.extend_from_slice(extra);
    get(gateway, "/orders", &headers).await
}

/// Waits (bounded) until the JWKS endpoint was asked `n` times.
async fn wait_fetches(jwks: &ScriptedUpstream, n: usize) {
    for _ in 0..100 {
        if jwks.hit_count() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("JWKS fetched {} times, expected {n}", jwks.hit_count());
}

fn assert_invalid_token(status: u16, response: &str, what: &str) {
    assert_eq!(status, 401, "{what}: {response}");
    let lower = response.to_ascii_lowercase();
    assert!(
        lower.contains("www-authenticate: bearer realm=\"portcullis\", error=\"invalid_token\", error_description=\""),
        "{what}: {response}"
    );
    assert!(
        lower.contains("content-type: application/problem+json"),
        "{what}: {response}"
    );
    assert!(response.contains("invalid-token"), "{what}: {response}");
}

#[tokio::test]
async fn rs256_es256_and_eddsa_tokens_reach_the_upstream_as_the_tenant_with_claim_headers() {
    let keys = [
        SigningKey::rs256("rsa-1"),
        SigningKey::es256("ec-1"),
        SigningKey::ed25519("ed-1"),
    ];
    let jwks = jwks_server(&keys.iter().collect::<Vec<_>>()).await;
    let backend = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&backend, &jwks, 100, "")).await;

    let forged = [
        ("X-User-Id", "admin"),
        ("X-Scopes", "everything"),
        ("X-Portcullis-Tenant", "globex"),
    ];
    for key in &keys {
        let (status, response) = bearer(&gateway, &key.sign(&claims(json!({}))), &forged).await;
        assert_eq!(status, 200, "{}: {response}", key.alg());
    }
    // API keys keep working beside JWTs, in both headers; claim headers are still stripped.
    let (status, _) = get(&gateway, "/k", &[("X-Api-Key", "acme-key-0001"), forged[0]]).await;
    assert_eq!(status, 200);
    let (status, _) = get(&gateway, "/k", &[("Authorization", "Bearer acme-key-0001")]).await;
    assert_eq!(status, 200);
    // Anonymous callers cannot forge claim headers either.
    let (status, _) = get(&gateway, "/anon", &[forged[0]]).await;
    assert_eq!(status, 200);

    let hits = backend.hits();
    assert_eq!(hits.len(), 6);
    for hit in &hits[..3] {
        assert_eq!(hit.headers["x-portcullis-tenant"], "acme");
        assert_eq!(
            hit.headers["x-user-id"], "user-1",
            "the claim, not the forgery"
        );
        assert_eq!(hit.headers["x-scopes"], "orders:read");
        assert_eq!(hit.headers.get_all("x-user-id").iter().count(), 1);
        assert!(
            hit.headers.get("authorization").is_none(),
            "token not forwarded by default"
        );
    }
    for hit in &hits[3..5] {
        assert_eq!(hit.headers["x-portcullis-tenant"], "acme");
        assert!(hit.headers.get("x-user-id").is_none());
    }
    assert!(hits[5].headers.get("x-user-id").is_none());
    assert!(hits[5].headers.get("x-portcullis-tenant").is_none());
}

#[tokio::test]
async fn bad_tokens_are_401_invalid_token_and_never_reach_the_upstream() {
    let key = SigningKey::es256("ec-1");
    let impostor = SigningKey::es256("ec-1");
    let jwks = jwks_server(&[&key]).await;
    let backend = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&backend, &jwks, 100, "")).await;
    let expired = key.sign(&claims(json!({"exp": now() - 3600})));
    let mut tampered = key.sign(&claims(json!({})));
    tampered.truncate(tampered.len() - 4);
    tampered.push_str("AAAA");
    let cases = [
        ("expired", expired),
        (
            "not yet valid",
            key.sign(&claims(json!({"nbf": now() + 3600}))),
        ),
        (
            "wrong audience",
            key.sign(&claims(json!({"aud": ["billing"]}))),
        ),
        (
            "wrong issuer",
            key.sign(&claims(json!({"iss": "https://evil.test"}))),
        ),
        ("signed by another key", impostor.sign(&claims(json!({})))),
        ("tampered signature", tampered),
        ("alg none", unsigned("ec-1", &claims(json!({})))),
        (
            "unknown tenant",
            key.sign(&claims(json!({"org_id": "ghost"}))),
        ),
        (
            "no tenant claim",
            key.sign(&claims(json!({"org_id": null}))),
        ),
    ];
    for (what, token) in &cases {
        let (status, response) = bearer(&gateway, token, &[]).await;
        assert_invalid_token(status, &response, what);
    }
    assert_eq!(
        backend.hit_count(),
        0,
        "no refused token reached the upstream"
    );
    let (status, _) = bearer(&gateway, &key.sign(&claims(json!({}))), &[]).await;
    assert_eq!(status, 200, "the gateway kept serving");
}

#[tokio::test]
async fn a_rotated_key_passes_after_one_refresh_and_random_kids_do_not_hammer_the_jwks() {
    let old = SigningKey::ed25519("2024-old");
    let new = SigningKey::rs256("2025-new");
    let jwks = jwks_server(&[&old]).await;
    let backend = ScriptedUpstream::start(vec![]).await;
    let extra = "jwks_refresh_interval = \"1h\"\njwks_refresh_cooldown = \"1h\"";
    let text = no_failure_limit(&config(&backend, &jwks, 100, extra));
    let gateway = GatewayProcess::start(BIN, &text).await;
    wait_fetches(&jwks, 1).await;
    let (status, _) = bearer(&gateway, &old.sign(&claims(json!({}))), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(jwks.hit_count(), 1, "a known kid costs no fetch");

    // The issuer rotates: the new kid triggers exactly one refresh and then passes.
    jwks.set_fallback(jwks_step(&[&new]));
    let (status, response) = bearer(&gateway, &new.sign(&claims(json!({}))), &[]).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(jwks.hit_count(), 2);
    let (status, response) = bearer(&gateway, &old.sign(&claims(json!({}))), &[]).await;
    assert_invalid_token(status, &response, "retired key");

    // An attacker's random kids: refused, and the cooldown holds the JWKS endpoint at 2.
    for i in 0..20 {
        let stranger = SigningKey::ed25519(&format!("random-{i}"));
        let (status, response) = bearer(&gateway, &stranger.sign(&claims(json!({}))), &[]).await;
        assert_invalid_token(status, &response, "random kid");
    }
    assert_eq!(
        jwks.hit_count(),
        2,
        "unknown kids inside the cooldown fetch nothing"
    );
    assert_eq!(backend.hit_count(), 2);
}

#[tokio::test]
async fn an_unreachable_jwks_keeps_the_last_good_keys() {
    let key = SigningKey::ed25519("k1");
    let jwks = jwks_server(&[&key]).await;
    let backend = ScriptedUpstream::start(vec![]).await;
    let extra = "jwks_refresh_interval = \"1s\"";
    let gateway = GatewayProcess::start(BIN, &config(&backend, &jwks, 100, extra)).await;
    wait_fetches(&jwks, 1).await;
    jwks.set_fallback(Step::status(503));
    let failed = jwks.hit_count() + 2;
    wait_fetches(&jwks, failed).await;
    let (status, response) = bearer(&gateway, &key.sign(&claims(json!({}))), &[]).await;
    assert_eq!(status, 200, "{response}");
}

#[tokio::test]
async fn a_jwks_file_is_reread_when_it_changes() {
    let (old, new) = (SigningKey::es256("file-1"), SigningKey::ed25519("file-2"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks(&[&old])).unwrap();
    let backend = ScriptedUpstream::start(vec![]).await;
    let text = format!(
        "{}\n[auth.jwt]\nissuer = \"https://idp.test\"\naudiences = [\"orders-api\"]\n\
         jwks_file = {:?}\ntenant_claim = \"org_id\"\n\n{}",
        tenant(100),
        file.display(),
        single_route_config(&backend.url(), "")
    );
    let gateway = GatewayProcess::start(BIN, &no_failure_limit(&text)).await;
    let (status, _) = bearer(&gateway, &old.sign(&claims(json!({}))), &[]).await;
    assert_eq!(status, 200, "keys read at start-up");
    std::fs::write(&file, jwks(&[&old, &new])).unwrap();
    // The file is looked at every second: poll (bounded) until the new key is in use.
    let token = new.sign(&claims(json!({})));
    let mut passed = false;
    for _ in 0..50 {
        if bearer(&gateway, &token, &[]).await.0 == 200 {
            passed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(passed, "the rewritten file was not picked up within 5 s");
}

#[tokio::test]
async fn the_claimed_tenants_quota_applies() {
    let key = SigningKey::es256("ec-1");
    let jwks = jwks_server(&[&key]).await;
    let backend = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &config(&backend, &jwks, 3, "")).await;
    let token = key.sign(&claims(json!({})));
    for _ in 0..3 {
        let (status, response) = bearer(&gateway, &token, &[]).await;
        assert_eq!(status, 200, "{response}");
        assert!(
            response
                .to_ascii_lowercase()
                .contains("ratelimit-policy: \"tenant\";q=1;w=3600"),
            "{response}"
        );
    }
    let (status, response) = bearer(&gateway, &token, &[]).await;
    assert_eq!(status, 429, "{response}");
    assert!(
        response.contains("\"violated-policies\":[\"tenant\"]"),
        "{response}"
    );
    // The same tenant by API key shares the bucket: the quota is the tenant's, not the token's.
    let (status, _) = get(&gateway, "/k", &[("X-Api-Key", "acme-key-0001")]).await;
    assert_eq!(status, 429);
    assert_eq!(backend.hit_count(), 3);
}

#[test]
fn invalid_jwt_settings_refuse_to_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "<html>not a key set</html>").unwrap();
    let base =
        "[auth.jwt]\nissuer = \"https://idp\"\naudiences = [\"api\"]\ntenant_claim = \"org_id\"\n";
    let url = "jwks_url = \"http://127.0.0.1:9/jwks\"\n";
    let cases = [
        (String::new(), "auth.jwt.jwks_url"),
        (
            format!("{url}jwks_file = \"/x.json\"\n"),
            "auth.jwt.jwks_url",
        ),
        (
            format!("jwks_file = {:?}\n", garbage.display()),
            "auth.jwt.jwks_file",
        ),
        (
            format!("{url}algorithms = [\"none\"]\n"),
            "auth.jwt.algorithms[0]",
        ),
        (
            format!("{url}algorithms = [\"RS256\", \"HS256\"]\n"),
            "auth.jwt.algorithms[1]",
        ),
        (
            format!("{url}claims_to_headers = {{ sub = \"Authorization\" }}\n"),
            "auth.jwt.claims_to_headers.sub",
        ),
        (format!("{url}clock_skew = \"2h\"\n"), "auth.jwt.clock_skew"),
        (
            format!("{url}jwks_refresh_cooldown = \"0s\"\n"),
            "auth.jwt.jwks_refresh_cooldown",
        ),
        (format!("{url}tenant_claim_name = \"x\"\n"), "auth.jwt"),
    ];
    for (extra, field) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, format!("{base}{extra}")).unwrap();
        let output = std::process::Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(2),
            "must refuse: {extra}\n{stderr}"
        );
        assert!(stderr.contains(field), "must name {field}: {stderr}");
    }
}
