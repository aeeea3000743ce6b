//! A real three-primary Redis Cluster on free loopback ports, killed (and its files removed) when dropped.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::redis::{redis_cli, spawn_redis, RedisProcess};
use super::{eventually_blocking, ReservedPort};

/// A running Redis Cluster of three primaries without replicas, covering all 16384 slots.
pub struct RedisCluster {
    /// The client ports of the nodes.
    pub ports: Vec<u16>,
    nodes: Vec<Node>,
    _dir: tempfile::TempDir,
}

impl RedisCluster {
    /// Starts three `redis-server --cluster-enabled yes` nodes, joins them with `redis-cli --cluster create`
    /// and waits until every node reports `cluster_state:ok`.
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut cluster = Self {
            ports: Vec::new(),
            nodes: Vec::new(),
            _dir: dir,
        };
        for _ in 0..3 {
            let node = start_node(cluster._dir.path());
            cluster.ports.push(node.server.port());
            cluster.nodes.push(node);
        }
        let addresses: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addresses)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli must be installed");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let mut waiting = None;
        let ok = eventually_blocking(Duration::from_secs(30), || {
            waiting = cluster.ports.iter().copied().find(|&port| {
                !cli(port, &["CLUSTER", "INFO"])
                    .is_some_and(|info| info.contains("cluster_state:ok"))
            });
            waiting.is_none()
        });
        assert!(
            ok.is_some(),
            "cluster node {waiting:?} never reached cluster_state:ok"
        );
        cluster
    }

    /// `redis-cluster://127.0.0.1:PORT` of the first node (the client discovers the others).
    pub fn url(&self) -> String {
        format!("redis-cluster://127.0.0.1:{}", self.ports[0])
    }

    /// Runs `redis-cli` against node `index` without following redirections: what that node alone holds.
    pub fn cli(&self, index: usize, args: &[&str]) -> Option<String> {
        cli(self.ports[index], args)
    }

    /// Runs `redis-cli -c` (following MOVED redirections) from the first node: the cluster's view of a key.
    pub fn cli_cluster(&self, args: &[&str]) -> Option<String> {
        let output = Command::new("redis-cli")
            .args(["-c", "-h", "127.0.0.1", "-p", &self.ports[0].to_string()])
            .args(args)
            .output()
            .ok()?;
        output
            .status
            .success()
            .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }

    /// The keys matching `pattern` stored on each node, in node order.
    pub fn keys_per_node(&self, pattern: &str) -> Vec<Vec<String>> {
        (0..self.ports.len())
            .map(|i| {
                self.cli(i, &["--scan", "--pattern", pattern])
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_owned)
                    .collect()
            })
            .collect()
    }
}

/// A cluster node: the server, and the bus port it was told, held by this test as long as the server.
struct Node {
    server: RedisProcess,
    _bus: ReservedPort,
}

/// Starts one cluster-enabled node on reserved client and bus ports.
fn start_node(dir: &Path) -> Node {
    let bus = ReservedPort::new();
    let bus_port = bus.port;
    let server = spawn_redis(&[], |port| {
        [
            "--port",
            &port.to_string(),
            "--cluster-port",
            &bus_port.to_string(),
            "--bind",
            "127.0.0.1",
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            &dir.join(format!("nodes-{port}.conf")).to_string_lossy(),
            "--cluster-node-timeout",
            "5000",
            "--dir",
            &dir.to_string_lossy(),
            "--save",
            "",
            "--appendonly",
            "no",
            "--protected-mode",
            "no",
        ]
        .map(str::to_owned)
        .to_vec()
    });
    Node { server, _bus: bus }
}

fn cli(port: u16, args: &[&str]) -> Option<String> {
    redis_cli(port, &[], args)
}
