//! Test helpers: a real `redis-server`, a real upstream and the gateway, each on a free loopback port.
#![allow(dead_code)]

pub mod cluster;
pub mod http_client;
pub mod pki;
pub mod raw_upstream;
pub mod redis;
pub mod sentinel;
pub mod upstream;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate::config::{self, Config};
use tollgate::gateway::{self, Gateway};
use tollgate::limiter::Backend;

/// A gateway served in this process on a free port.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub gateway: Arc<Gateway>,
    shutdown: Option<oneshot::Sender<()>>,
}

/// Parses `yaml` as a config file called `test.yaml`, panicking with the located errors if it is invalid.
pub fn config(yaml: &str) -> Config {
    match config::parse(yaml, Path::new("test.yaml")) {
        Ok(config) => config,
        Err(error) => panic!("invalid test config:\n{error}\n---\n{yaml}"),
    }
}

/// Starts a gateway for `yaml` on 127.0.0.1 and a free port (the config's `listen` is ignored). When the store
/// is Redis, waits until it is connected, so that no test request is decided by the fallback by accident.
pub async fn start_gateway(yaml: &str) -> TestGateway {
    start(config(yaml), true).await
}

/// Starts a gateway for an already loaded config (see [`start_gateway`]).
pub async fn start_gateway_with(config: Config) -> TestGateway {
    start(config, true).await
}

/// Like [`start_gateway`], but does not wait for Redis: for stores meant to fail (wrong credentials...).
pub async fn start_gateway_without_waiting(yaml: &str) -> TestGateway {
    start(config(yaml), false).await
}

async fn start(config: Config, wait_for_redis: bool) -> TestGateway {
    let limiter = Arc::new(
        tollgate::limiter::RateLimiter::from_settings(&config.store).expect("store settings"),
    );
    if let (true, Backend::Redis(redis)) = (wait_for_redis, limiter.backend()) {
        assert!(
            redis.wait_connected(Duration::from_secs(10)).await,
            "redis did not answer"
        );
    }
    start_with_limiter(config, limiter).await
}

/// Starts a gateway for `config` deciding with `limiter` (e.g. one on a manual clock), on a free port.
pub async fn start_with_limiter(
    config: Config,
    limiter: Arc<tollgate::limiter::RateLimiter>,
) -> TestGateway {
    let gateway = Arc::new(Gateway::new(&config, limiter));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (tx, rx) = oneshot::channel();
    let served = gateway.clone();
    let settings = config.server.clone();
    tokio::spawn(async move {
        let _ = gateway::serve(listener, served, &settings, async {
            let _ = rx.await;
        })
        .await;
    });
    TestGateway {
        addr,
        gateway,
        shutdown: Some(tx),
    }
}

impl TestGateway {
    /// `http://127.0.0.1:PORT` + `path`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }
}

impl Drop for TestGateway {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A free TCP port on 127.0.0.1 (bound, then released; for servers that must be told their port).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Serves the admin router of `gateway` (with `token`, if any) on a free port; returns its base URL.
pub async fn serve_admin(gateway: &TestGateway, token: Option<&str>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
    let addr = listener.local_addr().expect("admin addr");
    let router = tollgate::admin::router(Arc::clone(&gateway.gateway), token.map(str::to_owned));
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    format!("http://{addr}")
}

/// A `tollgate` process, killed if still running when dropped.
pub struct Process(pub std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Polls `condition` every 20 ms until it holds or `within` passes; returns how long it took. The one way tests
/// wait for something to happen: bounded, and as quick as the thing itself.
pub async fn eventually(
    within: Duration,
    mut condition: impl AsyncFnMut() -> bool,
) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if condition().await {
            return Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Waits until something accepts connections on 127.0.0.1:`port`, at most 20 s.
pub fn wait_until_listening(port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing listening on {port} after 20 s"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}
