//! A real Sentinel deployment on free loopback ports: a master, one replica and one sentinel, killed when dropped.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

/// The name the sentinel monitors the master under.
pub const SERVICE: &str = "mymaster";

/// How many times to start a server on a fresh port when the free port picked was taken meanwhile.
const START_ATTEMPTS: usize = 5;

/// A master, a replica of it and a sentinel watching both.
pub struct RedisSentinel {
    pub master_port: u16,
    pub replica_port: u16,
    pub sentinel_port: u16,
    children: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl RedisSentinel {
    /// Starts the three servers and waits until the replica is in sync and the sentinel knows it as a healthy
    /// replica (so that a failover can be asked for at once).
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let data_dir = dir.path().to_owned();
        let (master_port, master) = start_server(|port| server_args(port, None, &data_dir));
        let mut set = Self {
            master_port,
            replica_port: 0,
            sentinel_port: 0,
            children: vec![master],
            _dir: dir,
        };
        let (replica_port, replica) =
            start_server(|port| server_args(port, Some(master_port), &data_dir));
        set.replica_port = replica_port;
        set.children.push(replica);

        let config_dir = set._dir.path().to_owned();
        let (sentinel_port, sentinel) = start_server(|port| {
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
        set.sentinel_port = sentinel_port;
        set.children.push(sentinel);

        let deadline = Instant::now() + Duration::from_secs(30);
        while !(set
            .cli(replica_port, &["INFO", "replication"])
            .is_some_and(|info| info.contains("master_link_status:up"))
            && set.sentinel_sees_healthy_replica())
        {
            assert!(
                Instant::now() < deadline,
                "the sentinel never saw the replica in sync"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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
        cli(port, args)
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
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let reply = self
                .cli(self.sentinel_port, &["SENTINEL", "FAILOVER", SERVICE])
                .unwrap_or_default();
            if reply == "OK" {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "SENTINEL FAILOVER kept failing: {reply}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        while !(self.master_by_sentinel() == Some(self.replica_port)
            && self
                .cli(self.replica_port, &["ROLE"])
                .is_some_and(|role| role.starts_with("master")))
        {
            assert!(
                Instant::now() < deadline,
                "the failover did not promote the replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
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

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Arguments of a data server on `port`, a replica of `master` when given. Files (the RDB a replica receives)
/// go to `dir`, under a name per port.
fn server_args(port: u16, master: Option<u16>, dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "no",
        "--dir",
        &dir.to_string_lossy(),
        "--dbfilename",
        &format!("dump-{port}.rdb"),
    ]
    .map(str::to_owned)
    .to_vec();
    if let Some(master) = master {
        args.extend(["--replicaof", "127.0.0.1", &master.to_string()].map(str::to_owned));
    }
    args
}

/// Starts `redis-server` with the arguments for a free port, retrying on a fresh port if it cannot bind, and
/// waits until it answers PING.
fn start_server(args_for: impl Fn(u16) -> Vec<String>) -> (u16, Child) {
    for _ in 0..START_ATTEMPTS {
        let port = free_port();
        let mut child = Command::new("redis-server")
            .args(args_for(port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (the README's test command installs it)");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if cli(port, &["PING"]).as_deref() == Some("PONG") {
                return (port, child);
            }
            if matches!(child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    panic!("could not start redis-server in {START_ATTEMPTS} attempts");
}

fn cli(port: u16, args: &[&str]) -> Option<String> {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}
