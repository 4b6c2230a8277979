//! `scripts/cluster`: the docker-compose topology as local processes (3 replicas, Redis,
//! PostgreSQL, demo upstream) comes up, dedupes across replicas, shares one rate limit, and
//! goes away again; the same with a 6-node Redis Cluster (`--redis-cluster`) instead of Redis.

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

#[test]
fn the_local_cluster_works_on_a_six_node_redis_cluster() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/cluster");
    let output = Command::new("timeout")
        .args(["180", script, "--redis-cluster", "--check"])
        .env("PORTCULLIS_BIN", BIN)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "scripts/cluster --redis-cluster --check failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("redis-cluster://"), "{stdout}");
    assert!(stdout.contains("cluster check passed"), "{stdout}");
}
