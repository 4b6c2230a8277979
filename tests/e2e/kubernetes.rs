//! `deploy/kubernetes/` through `scripts/check-kubernetes`: the manifests pass (their
//! ConfigMap's file also through the real binary's `check-config`), and each rule catches
//! the mistake it is for, on a copy of the manifests with that one mistake made.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::BIN;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/check-kubernetes");
const MANIFESTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes");

fn check(dir: &Path) -> Output {
    Command::new("python3")
        .arg(SCRIPT)
        .arg(dir)
        .args(["--bin", BIN])
        .output()
        .expect("python3 runs scripts/check-kubernetes")
}

#[test]
fn the_kubernetes_manifests_agree_with_their_configuration() {
    let output = check(Path::new(MANIFESTS));
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn each_kubernetes_rule_catches_its_mistake() {
    // (file, text, replacement, what the script must say)
    let mistakes = [
        (
            "deployment.yaml",
            "path: /readyz",
            "path: /healthz",
            "readinessProbe must GET /readyz",
        ),
        (
            "deployment.yaml",
            "httpGet: { path: /healthz, port: admin }",
            "httpGet: { path: /healthz, port: proxy }",
            "livenessProbe must probe the admin port",
        ),
        (
            "deployment.yaml",
            "containerPort: 8081",
            "containerPort: 9081",
            "containerPort 'admin'",
        ),
        (
            "deployment.yaml",
            "mountPath: /etc/portcullis/kubernetes, readOnly: true",
            "mountPath: /etc/portcullis/kubernetes/portcullis.toml, subPath: portcullis.toml",
            "subPath",
        ),
        (
            "deployment.yaml",
            "/etc/portcullis/kubernetes/portcullis.toml\"]",
            "/etc/portcullis/portcullis.toml\"]",
            "not in the ConfigMap's mount",
        ),
        (
            "deployment.yaml",
            "terminationGracePeriodSeconds: 35",
            "terminationGracePeriodSeconds: 30",
            "would kill the drain",
        ),
        (
            "deployment.yaml",
            "failureThreshold: 2",
            "failureThreshold: 5",
            "within 2 s",
        ),
        (
            "deployment.yaml",
            "timeoutSeconds: 2\n            failureThreshold: 2",
            "timeoutSeconds: 1\n            failureThreshold: 2",
            "timeoutSeconds must exceed",
        ),
        (
            "deployment.yaml",
            "preStop:\n              exec: { command: [\"sleep\", \"5\"] }",
            "postStart:\n              exec: { command: [\"true\"] }",
            "no preStop hook",
        ),
        (
            "configmap.yaml",
            "admin_listen = \"0.0.0.0:8081\"",
            "admin_listen = \"127.0.0.1:8081\"",
            "must bind 0.0.0.0",
        ),
        (
            "configmap.yaml",
            "shutdown_grace = \"25s\"",
            "shutdown_grace = \"60s\"",
            "would kill the drain",
        ),
        (
            "configmap.yaml",
            "on_store_error = \"fail_open\"",
            "on_store_error = \"sometimes\"",
            "refused by check-config",
        ),
        (
            "service.yaml",
            "targetPort: proxy",
            "targetPort: admin",
            "publishes the admin port",
        ),
        (
            "pdb.yaml",
            "maxUnavailable: 1",
            "minAvailable: 3",
            "blocks every node drain",
        ),
    ];
    for (file, text, replacement, message) in mistakes {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(MANIFESTS).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        let path = dir.path().join(file);
        let original = std::fs::read_to_string(&path).unwrap();
        assert!(original.contains(text), "{file} no longer has {text:?}");
        std::fs::write(&path, original.replacen(text, replacement, 1)).unwrap();
        let output = check(dir.path());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{file}: {replacement:?} passed: {stderr}"
        );
        assert!(
            stderr.contains(message),
            "{file}: {replacement:?}: expected {message:?} in {stderr}"
        );
    }
}
