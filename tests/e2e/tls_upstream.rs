//! HTTPS upstreams: certificate errors are a 502 naming the reason and never retried; a
//! configured CA bundle and client certificate (mTLS) make them work; HTTP/2 toward upstreams
//! over ALPN and prior knowledge; a handshake timeout is retried as provably unprocessed;
//! unreadable PEM files refuse start-up naming the field and the path.

use std::process::Command;
use std::time::Duration;

use portcullis_testkit::gateway::GatewayProcess;
use portcullis_testkit::tls::{self, Issued, SilentListener, TestCa};
use portcullis_testkit::upstream::ScriptedUpstream;

use crate::common::{assert_problem, client, BIN};

/// One upstream + route per `(name, endpoint, extra upstream lines)`, routed from `/{name}`.
/// Every upstream may retry 3 times quickly, so a retried failure would be visible.
fn routes(upstreams: &[(&str, String, String)]) -> String {
    let mut text = String::new();
    for (name, endpoint, extra) in upstreams {
        text.push_str(&format!(
            "[[upstreams]]\nname = \"{name}\"\nendpoints = [\"{endpoint}\"]\nretry = {{ max_retries = 3, base = \"10ms\", cap = \"20ms\" }}\n{extra}\n\n[[routes]]\nprefix = \"/{name}\"\nupstream = \"{name}\"\n\n"
        ));
    }
    text
}

#[tokio::test]
async fn untrusted_certificate_is_one_502_naming_the_reason_and_the_ca_makes_it_200() {
    let dir = tempfile::tempdir().unwrap();
    let leaf = Issued::self_signed();
    let bundle = tls::write_atomic(&dir.path().join("upstream.pem"), &leaf.cert_pem);
    let other = TestCa::new("other-ca").write(dir.path(), "other.pem");
    let upstream = ScriptedUpstream::start_tls(vec![], tls::server_config(&leaf, None)).await;
    let config = routes(&[
        ("system", upstream.url(), String::new()),
        (
            "other",
            upstream.url(),
            format!("tls = {{ ca = {other:?} }}"),
        ),
        (
            "trusted",
            upstream.url(),
            format!("tls = {{ ca = {bundle:?} }}"),
        ),
    ]);
    let gateway = GatewayProcess::start(BIN, &config).await;

    for (n, route) in ["system", "other"].into_iter().enumerate() {
        let response = client()
            .get(format!("{}/{route}", gateway.url()))
            .send()
            .await
            .unwrap();
        let body = assert_problem(response, 502).await;
        assert_eq!(
            body["type"],
            "https://portcullis.dev/problems/upstream-certificate"
        );
        assert_eq!(body["reason"], "UnknownIssuer", "{body}");
        assert!(
            body["detail"]
                .as_str()
                .unwrap()
                .contains("upstream certificate rejected: UnknownIssuer"),
            "{body}"
        );
        // Exactly one connection attempt per request: certificate errors are never retried.
        assert_eq!(upstream.connections(), n + 1, "{route}");
    }
    assert_eq!((upstream.handshakes(), upstream.hit_count()), (0, 0));

    let response = client()
        .get(gateway.url() + "/trusted/x")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "ok");
    assert_eq!(upstream.handshakes(), 1);
    assert_eq!(upstream.hits()[0].version, http::Version::HTTP_11);
    assert!(
        gateway.logs().contains("tls_certificate")
            || gateway.logs().contains("upstream request failed")
    );
}

#[tokio::test]
async fn mtls_upstream_works_with_the_client_certificate_and_is_a_502_without() {
    let dir = tempfile::tempdir().unwrap();
    let (server_ca, client_ca) = (TestCa::new("server-ca"), TestCa::new("client-ca"));
    let ca = server_ca.write(dir.path(), "server-ca.pem");
    let (cert, key) = client_ca.client("portcullis").write(dir.path(), "client");
    let upstream = ScriptedUpstream::start_tls(
        vec![],
        tls::server_config(&server_ca.server(), Some(&client_ca)),
    )
    .await;
    let config = routes(&[
        (
            "with",
            upstream.url(),
            format!("tls = {{ ca = {ca:?}, client_cert = {cert:?}, client_key = {key:?} }}"),
        ),
        (
            "without",
            upstream.url(),
            format!("tls = {{ ca = {ca:?} }}"),
        ),
    ]);
    let gateway = GatewayProcess::start(BIN, &config).await;

    let response = client().get(gateway.url() + "/with").send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.hit_count(), 1);

    let before = upstream.connections();
    let response = client()
        .get(gateway.url() + "/without")
        .send()
        .await
        .unwrap();
    let body = assert_problem(response, 502).await;
    assert_eq!(
        body["type"], "https://portcullis.dev/problems/upstream-certificate",
        "{body}"
    );
    assert!(
        body["reason"]
            .as_str()
            .unwrap()
            .contains("CertificateRequired"),
        "{body}"
    );
    assert_eq!(
        upstream.connections() - before,
        1,
        "a certificate refusal was retried"
    );
    assert_eq!(upstream.hit_count(), 1);
}

#[tokio::test]
async fn http2_toward_upstreams_over_alpn_and_prior_knowledge() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("h2-ca");
    let bundle = ca.write(dir.path(), "ca.pem");
    let secure = ScriptedUpstream::start_tls(vec![], tls::server_config(&ca.server(), None)).await;
    let plain = ScriptedUpstream::start(vec![]).await;
    let tls_line = format!("tls = {{ ca = {bundle:?}, server_name = \"localhost\" }}");
    let config = routes(&[
        ("tls-h2", secure.url(), format!("{tls_line}\nhttp2 = true")),
        ("tls-h1", secure.url(), tls_line.clone()),
        ("h2c", plain.url(), "http2 = true".to_owned()),
        ("h1", plain.url(), String::new()),
    ]);
    let gateway = GatewayProcess::start(BIN, &config).await;
    for route in ["tls-h2", "tls-h1", "h2c", "h1"] {
        let response = client()
            .get(format!("{}/{route}", gateway.url()))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{route}");
    }
    let version = |upstream: &ScriptedUpstream, path: &str| {
        upstream
            .hits()
            .into_iter()
            .find(|h| h.uri.path() == path)
            .map(|h| h.version)
    };
    assert_eq!(version(&secure, "/tls-h2"), Some(http::Version::HTTP_2));
    assert_eq!(version(&secure, "/tls-h1"), Some(http::Version::HTTP_11));
    assert_eq!(version(&plain, "/h2c"), Some(http::Version::HTTP_2));
    assert_eq!(version(&plain, "/h1"), Some(http::Version::HTTP_11));
}

#[tokio::test]
async fn tls_handshake_timeout_is_retried_even_for_post() {
    let silent = SilentListener::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("unused").write(dir.path(), "ca.pem");
    let config = format!(
        "[[upstreams]]\nname = \"slow\"\nendpoints = [\"{}\"]\ntls_handshake_timeout = \"200ms\"\ntls = {{ ca = {ca:?} }}\nretry = {{ max_retries = 1, base = \"10ms\", cap = \"20ms\" }}\n\n[[routes]]\nprefix = \"/\"\nupstream = \"slow\"\n",
        silent.url()
    );
    let gateway = GatewayProcess::start(BIN, &config).await;
    let response = client()
        .post(gateway.url() + "/orders")
        .body("x")
        .send()
        .await
        .unwrap();
    let body = assert_problem(response, 504).await;
    assert_eq!(
        body["type"], "https://portcullis.dev/problems/upstream-timeout",
        "{body}"
    );
    // Provably unprocessed (no request byte before the handshake): retried for any method.
    for _ in 0..20 {
        if silent.connections() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(silent.connections(), 2);
}

#[test]
fn unreadable_pem_files_refuse_to_start_naming_field_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing-ca.pem");
    let garbage = tls::write_atomic(&dir.path().join("garbage.key"), "not a key");
    let cert = TestCa::new("x").server().write(dir.path(), "server").0;
    let text = format!(
        "[server.tls]\ncert = {cert:?}\nkey = {garbage:?}\n\n[[upstreams]]\nname = \"u\"\nendpoints = [\"https://127.0.0.1:9\"]\ntls = {{ ca = {missing:?} }}\n"
    );
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let output = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("server.tls.key") && stderr.contains("garbage.key"),
        "{stderr}"
    );
    assert!(
        stderr.contains("upstreams[0].tls.ca") && stderr.contains("missing-ca.pem"),
        "{stderr}"
    );
}
