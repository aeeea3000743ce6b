//! Measures the Redis memory each algorithm's key takes (`MEMORY USAGE key SAMPLES 0`) on a real `redis-server`.
//!
//! Run with: `cargo run --example redis_memory`
//!
//! Starts its own `redis-server` on a free loopback port (persistence off), writes each algorithm's state through
//! the limiter script with explicit timestamps, prints a markdown table and stops the server. Needs
//! `redis-server` and `redis-cli` on the PATH (Debian: `apt-get install redis-server redis-tools`).

use std::error::Error;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tollgate::limiter::store::{LimitCheck, RedisStore};
use tollgate::limiter::{Algorithm, LeakyMode, Limit, Rate};

/// 2026-01-01T00:00:01Z.
const T0: i64 = 1_767_225_601_000;
/// A realistic key: `<prefix><route>:<limit>:{<client ip>}`, 33 bytes.
const KEY: &str = "tollgate:api:per-ip:{203.0.113.7}";

/// A `redis-server` child process, killed when dropped.
struct Server {
    port: u16,
    child: Child,
}

impl Server {
    fn start() -> Result<Self, Box<dyn Error>> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("redis-server: {e}"))?;
        let server = Self { port, child };
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.cli(&["PING"])? != "PONG" {
            if Instant::now() > deadline {
                return Err("redis-server did not answer PING".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    fn cli(&self, args: &[&str]) -> Result<String, Box<dyn Error>> {
        let output = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .map_err(|e| format!("redis-cli: {e}"))?;
        Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let server = Server::start()?;
    let store = RedisStore::connect(
        &format!("redis://127.0.0.1:{}", server.port),
        1,
        Duration::from_secs(1),
    )?;
    if !store.wait_connected(Duration::from_secs(5)).await {
        return Err("could not connect to redis-server".into());
    }
    let info = server.cli(&["INFO", "server"])?;
    let version = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap_or("?");
    println!("redis {version}, key `{KEY}` ({} bytes)\n", KEY.len());
    println!("| algorithm | state | Redis type (encoding) | MEMORY USAGE (bytes) |");
    println!("|---|---|---|---|");

    let rate = Rate::new(10, 1_000)?;
    let cases: Vec<(Algorithm, u64, String)> = vec![
        (
            Algorithm::FixedWindow {
                limit: 100,
                period_ms: 60_000,
            },
            1,
            "after 1 request".into(),
        ),
        (
            Algorithm::SlidingWindow {
                limit: 100,
                period_ms: 60_000,
            },
            1,
            "after 1 request".into(),
        ),
        (
            Algorithm::TokenBucket { rate, burst: 100 },
            1,
            "after 1 request".into(),
        ),
        (
            Algorithm::Gcra { rate, burst: 100 },
            1,
            "after 1 request".into(),
        ),
        (
            Algorithm::LeakyBucket {
                rate,
                burst: 100,
                mode: LeakyMode::Reject,
            },
            1,
            "after 1 request".into(),
        ),
    ]
    .into_iter()
    .chain([1u64, 100, 128, 129, 1_000, 10_000].map(|n| {
        (
            Algorithm::SlidingLog {
                limit: 10_000,
                period_ms: 3_600_000,
            },
            n,
            format!("{n} {}", if n == 1 { "entry" } else { "entries" }),
        )
    }))
    .collect();

    for (algorithm, requests, state) in cases {
        server.cli(&["DEL", KEY])?;
        let limit = Limit::new(algorithm.name(), algorithm, 1)?;
        let checks = [LimitCheck {
            key: KEY,
            limit: &limit,
        }];
        // One request per millisecond, as distinct clients' requests would arrive.
        for i in 0..requests as i64 {
            let outcome = store.check(&checks, Some(T0 + i)).await?;
            if !outcome.allowed {
                return Err(format!("{}: request {i} denied", algorithm.name()).into());
            }
        }
        let kind = server.cli(&["TYPE", KEY])?;
        let encoding = server.cli(&["OBJECT", "ENCODING", KEY])?;
        let bytes = server.cli(&["MEMORY", "USAGE", KEY, "SAMPLES", "0"])?;
        println!(
            "| `{}` | {state} | {kind} ({encoding}) | {bytes} |",
            algorithm.name()
        );
    }
    Ok(())
}
