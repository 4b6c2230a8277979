//! Inbound signature verification (`verify` on a route): for each scheme a valid signature is
//! forwarded with the body byte for byte, and a forged, stale or missing one is a 401
//! problem that the upstream never sees and that spends no rate-limit token. Requests are
//! written as raw HTTP/1.1 by a stranger who knows only the scheme's published form.

use std::time::{SystemTime, UNIX_EPOCH};

use base64::Engine;
use portcullis_testkit::gateway::{parse_status, raw_request, GatewayOptions, GatewayProcess};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use ring::hmac;

use crate::common::BIN;

const SECRET: &str = "e2e-signing-secret";
/// A Standard Webhooks secret: `whsec_` and the base64 of the key bytes.
const SW_KEY: &[u8] = b"standard-webhooks-key-bytes!";

/// One route `/hooks` verified with `verify`, and an anonymous bucket of one request per hour:
/// any refused request that spent a token would leave none for the valid one sent last.
async fn start(verify: &str) -> (ScriptedUpstream, GatewayProcess) {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("thanks")).await;
    let config = format!(
        "[rate_limit]\nanonymous = {{ rate = 1, per = \"1h\", burst = 1 }}\n\n\
         [[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 0 }}\n\n\
         [[routes]]\nprefix = \"/hooks\"\nupstream = \"u\"\nverify = {{ {verify} }}\n",
        upstream.url()
    );
    let sw_secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(SW_KEY)
    );
    let options = GatewayOptions {
        env: vec![
            ("E2E_HOOK_SECRET".into(), SECRET.into()),
            ("E2E_SW_SECRET".into(), sw_secret),
        ],
        ..GatewayOptions::default()
    };
    let gateway = GatewayProcess::start_with(BIN, &config, options).await;
    (upstream, gateway)
}

#[allow(clippy::disallowed_methods)] // signed timestamps are real Unix times for the real gateway
fn now() -> i64 {
    i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs(),
    )
    .unwrap()
}

fn mac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut ctx = hmac::Context::with_key(&hmac::Key::new(hmac::HMAC_SHA256, key));
    for part in parts {
        ctx.update(part);
    }
    ctx.sign().as_ref().to_vec()
}

/// POSTs `body` with `headers` over a fresh connection; the answer's status and text.
async fn post(gateway: &GatewayProcess, headers: &[(&str, String)], body: &[u8]) -> (u16, String) {
    let mut request = format!(
        "POST /hooks/event HTTP/1.1\r\nHost: hooks.example\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n",
        body.len()
    )
    .into_bytes();
    for (name, value) in headers {
        request.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    request.extend_from_slice(b"\r\n");
    request.extend_from_slice(body);
    let answer = raw_request(gateway.addr, &request)
        .await
        .expect("an answer");
    let status = parse_status(&answer).expect("a status line");
    (status, String::from_utf8_lossy(&answer).into_owned())
}

/// Each refusal is a 401 problem naming the signature; the upstream saw nothing.
fn assert_refused(upstream: &ScriptedUpstream, (status, text): (u16, String), case: &str) {
    assert_eq!(status, 401, "{case}: {text}");
    assert!(text.contains("application/problem+json"), "{case}: {text}");
    assert!(text.contains("signature-invalid"), "{case}: {text}");
    assert!(!text.contains(SECRET), "{case}: secret in the answer");
    assert_eq!(
        upstream.hit_count(),
        0,
        "{case}: forwarded {:?}",
        upstream.hits()
    );
}

/// The valid request, sent last, is forwarded once with its body and signature intact.
fn assert_forwarded(
    upstream: &ScriptedUpstream,
    (status, text): (u16, String),
    body: &[u8],
    header: &str,
) {
    assert_eq!(status, 200, "valid signature refused: {text}");
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(&hits[0].body[..], body, "body not byte-identical");
    assert!(
        hits[0].headers.contains_key(header),
        "{:?}",
        hits[0].headers
    );
}

const BODY: &[u8] = b"{\"action\":\"opened\",\"n\":1}\n\t \xe2\x9c\x93";

#[tokio::test]
async fn hub_signature_256_valid_forwarded_forged_or_missing_refused() {
    let (upstream, gateway) =
        start("scheme = \"hmac-sha256\", secret_env = \"E2E_HOOK_SECRET\"").await;
    let good = format!("sha256={}", hex::encode(mac(SECRET.as_bytes(), &[BODY])));
    let forged = format!("sha256={}", hex::encode(mac(b"guessed", &[BODY])));
    let header = "X-Hub-Signature-256";
    assert_refused(
        &upstream,
        post(&gateway, &[(header, forged)], BODY).await,
        "forged",
    );
    assert_refused(&upstream, post(&gateway, &[], BODY).await, "missing");
    // The right signature over another body (a tampered payload).
    assert_refused(
        &upstream,
        post(
            &gateway,
            &[(header, good.clone())],
            b"{\"action\":\"closed\"}",
        )
        .await,
        "tampered",
    );
    assert_refused(
        &upstream,
        post(&gateway, &[(header, "sha256=zz".into())], BODY).await,
        "malformed",
    );
    let valid = post(&gateway, &[(header, good)], BODY).await;
    assert_forwarded(&upstream, valid, BODY, "x-hub-signature-256");
}

#[tokio::test]
async fn stripe_signature_valid_forwarded_forged_stale_or_missing_refused() {
    let (upstream, gateway) =
        start("scheme = \"stripe\", secret_env = \"E2E_HOOK_SECRET\", tolerance = \"5m\"").await;
    let sign = |key: &[u8], t: i64| {
        let t_text = t.to_string();
        format!(
            "t={t},v1={}",
            hex::encode(mac(key, &[t_text.as_bytes(), b".", BODY]))
        )
    };
    let header = "Stripe-Signature";
    let t = now();
    assert_refused(
        &upstream,
        post(&gateway, &[(header, sign(b"guessed", t))], BODY).await,
        "forged",
    );
    assert_refused(
        &upstream,
        post(
            &gateway,
            &[(header, sign(SECRET.as_bytes(), t - 600))],
            BODY,
        )
        .await,
        "stale",
    );
    assert_refused(&upstream, post(&gateway, &[], BODY).await, "missing");
    // A replayed signature with the timestamp moved forward no longer matches.
    let moved =
        sign(SECRET.as_bytes(), t - 600).replacen(&format!("t={}", t - 600), &format!("t={t}"), 1);
    assert_refused(
        &upstream,
        post(&gateway, &[(header, moved)], BODY).await,
        "moved timestamp",
    );
    let valid = post(&gateway, &[(header, sign(SECRET.as_bytes(), now()))], BODY).await;
    assert_forwarded(&upstream, valid, BODY, "stripe-signature");
}

#[tokio::test]
async fn standard_webhooks_valid_forwarded_forged_stale_or_missing_refused() {
    let (upstream, gateway) =
        start("scheme = \"standard-webhooks\", secret_env = \"E2E_SW_SECRET\"").await;
    let sign = |key: &[u8], id: &str, ts: i64| {
        let ts = ts.to_string();
        let sig = mac(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", BODY]);
        vec![
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", ts),
            (
                "webhook-signature",
                format!(
                    "v1,{}",
                    base64::engine::general_purpose::STANDARD.encode(sig)
                ),
            ),
        ]
    };
    let t = now();
    assert_refused(
        &upstream,
        post(&gateway, &sign(b"guessed", "msg_1", t), BODY).await,
        "forged",
    );
    assert_refused(
        &upstream,
        post(&gateway, &sign(SW_KEY, "msg_1", t - 3600), BODY).await,
        "stale",
    );
    let mut no_id = sign(SW_KEY, "msg_1", t);
    no_id.retain(|(name, _)| *name != "webhook-id");
    assert_refused(&upstream, post(&gateway, &no_id, BODY).await, "missing id");
    assert_refused(&upstream, post(&gateway, &[], BODY).await, "missing");
    // The whole secret string (with its prefix) as the key: not how the scheme signs.
    let wrong_key = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(SW_KEY)
    );
    assert_refused(
        &upstream,
        post(&gateway, &sign(wrong_key.as_bytes(), "msg_1", t), BODY).await,
        "undecoded key",
    );
    let mut valid = sign(SW_KEY, "msg_2", now());
    // Several signatures (a key rotation): one valid is enough.
    if let Some((_, sigs)) = valid.iter_mut().find(|(n, _)| *n == "webhook-signature") {
        *sigs = format!("v1,AAAA {sigs}");
    }
    let valid = post(&gateway, &valid, BODY).await;
    assert_forwarded(&upstream, valid, BODY, "webhook-signature");
}

/// On an asynchronous route a refused signature is not queued either: only the valid request
/// is stored (the queue lists one message) and delivered.
#[tokio::test]
async fn a_forged_signature_on_an_async_route_is_never_queued() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("thanks")).await;
    let config = format!(
        "[[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\n\n\
         [[routes]]\nname = \"hooks\"\nprefix = \"/hooks\"\nupstream = \"u\"\n\
         verify = {{ scheme = \"hmac-sha256\", secret_env = \"E2E_HOOK_SECRET\" }}\n\
         delivery = {{ mode = \"async\" }}\n",
        upstream.url()
    );
    let token = "e2e-admin-token-signatures";
    let options = GatewayOptions {
        env: vec![
            ("E2E_HOOK_SECRET".into(), SECRET.into()),
            ("PORTCULLIS_ADMIN_TOKEN".into(), token.into()),
        ],
        ..GatewayOptions::default()
    };
    let gateway = GatewayProcess::start_with(BIN, &config, options).await;
    let header = "X-Hub-Signature-256";
    let forged = format!("sha256={}", hex::encode(mac(b"guessed", &[BODY])));
    assert_refused(
        &upstream,
        post(&gateway, &[(header, forged)], BODY).await,
        "forged",
    );
    assert_refused(&upstream, post(&gateway, &[], BODY).await, "missing");
    let good = format!("sha256={}", hex::encode(mac(SECRET.as_bytes(), &[BODY])));
    let (status, text) = post(&gateway, &[(header, good)], BODY).await;
    assert_eq!(status, 202, "{text}");
    for _ in 0..300 {
        if upstream.hit_count() >= 1 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let hits = upstream.hits();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert_eq!(&hits[0].body[..], BODY);
    assert!(
        !hits[0].headers.contains_key("x-hub-signature-256"),
        "signature stored and delivered"
    );
    let listed: serde_json::Value = crate::common::client()
        .get(format!(
            "{}/admin/v1/deliveries?limit=100",
            gateway.admin_url()
        ))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["items"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
}

/// A file tenant with its own secret for the route (`signature_secrets`) is checked with it
/// alone: the route's secret no longer signs for that tenant, and the tenant's secret signs
/// for nobody else. Tenants without one, and anonymous senders, keep the route's secret.
#[tokio::test]
async fn a_tenant_with_its_own_secret_is_checked_with_it_alone() {
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("thanks")).await;
    let config = format!(
        "[[tenants]]\nid = \"acme\"\napi_keys = [\"key-acme-0001\"]\nrate = 100\nper = \"1s\"\nburst = 100\n\
         signature_secrets = {{ hooks = \"E2E_ACME_SECRET\" }}\n\n\
         [[tenants]]\nid = \"beta\"\napi_keys = [\"key-beta-0001\"]\nrate = 100\nper = \"1s\"\nburst = 100\n\n\
         [[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 0 }}\n\n\
         [[routes]]\nname = \"hooks\"\nprefix = \"/hooks\"\nupstream = \"u\"\n\
         verify = {{ scheme = \"hmac-sha256\", secret_env = \"E2E_HOOK_SECRET\" }}\n",
        upstream.url()
    );
    let options = GatewayOptions {
        env: vec![
            ("E2E_HOOK_SECRET".into(), SECRET.into()),
            ("E2E_ACME_SECRET".into(), "acme-own-secret".into()),
        ],
        ..GatewayOptions::default()
    };
    let gateway = GatewayProcess::start_with(BIN, &config, options).await;
    let signed = |secret: &str, body: &[u8]| {
        format!("sha256={}", hex::encode(mac(secret.as_bytes(), &[body])))
    };
    let cases: [(&str, Option<&str>, &str, u16); 6] = [
        ("acme-own", Some("key-acme-0001"), "acme-own-secret", 200),
        ("acme-route", Some("key-acme-0001"), SECRET, 401),
        ("beta-route", Some("key-beta-0001"), SECRET, 200),
        ("beta-acme", Some("key-beta-0001"), "acme-own-secret", 401),
        ("anon-route", None, SECRET, 200),
        ("anon-acme", None, "acme-own-secret", 401),
    ];
    for (label, api_key, secret, expected) in cases {
        let body = format!("{{\"case\":\"{label}\"}}");
        let mut headers = vec![("X-Hub-Signature-256", signed(secret, body.as_bytes()))];
        if let Some(key) = api_key {
            headers.push(("X-API-Key", key.to_owned()));
        }
        let (status, text) = post(&gateway, &headers, body.as_bytes()).await;
        assert_eq!(status, expected, "{label}: {text}");
    }
    let forwarded: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| String::from_utf8_lossy(&h.body).into_owned())
        .collect();
    assert_eq!(
        forwarded,
        [
            "{\"case\":\"acme-own\"}",
            "{\"case\":\"beta-route\"}",
            "{\"case\":\"anon-route\"}"
        ],
        "only the requests signed with the right secret reach the upstream"
    );
}
