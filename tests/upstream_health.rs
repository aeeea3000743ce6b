//! The back door: passive health (`health: { max_fails, fail_timeout }`), retries on another target
//! (`retry: { attempts }`) and `idle_timeout`, through the running gateway to real upstreams on loopback: a closed
//! port, a target that closes under every request, a target that stalls, and one that comes back.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::config_builder::ConfigBuilder;
use common::http_client::{client, metrics_text};
use common::raw_upstream::{Answer, RawUpstream};
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::{count, eventually, serve_admin, start_gateway, ReservedPort, TestGateway};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

const TOKEN: &str = "health-token";
const SOON: Duration = Duration::from_secs(5);

/// A config with one upstream `app` of `targets` and `settings` (flow mapping entries, may be empty), and one route
/// `api` for everything, with `limits` (list items as written, may be empty), on `redis` or in memory.
fn yaml(targets: &[String], settings: &str, limits: &str, redis: Option<&RedisServer>) -> String {
    let list: Vec<String> = targets.iter().map(|t| format!("\"{t}\"")).collect();
    let mut upstream = format!("targets: [{}]", list.join(", "));
    if !settings.is_empty() {
        upstream = format!("{upstream}, {settings}");
    }
    let builder = ConfigBuilder::new()
        .store(redis)
        .route("api", "/")
        .to("app")
        .limits_yaml(limits);
    let yaml = builder.build();
    // The builder's upstreams have one target: this one has several.
    yaml.replacen(
        "routes:\n",
        &format!("upstreams:\n  app: {{ {upstream} }}\nroutes:\n"),
        1,
    )
}

fn closed(port: &ReservedPort) -> String {
    format!("http://{}", port.addr())
}

async fn get(gateway: &TestGateway, path: &str) -> u16 {
    client()
        .get(gateway.url(path))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

async fn statuses(gateway: &TestGateway, method: &str, n: usize) -> Vec<u16> {
    let mut seen = Vec::new();
    for _ in 0..n {
        let method = http::Method::from_bytes(method.as_bytes()).expect("method");
        let status = client()
            .request(method, gateway.url("/x"))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        seen.push(status);
    }
    seen
}

/// `GET /upstreams` with the admin token: the targets of upstream `app`.
async fn targets(admin: &str) -> Vec<Value> {
    let text = client()
        .get(format!("{admin}/upstreams"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("upstreams")
        .text()
        .await
        .expect("text");
    let answer: Value = serde_json::from_str(&text).expect("json");
    let app = answer["upstreams"]
        .as_array()
        .expect("upstreams list")
        .iter()
        .find(|u| u["name"] == "app")
        .expect("upstream app")
        .clone();
    app["targets"].as_array().expect("targets").clone()
}

fn state_of<'a>(targets: &'a [Value], target: &str) -> &'a Value {
    targets
        .iter()
        .find(|t| t["target"] == target)
        .unwrap_or_else(|| panic!("{target} in {targets:?}"))
}

/// `tollgate_upstream_target_up{upstream="app",target=...}` as the admin listener shows it.
async fn gauge(admin: &str, target: &str) -> Option<f64> {
    let text = metrics_text(admin).await;
    let line = text.lines().find(|line| {
        line.starts_with("tollgate_upstream_target_up{")
            && line.contains("upstream=\"app\"")
            && line.contains(&format!("target=\"{target}\""))
    })?;
    line.rsplit(' ').next()?.parse().ok()
}

/// The defaults, nginx's: a closed port among two targets fails once, that request is sent on to the live target,
/// and the closed port is skipped from then on: 100 GETs, 100 answers 200. `/upstreams` and the gauge say so.
#[tokio::test]
async fn a_dead_target_is_skipped_after_its_first_failure_and_that_request_retried() {
    tollgate::telemetry::prometheus();
    let live = Upstream::start().await;
    let dead = ReservedPort::new();
    let gateway = start_gateway(&yaml(&[closed(&dead), live.url()], "", "", None)).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let seen = statuses(&gateway, "GET", 100).await;
    assert_eq!(count(&seen, 200), 100, "{seen:?}");
    assert_eq!(live.hits(), 100);

    let unauthorized = client()
        .get(format!("{admin}/upstreams"))
        .send()
        .await
        .expect("upstreams");
    assert_eq!(unauthorized.status(), 401);
    let now = targets(&admin).await;
    let down = state_of(&now, &closed(&dead));
    assert_eq!(down["state"], "down", "{now:?}");
    assert_eq!(down["up"], false);
    assert_eq!(down["fails"], 1);
    assert_eq!(down["last_failure"]["reason"], "connect");
    let left = down["down_for_ms"].as_u64().expect("down_for_ms");
    assert!(left > 0 && left <= 10_000, "{left}");
    assert!(down["down_until_unix_ms"].as_u64().is_some());
    let up = state_of(&now, &live.url());
    assert_eq!(up["state"], "up");
    assert_eq!(up["fails"], 0);
    assert_eq!(gauge(&admin, &closed(&dead)).await, Some(0.0));
    assert_eq!(gauge(&admin, &live.url()).await, Some(1.0));

    // A reload that drops the dead target drops its series: a 0 left behind would keep its alert firing.
    gateway
        .gateway
        .reload(&common::config(&yaml(&[live.url()], "", "", None)));
    assert_eq!(gauge(&admin, &closed(&dead)).await, None);
    assert_eq!(gauge(&admin, &live.url()).await, Some(1.0));
    let text = metrics_text(&admin).await;
    assert_eq!(
        text.matches("# TYPE tollgate_upstream_target_up gauge")
            .count(),
        1,
        "{text}"
    );
}

/// Without retries (`attempts: 1`), the request that met the closed port is 502, and health alone keeps every
/// later one from it.
#[tokio::test]
async fn without_retries_only_the_first_failure_is_seen() {
    let live = Upstream::start().await;
    let dead = ReservedPort::new();
    let settings = "retry: { attempts: 1 }";
    let gateway = start_gateway(&yaml(&[closed(&dead), live.url()], settings, "", None)).await;
    let seen = statuses(&gateway, "GET", 100).await;
    assert_eq!(count(&seen, 502), 1, "{seen:?}");
    assert_eq!(count(&seen, 200), 99, "{seen:?}");
}

/// A request that could not be sent goes to another target whatever its method, its body untouched.
#[tokio::test]
async fn a_post_with_a_body_goes_to_another_target_when_no_connection_was_made() {
    let live = Upstream::start().await;
    let dead = ReservedPort::new();
    // No health accounting: every other request meets the closed port.
    let settings = "health: { max_fails: 0 }";
    let gateway = start_gateway(&yaml(&[closed(&dead), live.url()], settings, "", None)).await;
    for i in 0..4 {
        let body = format!("payload {i}");
        let answer = client()
            .post(gateway.url("/x"))
            .body(body.clone())
            .send()
            .await
            .expect("answer");
        assert_eq!(answer.status(), 200);
        let echoed: Value =
            serde_json::from_str(&answer.text().await.expect("echo")).expect("json");
        assert_eq!(echoed["body"], body.as_str());
    }
    assert_eq!(live.hits(), 4);
}

/// Every target down: the gateway still tries them (a target that closes under each request sees each one), and
/// answers 502.
#[tokio::test]
async fn with_every_target_down_requests_are_still_tried() {
    let first = RawUpstream::start(|_, _| Answer::Drop).await;
    let second = RawUpstream::start(|_, _| Answer::Drop).await;
    let gateway = start_gateway(&yaml(&[first.url(), second.url()], "", "", None)).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    assert_eq!(get(&gateway, "/x").await, 502);
    let both = first.received("GET") + second.received("GET");
    assert_eq!(both, 2, "tried on each target once");
    let now = targets(&admin).await;
    assert!(now.iter().all(|t| t["state"] == "down"), "{now:?}");
    for _ in 0..3 {
        assert_eq!(get(&gateway, "/x").await, 502);
    }
    let later = first.received("GET") + second.received("GET");
    assert_eq!(later, 2 + 3 * 2, "every down target is tried anyway");
}

/// A WebSocket handshake that finds no connection counts against its target, as any request does (and is not
/// sent again).
#[tokio::test]
async fn a_websocket_handshake_to_a_dead_target_counts_against_it() {
    let live = Upstream::start().await;
    let dead = ReservedPort::new();
    let gateway = start_gateway(&yaml(&[closed(&dead), live.url()], "", "", None)).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let handshake = client()
        .get(gateway.url("/ws"))
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .send()
        .await
        .expect("answer");
    assert_eq!(handshake.status(), 502);
    let now = targets(&admin).await;
    let down = state_of(&now, &closed(&dead));
    assert_eq!(down["state"], "down", "{now:?}");
    assert_eq!(down["last_failure"]["reason"], "connect");
    assert_eq!(get(&gateway, "/x").await, 200);
}

/// A target that closes the connection before any byte of an answer: a GET goes on to the other target, a POST
/// (which the target may have acted on) does not.
#[tokio::test]
async fn a_reset_before_the_answer_retries_a_get_but_not_a_post() {
    let resets = RawUpstream::start(|_, _| Answer::Drop).await;
    let live = Upstream::start().await;
    // No health accounting: every other request meets the resetting target.
    let settings = "health: { max_fails: 0 }";
    let gateway = start_gateway(&yaml(&[resets.url(), live.url()], settings, "", None)).await;
    let gets = statuses(&gateway, "GET", 6).await;
    assert_eq!(count(&gets, 200), 6, "{gets:?}");
    assert_eq!(resets.received("GET"), 3);
    let deletes = statuses(&gateway, "DELETE", 2).await;
    assert_eq!(count(&deletes, 200), 2, "{deletes:?}");
    let posts = statuses(&gateway, "POST", 6).await;
    assert_eq!(count(&posts, 502), 3, "{posts:?}");
    assert_eq!(count(&posts, 200), 3, "{posts:?}");
    assert_eq!(resets.received("POST"), 3);
}

/// A target that stalls: before the head, 504 after `idle_timeout` (not the 30 s `timeout`); after the head, the
/// body is cut after `idle_timeout` of silence, and the concurrency slot the request held is free again.
async fn stalled_answers_end_and_release_their_slot(redis: Option<&RedisServer>) {
    let stalls = StallingUpstream::start().await;
    let limits = "      - { name: one, key: ip, algorithm: concurrency, max: 1 }\n";
    let settings = "idle_timeout: 300ms";
    let gateway = start_gateway(&yaml(&[stalls.url()], settings, limits, redis)).await;

    let started = std::time::Instant::now();
    assert_eq!(get(&gateway, "/stall-head").await, 504);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    let response = client()
        .get(gateway.url("/stall"))
        .send()
        .await
        .expect("head");
    assert_eq!(response.status(), 200);
    let body = tokio::time::timeout(SOON, response.bytes()).await;
    assert!(
        matches!(body, Ok(Err(_))),
        "the stalled body is cut: {body:?}"
    );
    // The slot was the stalled request's: the next one fits.
    let next = eventually(SOON, async || get(&gateway, "/ok").await == 200).await;
    assert!(next.is_some(), "the cut answer released its slot");
}

crate::each_store!(
    idle_timeout_cuts_a_stalled_answer,
    stalled_answers_end_and_release_their_slot
);

/// A dead target comes back: once its `fail_timeout` has passed it is tried again, and answering brings it up.
#[tokio::test]
async fn a_dead_target_is_tried_again_after_fail_timeout() {
    tollgate::telemetry::prometheus();
    let live = Upstream::start().await;
    let port = ReservedPort::new();
    let settings = "health: { max_fails: 1, fail_timeout: 1s }";
    let gateway = start_gateway(&yaml(&[closed(&port), live.url()], settings, "", None)).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let seen = statuses(&gateway, "GET", 4).await;
    assert_eq!(count(&seen, 200), 4, "{seen:?}");
    assert_eq!(
        state_of(&targets(&admin).await, &closed(&port))["state"],
        "down"
    );
    assert_eq!(gauge(&admin, &closed(&port)).await, Some(0.0));

    let revived = OkServer::on(port.addr());
    let retrying = eventually(SOON, async || {
        state_of(&targets(&admin).await, &closed(&port))["state"] == "retrying"
    })
    .await;
    assert!(retrying.is_some(), "its fail_timeout passes");
    assert_eq!(gauge(&admin, &closed(&port)).await, Some(1.0));
    let seen = statuses(&gateway, "GET", 4).await;
    assert_eq!(count(&seen, 200), 4, "{seen:?}");
    assert!(revived.hits() >= 1, "the target is tried again");
    let now = targets(&admin).await;
    let back = state_of(&now, &closed(&port));
    assert_eq!(back["state"], "up", "{now:?}");
    assert_eq!(back["fails"], 0);
}

/// However many targets a request is tried on, it is admitted once: the limit counts requests, not tries.
async fn retries_are_admitted_once(redis: Option<&RedisServer>) {
    let resets = RawUpstream::start(|_, _| Answer::Drop).await;
    let live = Upstream::start().await;
    let settings = "health: { max_fails: 0 }";
    let limits =
        "      - { name: per-ip, key: ip, algorithm: fixed_window, limit: 4, period: 1h }\n";
    let gateway = start_gateway(&yaml(&[resets.url(), live.url()], settings, limits, redis)).await;
    let mut remaining = Vec::new();
    for _ in 0..4 {
        let answer = client()
            .get(gateway.url("/x"))
            .send()
            .await
            .expect("answer");
        assert_eq!(answer.status(), 200);
        remaining.push(
            answer.headers()["x-ratelimit-remaining"]
                .to_str()
                .map(str::to_owned),
        );
    }
    assert_eq!(
        resets.received("GET"),
        2,
        "half the requests were tried twice"
    );
    let remaining: Vec<String> = remaining.into_iter().map(|r| r.expect("ascii")).collect();
    assert_eq!(remaining, ["3", "2", "1", "0"]);
    assert_eq!(get(&gateway, "/x").await, 429);
}

crate::each_store!(
    retries_do_not_charge_limits_twice,
    retries_are_admitted_once
);

/// An upstream on raw TCP: `/stall-head` never answers, `/stall` sends a head and 5 of 100 body bytes and then
/// nothing, anything else `200 ok`.
struct StallingUpstream {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl StallingUpstream {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(stall(stream));
            }
        });
        Self { addr, task }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for StallingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn stall(mut stream: TcpStream) {
    loop {
        let Some(head) = read_head(&mut stream).await else {
            return;
        };
        let path = head.split(' ').nth(1).unwrap_or_default().to_owned();
        let reply: &[u8] = match path.as_str() {
            "/stall-head" => b"",
            "/stall" => b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nhello",
            _ => b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok",
        };
        if stream.write_all(reply).await.is_err() {
            return;
        }
        if path.starts_with("/stall") {
            // Holds the connection open, silent, until the gateway closes it.
            let mut rest = [0u8; 1024];
            while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
            return;
        }
    }
}

/// A request head (bodiless requests only), or `None` once the connection closed.
async fn read_head(stream: &mut TcpStream) -> Option<String> {
    let mut pending = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(String::from_utf8_lossy(&pending[..end]).into_owned());
        }
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => pending.extend_from_slice(&buffer[..n]),
        }
    }
}

/// A server answering `200 ok` on an address a [`ReservedPort`] holds (it binds with SO_REUSEADDR), counting
/// requests.
struct OkServer {
    hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl OkServer {
    fn on(addr: SocketAddr) -> Self {
        let socket = TcpSocket::new_v4().expect("socket");
        socket.set_reuseaddr(true).expect("SO_REUSEADDR");
        socket.bind(addr).expect("bind the reserved port");
        let listener = socket.listen(64).expect("listen");
        let hits = Arc::new(AtomicUsize::new(0));
        let counted = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counted = counted.clone();
                tokio::spawn(async move {
                    while read_head(&mut stream).await.is_some() {
                        counted.fetch_add(1, Ordering::SeqCst);
                        let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if stream.write_all(reply).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self { hits, task }
    }

    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for OkServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}
