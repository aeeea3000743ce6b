//! Test helpers: a real `redis-server`, a real upstream and the gateway, each on a free loopback port.
#![allow(dead_code)]

pub mod binary;
pub mod clock;
pub mod cluster;
pub mod config_builder;
pub mod h2;
pub mod http_client;
pub mod in_flight;
pub mod jwt;
pub mod llm_upstream;
pub mod matrix;
pub mod pki;
pub mod raw_upstream;
pub mod redis;
pub mod rls;
pub mod sentinel;
pub mod tls_client;
pub mod upstream;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tollgate::config::{self, Config};
use tollgate::gateway::{self, Gateway};
use tollgate::limiter::{Backend, BackendKind, RateLimiter, StoreSettings};

use clock::TestClock;

/// A gateway served in this process on a free port.
pub struct TestGateway {
    pub addr: SocketAddr,
    pub gateway: Arc<Gateway>,
    /// The in-process store's clock, when that is the store (Redis keeps its own).
    pub clock: Option<Arc<TestClock>>,
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

/// Starts a gateway for `yaml` on 127.0.0.1 and a free port (the config's `listen` is ignored). In memory, its
/// store runs on a [`TestClock`], where no window of an hour, a day or a week ends during a test. When the store
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

/// The limiter `store` describes: in memory, on a [`TestClock`] (returned), so that every window a test uses
/// begins when it starts; on Redis, on Redis's clock (and its fallback on the system's, as Redis's reports are).
/// With Redis, waits until it is connected when `wait_for_redis`.
pub async fn test_limiter(
    store: &StoreSettings,
    wait_for_redis: bool,
) -> (Arc<RateLimiter>, Option<Arc<TestClock>>) {
    let clock = (store.backend == BackendKind::Memory).then(|| Arc::new(TestClock::new()));
    let limiter = match &clock {
        Some(clock) => RateLimiter::from_settings_on(store, clock.clone()),
        None => RateLimiter::from_settings(store),
    };
    let limiter = Arc::new(limiter.expect("store settings"));
    if let (true, Backend::Redis(redis)) = (wait_for_redis, limiter.backend()) {
        assert!(
            redis.wait_connected(Duration::from_secs(10)).await,
            "redis did not answer"
        );
    }
    (limiter, clock)
}

async fn start(config: Config, wait_for_redis: bool) -> TestGateway {
    let (limiter, clock) = test_limiter(&config.store, wait_for_redis).await;
    let mut gateway = start_with_limiter(config, limiter).await;
    gateway.clock = clock;
    gateway
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
        let listeners = gateway::Listeners {
            plain: Some(listener),
            tls: None,
        };
        let _ = gateway::serve(listeners, served, &settings, async {
            let _ = rx.await;
        })
        .await;
    });
    TestGateway {
        addr,
        gateway,
        clock: None,
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
