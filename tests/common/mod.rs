//! Test helpers: a real `redis-server`, a real upstream and the gateway, each on a free loopback port.
#![allow(dead_code)]

pub mod binary;
pub mod cluster;
pub mod h2;
pub mod http_client;
pub mod in_flight;
pub mod jwt;
pub mod llm_upstream;
pub mod pki;
pub mod raw_upstream;
pub mod redis;
pub mod rls;
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

/// How many of `statuses` are `status`.
pub fn count(statuses: &[u16], status: u16) -> usize {
    statuses.iter().filter(|&&s| s == status).count()
}

/// Parses `yaml` as a config file called `test.yaml`, panicking with the located errors if it is invalid.
pub fn config(yaml: &str) -> Config {
    match config::parse(yaml, Path::new("test.yaml")) {
        Ok(config) => config,
        Err(error) => panic!("invalid test config:\n{error}\n---\n{yaml}"),
    }
}

/// Starts a gateway for `yaml` on 127.0.0.1 and a free port (the config's `listen` is ignored), not in an hour's last
/// minute (see [`away_from_the_hour_boundary`]). When the store is Redis, waits until it is connected, so that no
/// test request is decided by the fallback by accident.
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

/// Waits, when the hour is in its last minute, until it has turned. Tests count in fixed windows of an hour or a day
/// on the real clock (Redis's is this machine's), which begin on the hour: a test begun in the hour's last minute
/// could see its window end midway and its counts split in two.
pub async fn away_from_the_hour_boundary() {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    let into_the_hour = now.as_secs() % 3_600;
    if into_the_hour >= 3_540 {
        tokio::time::sleep(Duration::from_secs(3_600 - into_the_hour + 1)).await;
    }
}

async fn start(config: Config, wait_for_redis: bool) -> TestGateway {
    away_from_the_hour_boundary().await;
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

/// The `store:` entries (indented by two spaces) of a test config on `redis`, or on the in-process store: on Redis,
/// a generous time budget and `on_error: deny`, so that a request Redis did not decide shows as a 503.
pub fn store_yaml(redis: Option<&redis::RedisServer>) -> String {
    match redis {
        Some(redis) => format!(
            "  backend: redis\n  url: {}\n  timeout: 500ms\n  on_error: deny\n",
            redis.url()
        ),
        None => "  backend: memory\n".to_owned(),
    }
}

/// Gateways running `yaml` that share one store: two when it is on `redis` (a limit must hold across instances),
/// one in memory.
pub async fn gateways_sharing(yaml: &str, redis: Option<&redis::RedisServer>) -> Vec<TestGateway> {
    let mut gateways = vec![start_gateway(yaml).await];
    if redis.is_some() {
        gateways.push(start_gateway(yaml).await);
    }
    gateways
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

/// A loopback port held by a bound socket that does not listen, for as long as this lives: connections to it are
/// refused, no other socket can bind it (nor will a bind to port 0 or an outgoing connection pick it), but a server
/// that binds with SO_REUSEADDR (redis-server does) can bind and listen on it while it is held. This is how a
/// server that must be told its port (redis-server takes no socket) gets one that nothing else takes meanwhile;
/// unlike binding port 0 and releasing it, there is never a moment when the port is free for a parallel test.
pub struct ReservedPort {
    socket: tokio::net::TcpSocket,
    pub port: u16,
}

impl ReservedPort {
    /// Reserves a port on 127.0.0.1 chosen by the system.
    pub fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket
            .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .expect("bind a reserved port");
        let port = socket.local_addr().expect("reserved address").port();
        Self { socket, port }
    }

    /// `127.0.0.1:PORT`, where connections are refused until a server listens there.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }
}

/// Serves the admin router of `gateway` (with `token`, if any) on a free port; returns its base URL.
pub async fn serve_admin(gateway: &TestGateway, token: Option<&str>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
    let addr = listener.local_addr().expect("admin addr");
    let router = tollgate::admin::router(Arc::clone(&gateway.gateway), token.map(str::to_owned));
    tokio::spawn(async move {
        let service = router.into_make_service_with_connect_info::<SocketAddr>();
        let _ = axum::serve(listener, service).await;
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

/// [`eventually`] for code that cannot await (the Redis helpers, run from synchronous tests too): polls
/// `condition` every 20 ms, blocking the thread, until it holds or `within` passes; returns how long it took.
pub fn eventually_blocking(
    within: Duration,
    mut condition: impl FnMut() -> bool,
) -> Option<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if condition() {
            return Some(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
