//! Real Redis Cluster for tests: three masters on loopback, no replicas.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::ports::free_port;
use crate::process::{wait_for_tcp, ChildGuard, READY_ATTEMPTS, READY_POLL};

/// Environment variable holding the seed URL of the shared cluster started by
/// `scripts/test.sh` (`redis-cluster://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C`).
pub const SHARED_URL_ENV: &str = "PORTCULLIS_TEST_REDIS_CLUSTER_URL";

/// The shared cluster's `redis-cluster://…` URL, or `None` (with a note on stderr) when the
/// suite runs without it, e.g. plain `cargo test` of one crate.
pub fn shared_url() -> Option<String> {
    let url = std::env::var(SHARED_URL_ENV).ok();
    if url.is_none() {
        eprintln!("{SHARED_URL_ENV} is not set: skipping the Redis Cluster instantiation (scripts/test.sh starts one)");
    }
    url
}

/// The seed nodes of a `redis-cluster://h1:p1,h2:p2` URL as `redis://h:p` URLs.
pub fn seed_nodes(url: &str) -> Vec<String> {
    url.trim_start_matches("redis-cluster://")
        .split(',')
        .map(|node| format!("redis://{node}"))
        .collect()
}

/// A private 3-master cluster, for tests that kill a node. Each node keeps its
/// `nodes.conf` in a temp dir, so a restarted node rejoins with the same id and slots.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
    node_timeout: Duration,
}

#[derive(Debug)]
struct Node {
    port: u16,
    bus_port: u16,
    guard: Option<ChildGuard>,
}

// === impl RedisCluster ===

impl RedisCluster {
    /// Starts three masters, creates the cluster (`redis-cli --cluster create`) and waits,
    /// bounded, until every node reports `cluster_state:ok`. `node_timeout` is the
    /// cluster's failure-detection time (`cluster-node-timeout`).
    pub async fn start(node_timeout: Duration) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for redis cluster");
        let mut cluster = Self {
            nodes: (0..3)
                .map(|_| Node {
                    port: free_port(),
                    bus_port: free_port(),
                    guard: None,
                })
                .collect(),
            dir,
            node_timeout,
        };
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i).await;
        }
        let addrs: Vec<String> = cluster
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let status = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        cluster.wait_ok().await;
        cluster
    }

    async fn spawn(&mut self, i: usize) {
        let node_timeout = self.node_timeout.as_millis().to_string();
        let dir = self.dir.path().to_owned();
        let node = &mut self.nodes[i];
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &node.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--cluster-port", &node.bus_port.to_string()])
            .args([
                "--save",
                "",
                "--appendonly",
                "no",
                "--cluster-enabled",
                "yes",
            ])
            .args(["--cluster-node-timeout", &node_timeout])
            .arg("--cluster-config-file")
            .arg(dir.join(format!("nodes-{}.conf", node.port)))
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        node.guard = Some(
            ChildGuard::spawn("redis-server (cluster)", cmd)
                .expect("spawn redis-server (is it installed?)"),
        );
        let addr = ([127, 0, 0, 1], node.port).into();
        assert!(
            wait_for_tcp(addr, READY_ATTEMPTS).await,
            "cluster node did not start on {addr}"
        );
    }

    /// Waits (bounded: `READY_ATTEMPTS` polls) until every running node says
    /// `cluster_state:ok`.
    pub async fn wait_ok(&self) {
        for _ in 0..READY_ATTEMPTS {
            if self.nodes.iter().all(|n| n.state_ok()) {
                return;
            }
            tokio::time::sleep(READY_POLL).await;
        }
        panic!("redis cluster did not reach cluster_state:ok");
    }

    /// `redis-cluster://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        format!("redis-cluster://{}", hosts.join(","))
    }

    /// The seed nodes as `redis://127.0.0.1:PORT` URLs.
    pub fn node_urls(&self) -> Vec<String> {
        seed_nodes(&self.url())
    }

    /// The port of the master that serves `key`'s slot (`CLUSTER KEYSLOT`, then the slot
    /// ranges of `CLUSTER NODES`).
    pub fn port_of_key(&self, key: &str) -> Option<u16> {
        let port = self.nodes.first()?.port.to_string();
        let out = Command::new("redis-cli")
            .args(["-p", &port, "cluster", "keyslot", key])
            .output()
            .ok()?;
        let slot: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
        let out = Command::new("redis-cli")
            .args(["-p", &port, "cluster", "nodes"])
            .output()
            .ok()?;
        // <id> <ip:port@bus> <flags> <master> <ping> <pong> <epoch> <link> <slot ranges…>
        String::from_utf8_lossy(&out.stdout).lines().find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let owns = fields.iter().skip(8).any(|range| {
                let (lo, hi) = range.split_once('-').unwrap_or((range, range));
                matches!((lo.parse::<u16>(), hi.parse::<u16>()), (Ok(lo), Ok(hi)) if lo <= slot && slot <= hi)
            });
            let addr = fields.get(1)?;
            owns.then(|| addr.split(['@', ':']).nth(1)?.parse().ok())
                .flatten()
        })
    }

    /// Kills (SIGKILL) the node on `port`; its port and `nodes.conf` stay for
    /// [`RedisCluster::restart`].
    pub fn kill(&mut self, port: u16) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            if let Some(mut guard) = node.guard.take() {
                guard.kill();
            }
        }
    }

    /// Starts the node on `port` again (same port, same `nodes.conf`, empty dataset) and
    /// waits until the cluster is ok again.
    pub async fn restart(&mut self, port: u16) {
        self.kill(port);
        if let Some(i) = self.nodes.iter().position(|n| n.port == port) {
            self.spawn(i).await;
        }
        self.wait_ok().await;
    }
}

// === impl Node ===

impl Node {
    fn state_ok(&self) -> bool {
        if self.guard.is_none() {
            return true;
        }
        Command::new("redis-cli")
            .args(["-p", &self.port.to_string(), "cluster", "info"])
            .output()
            .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("cluster_state:ok"))
    }
}
