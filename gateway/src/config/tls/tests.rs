use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::{effective_toml, Config, ConfigError};

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, &HashMap::<String, String>::new())
}

fn issues(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("accepted invalid config:\n{text}"),
        Err(e) => e
            .to_string()
            .lines()
            .skip(1)
            .map(|l| l.trim().to_owned())
            .collect(),
    }
}

/// A self-signed pair written as PEM files; returns (cert, key).
fn pair(dir: &Path, tag: &str) -> (PathBuf, PathBuf) {
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (c, k) = (
        dir.join(format!("{tag}.crt")),
        dir.join(format!("{tag}.key")),
    );
    std::fs::write(&c, cert.cert.pem()).unwrap();
    std::fs::write(&k, cert.key_pair.serialize_pem()).unwrap();
    (c, k)
}

fn upstream(endpoint: &str, extra: &str) -> String {
    format!("[[upstreams]]\nname = \"u\"\nendpoints = [\"{endpoint}\"]\n{extra}\n")
}

#[test]
fn defaults_keep_plain_http_with_h2c() {
    let config = parse(&upstream("http://127.0.0.1:1", "")).unwrap();
    let server = &config.server;
    assert!(server.h2c && server.tls.is_none() && server.admin_tls.is_none());
    assert_eq!(server.http2.max_concurrent_streams, 256);
    assert_eq!(server.http2.max_header_list_size, 32 * 1024);
    assert_eq!(server.http2.initial_stream_window_size, 1 << 20);
    let u = &config.upstreams[0];
    assert!(u.tls.is_none() && !u.http2);
    assert_eq!(u.tls_handshake_timeout, std::time::Duration::from_secs(3));
}

#[test]
fn listener_certificates_are_loaded_and_bad_files_name_field_and_path() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pair(dir.path(), "a");
    let good = format!(
        "[server.tls]\ncert = {cert:?}\nkey = {key:?}\n[server.admin_tls]\ncert = {cert:?}\nkey = {key:?}\n"
    );
    let config = parse(&good).unwrap();
    assert!(config.server.tls.is_some() && config.server.admin_tls.is_some());

    let missing = dir.path().join("missing.crt");
    let found = issues(&format!(
        "[server.tls]\ncert = {missing:?}\nkey = {key:?}\n"
    ));
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("server.tls.cert"), "{found:?}");
    assert!(
        found[0].contains("missing.crt") && found[0].contains("cannot read"),
        "{found:?}"
    );

    let (_, other_key) = pair(dir.path(), "b");
    let found = issues(&format!(
        "[server.admin_tls]\ncert = {cert:?}\nkey = {other_key:?}\n"
    ));
    assert!(found[0].starts_with("server.admin_tls.key"), "{found:?}");
    assert!(found[0].contains("b.key"), "{found:?}");

    let garbage = dir.path().join("garbage.key");
    std::fs::write(&garbage, "nope").unwrap();
    let found = issues(&format!(
        "[server.tls]\ncert = {cert:?}\nkey = {garbage:?}\n"
    ));
    assert!(found[0].starts_with("server.tls.key") && found[0].contains("no PEM PRIVATE KEY"));
}

#[test]
fn http2_limits_are_range_checked() {
    let found = issues(
        "[server.http2]\nmax_concurrent_streams = 0\nmax_header_list_size = 10\ninitial_stream_window_size = 100\ninitial_connection_window_size = 4294967295\n",
    );
    for field in [
        "max_concurrent_streams",
        "max_header_list_size",
        "initial_stream_window_size",
        "initial_connection_window_size",
    ] {
        assert!(
            found
                .iter()
                .any(|l| l.starts_with(&format!("server.http2.{field} ="))),
            "{field} not named in {found:?}"
        );
    }
}

#[test]
fn upstream_tls_fields_are_validated() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pair(dir.path(), "ca");

    let found = issues(&upstream(
        "http://127.0.0.1:1",
        &format!("tls = {{ ca = {cert:?} }}"),
    ));
    assert!(found[0].starts_with("upstreams[0].tls is set but no endpoint is https://"));

    let found = issues(&upstream(
        "https://127.0.0.1:1",
        &format!("tls = {{ ca = {cert:?}, client_cert = {cert:?} }}"),
    ));
    assert!(
        found[0].starts_with("upstreams[0].tls.client_key is missing"),
        "{found:?}"
    );

    let missing = dir.path().join("nope.pem");
    let found = issues(&upstream(
        "https://127.0.0.1:1",
        &format!("tls = {{ ca = {missing:?} }}"),
    ));
    assert!(
        found[0].starts_with("upstreams[0].tls.ca") && found[0].contains("nope.pem"),
        "{found:?}"
    );

    let found = issues(&upstream(
        "https://127.0.0.1:1",
        &format!("tls = {{ ca = {cert:?}, server_name = \"not a name\" }}\ntls_handshake_timeout = \"1ms\""),
    ));
    assert!(
        found
            .iter()
            .any(|l| l.starts_with("upstreams[0].tls_handshake_timeout = 1ms")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|l| l.starts_with("upstreams[0].tls.server_name")),
        "{found:?}"
    );

    let config = parse(&upstream(
        "https://127.0.0.1:1",
        &format!("http2 = true\ntls = {{ ca = {cert:?}, client_cert = {cert:?}, client_key = {key:?}, server_name = \"localhost\" }}"),
    ))
    .unwrap();
    let tls = config.upstreams[0].tls.as_ref().unwrap();
    assert_eq!(tls.client_config.alpn_protocols, vec![b"h2".to_vec()]);
    assert!(tls.client_config.client_auth_cert_resolver.has_certs());
    assert!(tls.server_name.is_some());
}

#[test]
fn effective_config_shows_the_new_tables() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = pair(dir.path(), "a");
    let text = format!(
        "[server]\nh2c = false\n[server.tls]\ncert = {cert:?}\nkey = {key:?}\n\n{}",
        upstream("http://127.0.0.1:1", "http2 = true")
    );
    let effective = effective_toml(&text).unwrap();
    assert!(effective.contains("h2c = false"), "{effective}");
    assert!(effective.contains("[server.tls]"), "{effective}");
    assert!(
        effective.contains("max_concurrent_streams = 256"),
        "{effective}"
    );
    assert!(
        effective.contains("tls_handshake_timeout = \"3s\""),
        "{effective}"
    );
    parse(&effective).unwrap();
}
