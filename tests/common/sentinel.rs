//! A real Sentinel deployment on free loopback ports: a master, one replica and one sentinel, killed when dropped.

use std::path::Path;
use std::time::Duration;

use super::eventually_blocking;
use super::redis::{redis_cli, spawn_redis, RedisProcess};

/// The name the sentinel monitors the master under.
pub const SERVICE: &str = "mymaster";

/// A master, a replica of it and a sentinel watching both.
pub struct RedisSentinel {
    pub master_port: u16,
    pub replica_port: u16,
    pub sentinel_port: u16,
    servers: Vec<RedisProcess>,
    _dir: tempfile::TempDir,
}

impl RedisSentinel {
    /// Starts the three servers and waits until the replica is in sync and the sentinel knows it as a healthy
    /// replica (so that a failover can be asked for at once).
    pub fn start() -> Self {
        Self::start_with_master_args(&[])
    }

    /// [`start`](Self::start) with `extra` arguments for the master's `redis-server`.
    pub fn start_with_master_args(extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_dir = dir.path().to_owned();
        let master = spawn_redis(&[], |port| {
            let mut args = server_args(port, None, &data_dir);
            args.extend(extra.iter().map(|arg| arg.to_string()));
            args
        });
        let master_port = master.port();
        let replica = spawn_redis(&[], |port| server_args(port, Some(master_port), &data_dir));
        let config_dir = dir.path().to_owned();
        let sentinel = spawn_redis(&[], |port| {
            let config = config_dir.join(format!("sentinel-{port}.conf"));
            std::fs::write(
                &config,
                format!(
                    "port {port}\n\
                     bind 127.0.0.1\n\
                     dir {dir}\n\
                     sentinel resolve-hostnames no\n\
                     sentinel monitor {SERVICE} 127.0.0.1 {master_port} 1\n\
                     sentinel down-after-milliseconds {SERVICE} 5000\n\
                     sentinel failover-timeout {SERVICE} 10000\n\
                     sentinel parallel-syncs {SERVICE} 1\n",
                    dir = config_dir.display()
                ),
            )
            .expect("write sentinel config");
            vec![
                config.to_string_lossy().into_owned(),
                "--sentinel".to_owned(),
            ]
        });
        let set = Self {
            master_port,
            replica_port: replica.port(),
            sentinel_port: sentinel.port(),
            servers: vec![master, replica, sentinel],
            _dir: dir,
        };
        let in_sync = eventually_blocking(Duration::from_secs(30), || {
            set.cli(set.replica_port, &["INFO", "replication"])
                .is_some_and(|info| info.contains("master_link_status:up"))
                && set.sentinel_sees_healthy_replica()
        });
        assert!(
            in_sync.is_some(),
            "the sentinel never saw the replica in sync"
        );
        set
    }

    /// `redis-sentinel://127.0.0.1:SENTINEL_PORT?sentinelServiceName=mymaster`.
    pub fn url(&self) -> String {
        format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName={SERVICE}",
            self.sentinel_port
        )
    }

    /// Runs `redis-cli` against `port` (any of the three); the trimmed output, or `None` if it failed.
    pub fn cli(&self, port: u16, args: &[&str]) -> Option<String> {
        redis_cli(port, &[], args)
    }

    /// The port of the master according to the sentinel.
    pub fn master_by_sentinel(&self) -> Option<u16> {
        self.cli(
            self.sentinel_port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE],
        )?
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
    }

    /// Asks the sentinel for a failover (`SENTINEL FAILOVER`), retrying while it has no replica it deems fit
    /// yet, and waits until the sentinel names the replica as master and that server says it is one. Returns the
    /// new master's port.
    pub fn failover(&self) -> u16 {
        let mut reply = String::new();
        let asked = eventually_blocking(Duration::from_secs(60), || {
            reply = self
                .cli(self.sentinel_port, &["SENTINEL", "FAILOVER", SERVICE])
                .unwrap_or_default();
            reply == "OK"
        })
        .unwrap_or_else(|| panic!("SENTINEL FAILOVER kept failing: {reply}"));
        let promoted = eventually_blocking(Duration::from_secs(60).saturating_sub(asked), || {
            self.master_by_sentinel() == Some(self.replica_port)
                && self
                    .cli(self.replica_port, &["ROLE"])
                    .is_some_and(|role| role.starts_with("master"))
        });
        assert!(
            promoted.is_some(),
            "the failover did not promote the replica"
        );
        self.replica_port
    }

    /// True when the sentinel lists the replica as a reachable replica whose link to the master is up.
    fn sentinel_sees_healthy_replica(&self) -> bool {
        let Some(replicas) = self.cli(self.sentinel_port, &["SENTINEL", "REPLICAS", SERVICE])
        else {
            return false;
        };
        let lines: Vec<&str> = replicas.lines().map(str::trim).collect();
        let field = |name: &str| {
            lines
                .iter()
                .position(|l| *l == name)
                .and_then(|i| lines.get(i + 1).copied())
        };
        field("port") == Some(&self.replica_port.to_string())
            && field("flags") == Some("slave")
            && field("master-link-status") == Some("ok")
    }
}

/// Arguments of a data server on `port`, a replica of `master` when given. Files (the RDB a replica receives)
/// go to `dir`, under a name per port.
fn server_args(port: u16, master: Option<u16>, dir: &Path) -> Vec<String> {
    let (dir, file, master) = (
        dir.to_string_lossy(),
        format!("dump-{port}.rdb"),
        master.map(|port| port.to_string()),
    );
    let mut extra = vec!["--dir", &dir, "--dbfilename", &file];
    if let Some(master) = &master {
        extra.extend(["--replicaof", "127.0.0.1", master]);
    }
    super::redis::server_args(port, &extra)
}
