//! The pool against a raw HTTP/1.1 upstream on loopback that counts its connections.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::{ConnectionPool, PoolSettings, SendError};
use crate::proxy::headers::HopFields;
use crate::proxy::health::TargetHealth;
use crate::proxy::HealthSettings;

impl ConnectionPool {
    /// `send` with an hour for the answer's head.
    async fn send_in_time(
        &self,
        request: Request<Body>,
    ) -> Result<Response<Body>, super::send::Unanswered> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
        let hop = HopFields::default();
        self.send(request, &hop, deadline)
            .await
            .expect("answered in time")
    }
}

/// What the test upstream does after writing a response.
#[derive(Clone, Copy)]
enum Then {
    KeepOpen,
    Close,
}

/// A keep-alive HTTP/1.1 server on loopback answering each request head with a fixed reply, counting the
/// connections it accepted and the ones the client closed.
struct RawUpstream {
    address: Uri,
    accepted: Arc<AtomicUsize>,
    closed_by_client: Arc<AtomicUsize>,
}

impl RawUpstream {
    async fn start(reply: fn(&str) -> (&'static [u8], Then)) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = format!("http://{}", listener.local_addr().expect("address"))
            .parse()
            .expect("uri");
        let accepted = Arc::new(AtomicUsize::new(0));
        let closed_by_client = Arc::new(AtomicUsize::new(0));
        let (counted, closed) = (accepted.clone(), closed_by_client.clone());
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream, reply, closed.clone()));
            }
        });
        Self {
            address,
            accepted,
            closed_by_client,
        }
    }

    fn pool(&self, settings: PoolSettings) -> ConnectionPool {
        ConnectionPool::new(
            self.address.clone(),
            HttpConnector::new(),
            None,
            Duration::from_secs(1),
            settings,
            health(),
        )
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn closed_by_client(&self) -> usize {
        self.closed_by_client.load(Ordering::SeqCst)
    }
}

async fn serve(
    mut stream: TcpStream,
    reply: fn(&str) -> (&'static [u8], Then),
    closed_by_client: Arc<AtomicUsize>,
) {
    let mut pending = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let head_end = loop {
            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                break end + 4;
            }
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => {
                    closed_by_client.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                Ok(n) => pending.extend_from_slice(&buffer[..n]),
            }
        };
        let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
        pending.drain(..head_end);
        let (bytes, then) = reply(&head);
        if let Some(delay) = delay_of(&head) {
            tokio::time::sleep(delay).await;
        }
        if stream.write_all(bytes).await.is_err() {
            return;
        }
        if let Then::Close = then {
            return;
        }
    }
}

/// How long a request asks the upstream to wait before it answers: its `x-delay-ms`.
fn delay_of(head: &str) -> Option<Duration> {
    let line = head
        .lines()
        .find_map(|line| line.strip_prefix("x-delay-ms: "))?;
    Some(Duration::from_millis(line.trim().parse().ok()?))
}

const SETTINGS: PoolSettings = PoolSettings {
    max_idle: 16,
    idle_timeout: Duration::from_secs(60),
    read_timeout: Duration::from_secs(60),
    retry_elsewhere: false,
};

fn health() -> TargetHealth {
    let settings = HealthSettings {
        max_fails: 1,
        fail_timeout: Duration::from_secs(10),
    };
    TargetHealth::new(settings, "test", "http://upstream.test")
}

fn request(method: &str) -> Request<Body> {
    Request::builder()
        .method(method)
        .uri("/x")
        .header(http::header::HOST, "upstream.test")
        .body(Body::empty())
        .expect("request")
}

async fn read_all(response: Response<Body>) -> Bytes {
    response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes()
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

/// An upstream answering `ok` on keep-alive connections, and a pool to it.
async fn keep_alive_pool(max_idle: usize, idle_timeout: Duration) -> (RawUpstream, ConnectionPool) {
    let upstream = RawUpstream::start(|_| (OK, Then::KeepOpen)).await;
    let pool = upstream.pool(PoolSettings {
        max_idle,
        idle_timeout,
        ..SETTINGS
    });
    (upstream, pool)
}

#[tokio::test]
async fn sequential_requests_reuse_one_connection() {
    let upstream = RawUpstream::start(|_| (OK, Then::KeepOpen)).await;
    let pool = upstream.pool(SETTINGS);
    for _ in 0..5 {
        let response = pool.send_in_time(request("GET")).await.expect("response");
        assert_eq!(read_all(response).await, "ok");
    }
    assert_eq!(upstream.accepted(), 1);
    assert_eq!(pool.idle_count(), 1);
}

#[tokio::test]
async fn an_idle_connection_gives_its_buffers_back_after_a_second() {
    let upstream = RawUpstream::start(|_| (OK, Then::KeepOpen)).await;
    let pool = upstream.pool(SETTINGS);
    let response = pool.send_in_time(request("GET")).await.expect("response");
    assert_eq!(read_all(response).await, "ok");
    assert!(
        pool.idle_buffered() >= 8 * 1024,
        "kept while the pool may be busy"
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!((pool.idle_count(), pool.idle_buffered()), (1, 0));
    // The rested connection serves the next request.
    let response = pool.send_in_time(request("GET")).await.expect("response");
    assert_eq!(read_all(response).await, "ok");
    assert_eq!(upstream.accepted(), 1);
}

#[tokio::test]
async fn bodiless_responses_give_their_connection_back_unpolled() {
    let upstream = RawUpstream::start(|head| {
        if head.starts_with("HEAD") {
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n",
                Then::KeepOpen,
            )
        } else {
            (b"HTTP/1.1 204 No Content\r\n\r\n", Then::KeepOpen)
        }
    })
    .await;
    let pool = upstream.pool(SETTINGS);
    for method in ["HEAD", "GET", "HEAD"] {
        // Dropped without a poll, as the server does with a body that has ended before it starts.
        drop(pool.send_in_time(request(method)).await.expect("response"));
    }
    assert_eq!(upstream.accepted(), 1);
    assert_eq!(pool.idle_count(), 1);
}

#[tokio::test]
async fn a_body_dropped_half_read_takes_its_connection_with_it() {
    let upstream = RawUpstream::start(|_| {
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf",
            Then::KeepOpen,
        )
    })
    .await;
    let pool = upstream.pool(SETTINGS);
    let response = pool.send_in_time(request("GET")).await.expect("response");
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert_eq!(first.into_data().expect("data frame"), "half");
    drop(body);
    assert_eq!(pool.idle_count(), 0);
    let _next = pool.send_in_time(request("GET")).await.expect("response");
    assert_eq!(upstream.accepted(), 2);
}

#[tokio::test]
async fn a_connection_the_target_closed_while_idle_is_not_used() {
    // No `Connection: close`: the target just drops the connection after answering, as on its idle timeout.
    let upstream = RawUpstream::start(|_| (OK, Then::Close)).await;
    let pool = upstream.pool(SETTINGS);
    for _ in 0..3 {
        let response = pool.send_in_time(request("GET")).await.expect("response");
        assert_eq!(read_all(response).await, "ok");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(upstream.accepted(), 3);
}

#[tokio::test]
async fn idle_connections_are_closed_after_the_idle_timeout() {
    let (upstream, pool) = keep_alive_pool(16, Duration::from_millis(100)).await;
    read_all(pool.send_in_time(request("GET")).await.expect("response")).await;
    assert_eq!(pool.idle_count(), 1);
    // No further request comes to find it expired: the reaper closes it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(pool.idle_count(), 0);
    assert_eq!(upstream.closed_by_client(), 1);
}

#[tokio::test]
async fn at_most_max_idle_connections_are_kept() {
    let (upstream, pool) = keep_alive_pool(2, Duration::from_secs(60)).await;
    // Four responses held at once need four connections.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(pool.send_in_time(request("GET")).await.expect("response"));
    }
    assert_eq!(upstream.accepted(), 4);
    for response in held {
        read_all(response).await;
    }
    assert_eq!(pool.idle_count(), 2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(upstream.closed_by_client(), 2);
}

#[tokio::test]
async fn an_https_target_without_tls_settings_is_never_sent_plain_text() {
    let upstream = RawUpstream::start(|_| (OK, Then::KeepOpen)).await;
    let https: Uri = format!(
        "https://{}",
        upstream.address.authority().expect("authority")
    )
    .parse()
    .expect("uri");
    let mut connector = HttpConnector::new();
    connector.enforce_http(false);
    let pool = ConnectionPool::new(
        https,
        connector,
        None,
        Duration::from_secs(1),
        SETTINGS,
        health(),
    );
    let refused = pool.send_in_time(request("GET")).await.map(drop);
    assert!(
        matches!(&refused, Err(failed) if matches!(failed.error, SendError::Tls(_))),
        "{refused:?}"
    );
    // The TCP connection was made, then closed without a byte sent (the server saw no request head).
    for _ in 0..100 {
        if upstream.closed_by_client() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!((upstream.accepted(), upstream.closed_by_client()), (1, 1));
}

/// A GET that the upstream answers `delay` after reading it.
fn delayed(delay: Duration) -> Request<Body> {
    let mut request = request("GET");
    let millis = delay.as_millis().to_string();
    let value = http::HeaderValue::from_str(&millis).expect("value");
    request.headers_mut().insert("x-delay-ms", value);
    request
}

/// A connection's head timer is made by its first request and kept: each later request on it waits until its own
/// deadline, neither cut at an earlier request's (the timer still set to it) nor given longer.
#[tokio::test]
async fn each_request_on_a_reused_connection_waits_until_its_own_deadline() {
    let (upstream, pool) = keep_alive_pool(16, Duration::from_secs(60)).await;
    let timeout = Duration::from_millis(1500);
    let hop = HopFields::default();
    let first = pool.send(request("GET"), &hop, tokio::time::Instant::now() + timeout);
    read_all(first.await.expect("in time").expect("response")).await;
    // The first request's deadline is 1.5 s from its start; this one starts 0.9 s later and is answered 1 s after
    // that, past the first one's deadline and before its own.
    tokio::time::sleep(Duration::from_millis(900)).await;
    let delay = Duration::from_millis(1000);
    let second = pool.send(delayed(delay), &hop, tokio::time::Instant::now() + timeout);
    read_all(second.await.expect("in time").expect("response")).await;
    // On the same connection again, an answer 2.5 s away is past this request's deadline.
    let started = tokio::time::Instant::now();
    let third = pool.send(
        delayed(Duration::from_millis(2500)),
        &hop,
        started + timeout,
    );
    assert!(third.await.is_err(), "no answer within the timeout");
    let waited = started.elapsed();
    assert!(
        waited >= timeout && waited < Duration::from_millis(2400),
        "{waited:?}"
    );
    assert_eq!(upstream.accepted(), 1);
}
