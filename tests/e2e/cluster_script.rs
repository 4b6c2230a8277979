//! `scripts/cluster`: the docker-compose topology as local processes (3 replicas, Redis,
//! PostgreSQL, demo upstream) comes up, dedupes across replicas, shares one rate limit, and
//! goes away again.

use std::process::Command;

use crate::common::BIN;

#[test]
fn the_local_cluster_works_end_to_end() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/cluster");
    let output = Command::new("timeout")
        .args(["180", script, "--check"])
        .env("PORTCULLIS_BIN", BIN)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "scripts/cluster --check failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("cluster check passed"), "{stdout}");
}
