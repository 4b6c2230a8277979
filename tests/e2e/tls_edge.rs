//! Edge TLS and HTTP/2 from clients: TLS 1.3 + h2 and HTTP/1.1 with every contract header,
//! certificate rotation (SIGHUP and file change) without dropping connections, the admin
//! listener's own certificate, h2 SETTINGS and stream limits, smuggling attempts.

use std::path::Path;
use std::time::Duration;

use portcullis_testkit::gateway::{GatewayOptions, GatewayProcess};
use portcullis_testkit::tls::{self, presented_certificate, tls_get_status, TestCa};
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::BIN;
use crate::idempotency_replay::TENANTS;

/// `[server]` with `server_extra` lines and, when given, a `[server.tls]` table; one upstream
/// routed from `/` with idempotency on.
pub(crate) fn config(
    upstream: &str,
    server_extra: &str,
    tls_files: Option<(&Path, &Path)>,
) -> String {
    let tls = tls_files
        .map(|(cert, key)| format!("[server.tls]\ncert = {cert:?}\nkey = {key:?}\n"))
        .unwrap_or_default();
    format!(
        "[server]\nlisten = \"{{listen}}\"\nadmin_listen = \"{{admin_listen}}\"\n{server_extra}\n{tls}\n{TENANTS}\n[[upstreams]]\nname = \"u\"\nendpoints = [\"{upstream}\"]\nretry = {{ max_retries = 0 }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"u\"\nidempotency = {{ }}\n"
    )
}

async fn start_tls(ca: &TestCa, config: &str) -> GatewayProcess {
    let options = GatewayOptions {
        tls_ca: Some(ca.pem()),
        ..GatewayOptions::default()
    };
    GatewayProcess::start_with(BIN, config, options).await
}

/// A client that speaks only TLS 1.3 and either only h2 or only HTTP/1.1.
fn tls_client(ca: &TestCa, http2: bool) -> reqwest::Client {
    let alpn: &[&[u8]] = if http2 { &[b"h2"] } else { &[b"http/1.1"] };
    let builder = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .use_preconfigured_tls(tls::client_config(&ca.pem(), alpn, true));
    let builder = if http2 {
        builder.http2_prior_knowledge()
    } else {
        builder.http1_only()
    };
    builder.build().unwrap()
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_else(|| panic!("missing {name} in {:?}", response.headers()))
}

#[tokio::test]
async fn tls13_h2_and_http11_clients_get_every_contract_header() {
    let ca = TestCa::new("edge-ca");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.server().write(dir.path(), "server");
    let upstream = ScriptedUpstream::start_with_fallback(
        vec![],
        Step::respond(201, &[("x-order", "7")], "{\"id\":7}"),
    )
    .await;
    let gateway = start_tls(&ca, &config(&upstream.url(), "", Some((&cert, &key)))).await;

    for (http2, version) in [
        (true, reqwest::Version::HTTP_2),
        (false, reqwest::Version::HTTP_11),
    ] {
        let client = tls_client(&ca, http2);
        let response = client
            .get(gateway.url() + "/orders")
            .bearer_auth("acme-key-0001")
            .send()
            .await
            .unwrap();
        assert_eq!(response.version(), version);
        assert_eq!(response.status(), 201);
        for name in [
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
        ] {
            header(&response, name).parse::<u64>().unwrap();
        }
        assert!(header(&response, "ratelimit-policy").contains("\"tenant\";q=1000"));
        assert!(header(&response, "ratelimit").contains("\"tenant\";r="));

        let key = format!("order-tls-{http2}");
        let mut bodies = Vec::new();
        for _ in 0..2 {
            let response = client
                .post(gateway.url() + "/orders")
                .bearer_auth("acme-key-0001")
                .header("idempotency-key", &key)
                .header("content-type", "application/json")
                .body("{\"item\":1}")
                .send()
                .await
                .unwrap();
            assert_eq!(response.version(), version);
            assert_eq!(response.status(), 201);
            let replayed = response.headers().get("idempotent-replayed").cloned();
            bodies.push((
                replayed,
                header(&response, "x-order"),
                response.bytes().await.unwrap(),
            ));
        }
        assert_eq!(bodies[0].0, None);
        assert_eq!(bodies[1].0.as_ref().unwrap(), "true");
        assert_eq!((&bodies[0].1, &bodies[0].2), (&bodies[1].1, &bodies[1].2));
    }
    // Two GETs and two first POSTs reached the upstream, told the client used TLS.
    let hits = upstream.hits();
    assert_eq!(hits.len(), 4, "{hits:?}");
    for hit in hits {
        assert_eq!(hit.headers["x-forwarded-proto"], "https");
        assert!(hit.headers["x-forwarded-host"]
            .to_str()
            .unwrap()
            .starts_with("127.0.0.1:"));
    }
}

/// Polls (bounded) until the listener presents `expected`.
async fn wait_presented(addr: std::net::SocketAddr, ca: &TestCa, expected: &[u8]) -> bool {
    for _ in 0..60 {
        if presented_certificate(addr, &ca.pem()).await.as_deref() == Ok(expected) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn certificate_rotation_keeps_connections_and_refuses_bad_files() {
    let ca = TestCa::new("rotation-ca");
    let dir = tempfile::tempdir().unwrap();
    let first = ca.server();
    let (cert, key) = first.write(dir.path(), "server");
    let upstream = ScriptedUpstream::start(vec![Step::stall(
        Duration::from_millis(1500),
        Step::ok("slow"),
    )])
    .await;
    let mut gateway = start_tls(&ca, &config(&upstream.url(), "", Some((&cert, &key)))).await;
    assert_eq!(
        presented_certificate(gateway.addr, &ca.pem())
            .await
            .unwrap(),
        first.der
    );

    // An h2 connection with a request in flight across the rotation.
    let client = tls_client(&ca, true);
    let in_flight = tokio::spawn(client.get(gateway.url() + "/slow").send());
    for _ in 0..100 {
        if upstream.hit_count() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        upstream.hit_count(),
        1,
        "the slow request never reached the upstream"
    );

    let second = ca.server();
    second.write(dir.path(), "server");
    gateway.guard().signal("HUP");
    assert!(
        wait_presented(gateway.addr, &ca, &second.der).await,
        "new handshakes never saw the new certificate; log:\n{}",
        gateway.logs()
    );

    let response = in_flight.await.unwrap().unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "slow");
    // The old connection still serves new requests.
    let again = client.get(gateway.url() + "/again").send().await.unwrap();
    assert_eq!(again.status(), 200);

    // A bad file is refused with a log line; the current certificate stays.
    tls::write_atomic(
        &cert,
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    gateway.guard().signal("HUP");
    let mut refused = false;
    for _ in 0..60 {
        refused = gateway.logs().contains("new TLS certificate refused");
        if refused {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(refused, "no refusal logged:\n{}", gateway.logs());
    assert_eq!(
        presented_certificate(gateway.addr, &ca.pem())
            .await
            .unwrap(),
        second.der
    );

    // Fixed files are picked up by the mtime poll alone, no signal needed.
    let third = ca.server();
    third.write(dir.path(), "server");
    assert!(
        wait_presented(gateway.addr, &ca, &third.der).await,
        "file change not picked up; log:\n{}",
        gateway.logs()
    );
    assert!(gateway.guard().is_running());
}

#[tokio::test]
async fn admin_listener_presents_its_own_certificate() {
    let ca = TestCa::new("admin-ca");
    let dir = tempfile::tempdir().unwrap();
    let (proxy, admin) = (ca.server(), ca.server());
    let (cert, key) = proxy.write(dir.path(), "proxy");
    let (admin_cert, admin_key) = admin.write(dir.path(), "admin");
    let upstream = ScriptedUpstream::start(vec![]).await;
    let extra = format!("\n[server.admin_tls]\ncert = {admin_cert:?}\nkey = {admin_key:?}\n");
    let text = config(&upstream.url(), "", Some((&cert, &key))) + &extra;
    let gateway = start_tls(&ca, &text).await;
    assert_eq!(
        presented_certificate(gateway.addr, &ca.pem())
            .await
            .unwrap(),
        proxy.der
    );
    assert_eq!(
        presented_certificate(gateway.admin_addr, &ca.pem())
            .await
            .unwrap(),
        admin.der
    );
    assert_eq!(
        tls_get_status(gateway.admin_addr, &ca.pem(), "/healthz").await,
        Some(200)
    );
    // Plain HTTP is not served on a TLS listener.
    assert_eq!(
        portcullis_testkit::gateway::raw_get_status(gateway.admin_addr, "/healthz").await,
        None
    );
}

#[tokio::test]
async fn smuggling_over_tls_gets_400_problem_json_and_the_connection_closed() {
    let ca = TestCa::new("smuggling-ca");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.server().write(dir.path(), "server");
    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::Echo).await;
    let gateway = start_tls(&ca, &config(&upstream.url(), "", Some((&cert, &key)))).await;
    for (framing, reason) in h2::SMUGGLING_ATTEMPTS {
        let attack = h2::smuggling_attack(framing);
        let answer = tls::tls_raw_request(gateway.addr, &ca.pem(), attack.as_bytes()).await;
        h2::assert_refused(answer, 1, reason);
    }
    // The admin listener guards its connections the same way.
    let attack = h2::smuggling_attack(h2::SMUGGLING_ATTEMPTS[2].0).replace("/first", "/healthz");
    let answer =
        portcullis_testkit::gateway::raw_request(gateway.admin_addr, attack.as_bytes()).await;
    h2::assert_refused(answer, 1, h2::SMUGGLING_ATTEMPTS[2].1);
    let paths: Vec<String> = upstream
        .hits()
        .iter()
        .map(|h| h.uri.path().to_owned())
        .collect();
    assert_eq!(paths, vec!["/first"; h2::SMUGGLING_ATTEMPTS.len()]);
}

// HTTP/2 framing seen raw: SETTINGS, stream limits, h2c on/off, smuggling attempts.
mod h2;
