//! TLS to Redis (`rediss://`): the gateway's rate limiter and idempotency store on a local
//! `redis-server` that listens only on its TLS port, with a certificate from a test CA the
//! gateway trusts through `SSL_CERT_FILE`. What reached the upstream and what Redis holds
//! are both checked.

use std::process::{Command, Stdio};

use portcullis_testkit::gateway::{parse_status, raw_request, GatewayOptions, GatewayProcess};
use portcullis_testkit::ports::free_port;
use portcullis_testkit::process::{wait_for_tcp, ChildGuard};
use portcullis_testkit::tls::TestCa;
use portcullis_testkit::upstream::{ScriptedUpstream, Step};

use crate::common::BIN;

#[tokio::test]
async fn rediss_carries_rate_limits_and_idempotency_records() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new("redis test CA");
    let ca_file = ca.write(dir.path(), "ca.pem");
    let (cert, key) = ca.server().write(dir.path(), "redis");
    let port = free_port();
    let mut cmd = Command::new("redis-server");
    cmd.args([
        "--port",
        "0",
        "--tls-port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
    ])
    .arg("--tls-cert-file")
    .arg(&cert)
    .arg("--tls-key-file")
    .arg(&key)
    .arg("--tls-ca-cert-file")
    .arg(&ca_file)
    .args([
        "--tls-auth-clients",
        "no",
        "--save",
        "",
        "--appendonly",
        "no",
    ])
    .arg("--dir")
    .arg(dir.path())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    let _redis = ChildGuard::spawn("redis-server (TLS)", cmd).expect("redis-server with TLS");
    assert!(
        wait_for_tcp(([127, 0, 0, 1], port).into(), 100).await,
        "redis-server did not open its TLS port (built without TLS?)"
    );

    let upstream = ScriptedUpstream::start_with_fallback(vec![], Step::ok("paid")).await;
    let config = format!(
        "[storage]\nstate = \"rediss://127.0.0.1:{port}\"\nstate_timeout = \"500ms\"\n\n\
         [rate_limit]\non_store_error = \"fail_closed\"\n\n\
         [[tenants]]\nid = \"tls\"\napi_keys = [\"tls-client-key\"]\nrate = 1\nper = \"60s\"\nburst = 3\n\n\
         [[upstreams]]\nname = \"u\"\nendpoints = [\"{}\"]\nretry = {{ max_retries = 0 }}\n\n\
         [[routes]]\nprefix = \"/\"\nupstream = \"u\"\nidempotency = {{ methods = [\"POST\"] }}\n",
        upstream.url()
    );
    let options = GatewayOptions {
        env: vec![(
            "SSL_CERT_FILE".to_owned(),
            ca_file.to_string_lossy().into_owned(),
        )],
        ..GatewayOptions::default()
    };
    let gw = GatewayProcess::start_with(BIN, &config, options).await;
    let ready = raw_request(
        gw.addr,
        b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    .await
    .expect("an answer");
    assert_eq!(
        parse_status(&ready),
        Some(200),
        "{}\n{}",
        String::from_utf8_lossy(&ready),
        gw.logs()
    );

    // Two POSTs with one key: one reaches the upstream, the other is a replay.
    let post = "POST /pay HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tls-client-key\r\n\
                Idempotency-Key: k-1\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
    let mut statuses = Vec::new();
    for _ in 0..2 {
        let answer = raw_request(gw.addr, post.as_bytes())
            .await
            .expect("an answer");
        statuses.push(parse_status(&answer));
    }
    assert_eq!(statuses, [Some(200), Some(200)], "{}", gw.logs());
    assert_eq!(upstream.hit_count(), 1, "the second POST was replayed");
    // The limiter decided over TLS: burst 3, two spent; then a GET; then 429.
    let get =
        "GET /x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tls-client-key\r\nConnection: close\r\n\r\n";
    let mut statuses = Vec::new();
    for _ in 0..3 {
        let answer = raw_request(gw.addr, get.as_bytes())
            .await
            .expect("an answer");
        statuses.push(parse_status(&answer));
    }
    assert_eq!(statuses[2], Some(429), "{statuses:?}\n{}", gw.logs());

    // The state is in that Redis, reached over TLS only.
    let out = Command::new("redis-cli")
        .args(["--tls", "-p", &port.to_string(), "--cacert"])
        .arg(&ca_file)
        .args(["--scan", "--pattern", "*"])
        .output()
        .unwrap();
    let keys = String::from_utf8_lossy(&out.stdout);
    assert!(keys.contains("rl:{tenant:tls}"), "{keys}");
    assert!(keys.lines().any(|k| k.contains("k-1")), "{keys}");
}
