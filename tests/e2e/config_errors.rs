use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::BIN;

/// How often, and how many times, the process is checked for its exit: 30 s in all.
const POLL: Duration = Duration::from_millis(20);
const POLLS: u32 = 1500;

/// Runs `portcullis --config` on `text`; returns (exit code, stderr). A configuration that
/// is accepted after all starts a gateway: it is killed after [`POLLS`] checks and the test
/// fails, rather than waiting for ever.
fn run_with(text: &str) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, text).unwrap();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut status = None;
    for _ in 0..POLLS {
        status = child.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        std::thread::sleep(POLL);
    }
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("the configuration was accepted and the gateway kept running:\n{text}");
    };
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    (status.code(), stderr)
}

const UPSTREAM: &str = "[[upstreams]]\nname = \"u\"\nendpoints = [\"http://127.0.0.1:9\"]\n";

#[test]
fn invalid_configurations_refuse_to_start_naming_the_field() {
    let cases: Vec<(String, &str)> = vec![
        (
            format!("{UPSTREAM}retry = {{ max_retries = 6 }}\n"),
            "upstreams[0].retry.max_retries",
        ),
        (
            format!("{UPSTREAM}retry = {{ jitter = \"equal\" }}\n"),
            "upstreams[0].retry.jitter",
        ),
        (
            format!("{UPSTREAM}retry = {{ total = \"45s\" }}\n"),
            "upstreams[0].retry.total",
        ),
        ("[server]\nlisten = \"nowhere\"\n".into(), "server.listen"),
        (
            "[server]\nload_shed_limit = 0\n".into(),
            "server.load_shed_limit",
        ),
        (
            "[server]\ncritical_reserve = 1.0\n".into(),
            "server.critical_reserve",
        ),
        (
            format!(
                "{UPSTREAM}\n[[routes]]\nprefix = \"/a\"\nupstream = \"u\"\npriority = \"high\"\n"
            ),
            "routes[0].priority",
        ),
        (
            format!(
                "{UPSTREAM}\n[[routes]]\nprefix = \"/a\"\nupstream = \"u\"\nconcurrency_per_caller = 0\n"
            ),
            "routes[0].concurrency_per_caller",
        ),
        (
            "[[tenants]]\nid = \"t\"\nrate = 1\nper = \"1s\"\nburst = 1\nconcurrency_limit = 0\n"
                .into(),
            "tenants[0].concurrency_limit",
        ),
        (
            "[server]\nlisten_addr = \"127.0.0.1:1\"\n".into(),
            "server.listen_addr",
        ),
        (
            "[storage]\nstate = \"memcached://x\"\n".into(),
            "storage.state",
        ),
        (
            format!("{UPSTREAM}\n[[routes]]\nprefix = \"/a\"\nupstream = \"missing\"\n"),
            "routes[0].upstream",
        ),
        (
            format!("{UPSTREAM}\n[[routes]]\npattern = \"/a/{{*rest}}/b\"\nupstream = \"u\"\n"),
            "routes[0].pattern",
        ),
        (
            // Two routes on one prefix that only headers tell apart need a name.
            format!("{UPSTREAM}\n[[routes]]\nprefix = \"/a\"\nupstream = \"u\"\n[[routes]]\nprefix = \"/a\"\nheaders = [{{ name = \"x-v\", value = \"2\" }}]\nupstream = \"u\"\n"),
            "routes[1].prefix",
        ),
        (
            "[[tenants]]\nid = \"t\"\nrate = 5\nper = \"often\"\nburst = 1\n".into(),
            "tenants[0].per",
        ),
        (
            "[server]\nmax_body_bytes = \"big\"\n".into(),
            "server.max_body_bytes",
        ),
        (
            // The secret's variable is not set in the gateway's environment.
            format!("{UPSTREAM}\n[[routes]]\nprefix = \"/hooks\"\nupstream = \"u\"\nverify = {{ scheme = \"stripe\", secret_env = \"PORTCULLIS_TEST_UNSET_SECRET\" }}\n"),
            "routes[0].verify.secret_env",
        ),
        (
            format!("{UPSTREAM}\n[[routes]]\nprefix = \"/hooks\"\nupstream = \"u\"\ndelivery = {{ mode = \"async\", max_retries = 9 }}\n"),
            "routes[0].delivery.max_retries",
        ),
        (
            format!("{UPSTREAM}\n[[routes]]\nprefix = \"/hooks\"\nupstream = \"u\"\ndelivery = {{ mode = \"async\", schedule = [\"1s\", \"50ms\"] }}\n"),
            "routes[0].delivery.schedule",
        ),
    ];
    for (text, field) in cases {
        let (code, stderr) = run_with(&text);
        assert_eq!(code, Some(2), "must refuse to start: {text}\n{stderr}");
        assert!(
            stderr.contains(field),
            "stderr must name {field}:\n{stderr}"
        );
    }
}

#[test]
fn missing_file_is_reported() {
    let output = Command::new(BIN)
        .args(["--config", "/nonexistent/portcullis.toml"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/portcullis.toml"));
}

#[test]
fn check_config_prints_effective_configuration_with_secrets_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.toml");
    std::fs::write(
        &path,
        format!("{UPSTREAM}\n[storage]\ndatabase = \"postgres://app:s3cret-pw@127.0.0.1/db\"\n\n[[tenants]]\nid = \"acme\"\napi_keys = [\"acme-very-secret\"]\nrate = 1\nper = \"1s\"\nburst = 1\n"),
    )
    .unwrap();
    let output = Command::new(BIN)
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("max_retries = 3"),
        "defaults shown: {stdout}"
    );
    assert!(
        !stdout.contains("s3cret-pw") && !stdout.contains("acme-very-secret"),
        "{stdout}"
    );

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, format!("{UPSTREAM}retry = {{ max_retries = 9 }}\n")).unwrap();
    let output = Command::new(BIN)
        .arg("check-config")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr)
        .contains("upstreams[0].retry.max_retries = 9: allowed 0..=5"));
}

#[test]
fn check_config_without_a_file_prints_the_embedded_default() {
    // From an empty directory with no file named: what `portcullis` alone would run.
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .arg("check-config")
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("embedded default"), "{stderr}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    // The example's demo upstream and route, with every default filled in.
    assert!(stdout.contains("[demo]"), "{stdout}");
    assert!(stdout.contains("max_retries = 3"), "{stdout}");
    let reparsed: toml::Value = toml::from_str(&stdout).expect("the output is TOML");
    assert!(reparsed.get("upstreams").is_some(), "{stdout}");
}
