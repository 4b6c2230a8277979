//! Credentials and client identity end at the edge, through the real binary over raw
//! sockets: a bearer token the gateway did not verify never reaches the backend when
//! `[auth.jwt]` is on; client-address fields from an untrusted peer never reach it (from a
//! trusted proxy they do); guessing keys from one address ends in 429 + `Retry-After`.
//! Every assertion on what passed is made on what the backend received.

use std::time::Duration;

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayProcess};
use portcullis_testkit::h2frames::{self, kind, FrameReader};
use portcullis_testkit::jwt::{jwks, unsigned, SigningKey};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;

use crate::common::{single_route_config, BIN};

const KEY: &str = "acme-key-0001";

fn tenant() -> String {
    format!("[[tenants]]\nid = \"acme\"\napi_keys = [\"{KEY}\"]\nrate = 1000\nper = \"1s\"\nburst = 1000\n")
}

/// One raw HTTP/1.1 GET with `headers` (repeats allowed); (status, whole response text).
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

fn now() -> u64 {
    #[allow(clippy::disallowed_methods)] // tokens carry real Unix times for the real gateway
    let now = std::time::SystemTime::now();
    now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
}

fn claims() -> Value {
    json!({"iss": "https://idp.test", "aud": "orders-api", "exp": now() + 600,
        "org_id": "acme", "sub": "user-1"})
}

fn jwt_config(backend: &ScriptedUpstream, jwks: &ScriptedUpstream, extra: &str) -> String {
    format!(
        "{}\n[auth.jwt]\nissuer = \"https://idp.test\"\naudiences = [\"orders-api\"]\n\
         jwks_url = \"{}/.well-known/jwks.json\"\ntenant_claim = \"org_id\"\n{extra}\n\n{}",
        tenant(),
        jwks.url(),
        single_route_config(&backend.url(), "")
    )
}

/// With `[auth.jwt]`, a bearer value next to a valid `X-API-Key` was never verified: a
/// backend that takes what arrives in `Authorization` as checked must never see it, whether
/// it is unsigned, signed by a stranger, or even well signed. Other schemes pass.
#[tokio::test]
async fn unverified_bearer_tokens_beside_a_valid_api_key_never_reach_the_upstream() {
    let key = SigningKey::es256("ec-1");
    let stranger = SigningKey::es256("ec-1");
    let jwks_server = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::respond(200, &[("content-type", "application/json")], &jwks(&[&key])),
    )
    .await;
    let backend = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &jwt_config(&backend, &jwks_server, "")).await;

    let alg_none = format!("Bearer {}", unsigned("ec-1", &claims()));
    let wrongly_signed = format!("Bearer {}", stranger.sign(&claims()));
    let well_signed = format!("Bearer {}", key.sign(&claims()));
    let bearer_key = format!("Bearer {KEY}");
    let cases: [(&str, Vec<(&str, &str)>); 7] = [
        (
            "alg none",
            vec![("X-Api-Key", KEY), ("Authorization", &alg_none)],
        ),
        (
            "wrongly signed",
            vec![("X-Api-Key", KEY), ("Authorization", &wrongly_signed)],
        ),
        (
            "well signed but not verified",
            vec![("X-Api-Key", KEY), ("Authorization", &well_signed)],
        ),
        (
            "lower-case scheme, tab",
            vec![("X-Api-Key", KEY), ("Authorization", "bearer\tnot-checked")],
        ),
        (
            "anonymous, behind a Basic field",
            vec![
                ("Authorization", "Basic Zm9vOmJhcg=="),
                ("Authorization", &alg_none),
            ],
        ),
        (
            "a second field behind the verified token",
            vec![
                ("Authorization", &well_signed),
                ("Authorization", &alg_none),
            ],
        ),
        (
            "a second field behind a bearer API key",
            vec![("Authorization", &bearer_key), ("Authorization", &alg_none)],
        ),
    ];
    for (what, headers) in &cases {
        let (status, response) = get(&gateway, "/orders", headers).await;
        assert_eq!(status, 200, "{what}: {response}");
    }
    // Another scheme beside the key stays the backend's business.
    let (status, _) = get(
        &gateway,
        "/basic",
        &[("X-Api-Key", KEY), ("Authorization", "Basic Zm9vOmJhcg==")],
    )
    .await;
    assert_eq!(status, 200);

    let hits = backend.hits();
    assert_eq!(hits.len(), cases.len() + 1);
    for ((what, _), hit) in cases.iter().zip(&hits) {
        let bearer: Vec<_> = hit
            .headers
            .get_all("authorization")
            .iter()
            .filter(|v| v.as_bytes().to_ascii_lowercase().starts_with(b"bearer"))
            .collect();
        assert!(bearer.is_empty(), "{what}: the backend got {bearer:?}");
        assert!(hit.headers.get("x-api-key").is_none(), "{what}");
    }
    assert_eq!(
        hits[4].headers["authorization"], "Basic Zm9vOmJhcg==",
        "Basic on an anonymous request passes"
    );
    assert_eq!(hits[4].headers.get("x-portcullis-tenant"), None);
    assert_eq!(hits[5].headers["x-portcullis-tenant"], "acme");
    assert_eq!(
        hits[6].headers["x-portcullis-tenant"], "acme",
        "bearer API keys still work"
    );
    assert_eq!(hits[7].headers["authorization"], "Basic Zm9vOmJhcg==");
    assert_eq!(hits[7].headers["x-portcullis-tenant"], "acme");
}

/// `forward_token = true`: the verified token goes upstream, and only it — not an unsigned
/// one sent as a second `Authorization` field behind it.
#[tokio::test]
async fn forward_token_forwards_only_the_verified_value() {
    let key = SigningKey::ed25519("ed-1");
    let jwks_server = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::respond(200, &[("content-type", "application/json")], &jwks(&[&key])),
    )
    .await;
    let backend = ScriptedUpstream::start(vec![]).await;
    let config = jwt_config(&backend, &jwks_server, "forward_token = true");
    let gateway = GatewayProcess::start(BIN, &config).await;
    let verified = format!("Bearer {}", key.sign(&claims()));
    let alg_none = format!("Bearer {}", unsigned("ed-1", &claims()));
    let (status, response) = get(
        &gateway,
        "/orders",
        &[("Authorization", &verified), ("Authorization", &alg_none)],
    )
    .await;
    assert_eq!(status, 200, "{response}");
    let hits = backend.hits();
    let forwarded: Vec<_> = hits[0].headers.get_all("authorization").iter().collect();
    assert_eq!(forwarded, [verified.as_str()]);
}

/// Fields that name the client's address, besides `X-Forwarded-For`.
const SPOOFED: [(&str, &str); 11] = [
    ("X-Real-IP", "6.6.6.1"),
    ("Forwarded", "for=6.6.6.2;proto=https"),
    ("True-Client-IP", "6.6.6.3"),
    ("CF-Connecting-IP", "6.6.6.4"),
    ("X-Client-IP", "6.6.6.5"),
    ("X-Cluster-Client-IP", "6.6.6.6"),
    ("Fastly-Client-IP", "6.6.6.7"),
    ("Client-IP", "6.6.6.8"),
    ("X-Original-Forwarded-For", "6.6.6.9"),
    ("Forwarded-For", "6.6.6.10"),
    ("X-Forwarded", "for=6.6.6.11"),
];

fn proxy_config(backend: &ScriptedUpstream, trusted: &str) -> String {
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\n\
         trusted_proxies = [{trusted}]\n\n{}",
        single_route_config(&backend.url(), "")
    )
}

/// Connects with h2c prior knowledge and finishes the SETTINGS exchange.
async fn h2c_get(addr: std::net::SocketAddr, fields: &[(&str, &str)]) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.write_all(h2frames::PREFACE).await.ok()?;
    stream.write_all(&h2frames::settings(&[])).await.ok()?;
    stream.write_all(&h2frames::settings_ack()).await.ok()?;
    let mut head = vec![
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "localhost"),
        (":path", "/h2"),
    ];
    head.extend_from_slice(fields);
    stream
        .write_all(&h2frames::headers(1, &head, true))
        .await
        .ok()?;
    let mut reader = FrameReader::new(stream);
    for _ in 0..20 {
        let frame = reader.next(Duration::from_secs(5)).await?;
        if frame.stream == 1 && frame.kind == kind::HEADERS {
            return frame.static_status();
        }
    }
    None
}

#[tokio::test]
async fn client_address_fields_from_an_untrusted_peer_never_reach_the_upstream() {
    let backend = ScriptedUpstream::start(vec![]).await;
    // Loopback is not trusted here (another proxy is).
    let gateway = GatewayProcess::start(BIN, &proxy_config(&backend, "\"192.0.2.0/24\"")).await;
    let mut fields: Vec<(&str, &str)> = SPOOFED.to_vec();
    fields.push(("X-Forwarded-For", "6.6.6.12"));
    let (status, response) = get(&gateway, "/h1", &fields).await;
    assert_eq!(status, 200, "{response}");
    let lower: Vec<(String, &str)> = fields
        .iter()
        .map(|(name, value)| (name.to_ascii_lowercase(), *value))
        .collect();
    let lower: Vec<(&str, &str)> = lower.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    assert_eq!(h2c_get(gateway.addr, &lower).await, Some(200), "over h2c");
    let hits = backend.hits();
    assert_eq!(hits.len(), 2);
    for hit in &hits {
        for (name, value) in SPOOFED {
            assert!(
                hit.headers.get(name).is_none(),
                "{} {name}: {value} reached the backend",
                hit.uri
            );
        }
        assert_eq!(hit.headers["x-forwarded-for"], "127.0.0.1", "{}", hit.uri);
        let text = format!("{:?}", hit.headers);
        assert!(!text.contains("6.6.6."), "{}: {text}", hit.uri);
    }
}

#[tokio::test]
async fn client_address_fields_from_a_trusted_proxy_pass() {
    let backend = ScriptedUpstream::start(vec![]).await;
    let gateway = GatewayProcess::start(BIN, &proxy_config(&backend, "\"127.0.0.1/32\"")).await;
    let mut fields: Vec<(&str, &str)> = SPOOFED.to_vec();
    fields.push(("X-Forwarded-For", "198.51.100.7"));
    let (status, response) = get(&gateway, "/h1", &fields).await;
    assert_eq!(status, 200, "{response}");
    let hits = backend.hits();
    for (name, value) in SPOOFED {
        assert_eq!(hits[0].headers[name], value, "{name} from a trusted proxy");
    }
    assert_eq!(
        hits[0].headers["x-forwarded-for"],
        "198.51.100.7, 127.0.0.1"
    );
}

/// Random keys from one address: the default budget (20 failures a minute) answers 401, then
/// 429 problem+json with `Retry-After` — for every credential from that address, a valid key
/// too (checking it would tell valid from invalid). Other addresses, and the address's own
/// anonymous requests, are not affected. Addresses come through a trusted proxy.
#[tokio::test]
async fn key_guessing_from_one_address_gets_429_with_retry_after() {
    let backend = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        "{}\n{}",
        tenant(),
        proxy_config(&backend, "\"127.0.0.1/32\"")
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let guesser = ("X-Forwarded-For", "198.51.100.7");
    for n in 0..20 {
        let guess = format!("guess-{n:04}-{}", n * 7919);
        let (status, response) = get(&gateway, "/g", &[guesser, ("X-Api-Key", &guess)]).await;
        assert_eq!(status, 401, "guess {n}: {response}");
    }
    let (status, response) = get(
        &gateway,
        "/g",
        &[guesser, ("Authorization", "Bearer guess-21")],
    )
    .await;
    assert_eq!(status, 429, "{response}");
    let lower = response.to_ascii_lowercase();
    assert!(
        lower.contains("content-type: application/problem+json"),
        "{response}"
    );
    assert!(response.contains("too-many-auth-failures"), "{response}");
    let retry_after: u64 = lower
        .lines()
        .find_map(|line| line.strip_prefix("retry-after:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {response}"));
    assert!((1..=60).contains(&retry_after), "{response}");

    let (status, _) = get(&gateway, "/g", &[guesser, ("X-Api-Key", KEY)]).await;
    assert_eq!(
        status, 429,
        "a valid key from the blocked address is not checked"
    );
    let (status, _) = get(&gateway, "/anonymous", &[guesser]).await;
    assert_eq!(status, 200, "no credential, nothing guessed");
    let neighbour = ("X-Forwarded-For", "198.51.100.8");
    let (status, _) = get(&gateway, "/g", &[neighbour, ("X-Api-Key", "guess")]).await;
    assert_eq!(status, 401, "another address has its own budget");
    let (status, _) = get(&gateway, "/neighbour", &[neighbour, ("X-Api-Key", KEY)]).await;
    assert_eq!(status, 200);

    let hits = backend.hits();
    let paths: Vec<_> = hits.iter().map(|hit| hit.uri.path()).collect();
    assert_eq!(paths, ["/anonymous", "/neighbour"]);
}

/// `auth.failure_limit` and `auth.failure_window` as configured; an IPv6 client counts by its
/// /64, so rotating addresses inside it does not buy more guesses.
#[tokio::test]
async fn an_ipv6_slash_64_shares_one_configured_budget() {
    let backend = ScriptedUpstream::start(vec![]).await;
    let config = format!(
        "[auth]\nfailure_limit = 3\nfailure_window = \"1h\"\n\n{}\n{}",
        tenant(),
        proxy_config(&backend, "\"127.0.0.1/32\"")
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    for n in 1..=3 {
        let from = format!("2001:db8:7:7::{n}");
        let (status, _) = get(
            &gateway,
            "/",
            &[("X-Forwarded-For", &from), ("X-Api-Key", "x")],
        )
        .await;
        assert_eq!(status, 401);
    }
    let (status, response) = get(
        &gateway,
        "/",
        &[
            ("X-Forwarded-For", "2001:db8:7:7:ffff::1"),
            ("X-Api-Key", "x"),
        ],
    )
    .await;
    assert_eq!(status, 429, "{response}");
    let retry_after: u64 = response
        .to_ascii_lowercase()
        .lines()
        .find_map(|line| line.strip_prefix("retry-after:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_default();
    assert!((3000..=3600).contains(&retry_after), "{response}");
    let (status, _) = get(
        &gateway,
        "/",
        &[("X-Forwarded-For", "2001:db8:7:8::1"), ("X-Api-Key", "x")],
    )
    .await;
    assert_eq!(status, 401, "the next /64");
    assert_eq!(backend.hit_count(), 0);
}
