//! The connection's clocks against slow and silent clients: request heads (HTTP/1.1 and h2c), idle keep-alive,
//! pipelined heads, h2c openings and header blocks left unfinished, stalled request bodies (408).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::h2::{h2_frame, GET_API_BLOCK, H2_PREFACE};
use crate::common::start_gateway;
use crate::common::upstream::Upstream;
use crate::yaml;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn slow_request_head_is_cut_off() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "")).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    stream
        .write_all(b"GET /api HTTP/1.1\r\nHost: a\r\n")
        .await
        .unwrap();
    // Never finish the head: the gateway must close the connection after header_read_timeout (500 ms).
    let started = Instant::now();
    let mut buffer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buffer)).await;
    assert!(read.is_ok(), "connection still open after 5 s");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn silent_connection_is_cut_off() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "")).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    // Send nothing at all: the connection must still close after header_read_timeout (500 ms).
    let started = Instant::now();
    let mut buffer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buffer)).await;
    assert!(read.is_ok(), "connection still open after 5 s");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(buffer.is_empty());
}

/// Reads one response with a `content-length` body from `stream`: its head and body as text.
async fn read_response(stream: &mut TcpStream) -> String {
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if let Some(end) = text.find("\r\n\r\n") {
            let length: usize = text[..end]
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse().ok())?
                })
                .unwrap_or(0);
            if bytes.len() >= end + 4 + length {
                return text;
            }
        }
        let read = stream.read(&mut chunk).await.expect("read a response");
        assert!(read > 0, "connection closed mid-response: {bytes:?}");
        bytes.extend_from_slice(&chunk[..read]);
    }
}

#[tokio::test]
async fn idle_keep_alive_connection_outlives_the_head_timeout_and_closes_after_keepalive_timeout() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "  keepalive_timeout: 2s\n")).await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    let request = b"GET /api/one HTTP/1.1\r\nHost: a\r\n\r\n";
    stream.write_all(request).await.unwrap();
    assert!(read_response(&mut stream).await.starts_with("HTTP/1.1 200"));

    // Idle for well over header_read_timeout (500 ms): the connection is still there for the next request.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    stream.write_all(request).await.unwrap();
    let second = read_response(&mut stream).await;
    assert!(second.starts_with("HTTP/1.1 200"), "{second:.80}");
    assert_eq!(upstream.hits(), 2);

    // Idle again: closed once keepalive_timeout (2 s) has passed, not before.
    let idle = Instant::now();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "idle connection still open after 10 s");
    assert!(
        idle.elapsed() >= Duration::from_millis(1_900),
        "closed after {:?}, before keepalive_timeout",
        idle.elapsed()
    );
    assert!(rest.is_empty());
}

#[tokio::test]
async fn head_begun_after_idle_time_has_header_read_timeout_from_its_first_byte() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "  keepalive_timeout: 30s\n")).await;
    // Idle for less than the second after which a connection rests with its socket alone, then for more.
    for (idle, hits) in [(800, 1), (1_500, 2)] {
        let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
        stream
            .write_all(b"GET /api/one HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        assert!(read_response(&mut stream).await.starts_with("HTTP/1.1 200"));
        tokio::time::sleep(Duration::from_millis(idle)).await;

        // Half a head, never finished: cut off after header_read_timeout (500 ms), not keepalive_timeout (30 s).
        stream
            .write_all(b"GET /api/two HTTP/1.1\r\n")
            .await
            .unwrap();
        let started = Instant::now();
        let mut rest = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
        assert!(
            read.is_ok(),
            "idle {idle} ms: half a head kept open for 10 s"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "idle {idle} ms: closed after {:?}",
            started.elapsed()
        );
        assert_eq!(upstream.hits(), hits);
    }
}

#[tokio::test]
async fn a_pipelined_head_begun_before_the_connection_rests_is_served_whole_after() {
    let upstream = Upstream::start().await;
    let server = "  keepalive_timeout: 30s\n";
    let gateway = start_gateway(
        &yaml(&upstream.url(), server)
            .replace("header_read_timeout: 500ms", "header_read_timeout: 5s"),
    )
    .await;
    let mut stream = TcpStream::connect(gateway.addr).await.unwrap();
    // The second head's first bytes come with the first request, and are read with it.
    stream
        .write_all(b"GET /api/one HTTP/1.1\r\nHost: a\r\n\r\nGET /api/two HT")
        .await
        .unwrap();
    let first = read_response(&mut stream).await;
    assert!(first.contains(r#""path":"/api/one""#), "{first}");
    // Past the second after which the connection rests: the bytes read and not parsed go to the next hyper
    // connection. The rest of the head, with a third request pipelined after it.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    stream
        .write_all(b"TP/1.1\r\nHost: a\r\n\r\nGET /api/three HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    // Both answers, however the reads split them.
    let mut answers = String::new();
    let mut chunk = [0u8; 4096];
    while !(answers.contains(r#""path":"/api/two""#) && answers.contains(r#""path":"/api/three""#))
    {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut chunk))
            .await
            .expect("both answers within 5 s")
            .expect("read");
        assert!(read > 0, "closed after {answers}");
        answers.push_str(&String::from_utf8_lossy(&chunk[..read]));
    }
    assert_eq!(answers.matches("HTTP/1.1 200 OK").count(), 2, "{answers}");
    assert_eq!(upstream.hits(), 3);
}

// === HTTP/2 (h2c) under the same clocks as HTTP/1.1 ===

const HEADERS: u8 = 0x1;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

/// Reads frames from `stream` (acknowledging the server's settings) until the response HEADERS of `stream_id`:
/// their `:status` is the first byte of the block (an indexed static entry: 0x88 is 200).
async fn h2_response_status(stream: &mut TcpStream, stream_id: u32) -> u8 {
    loop {
        let mut header = [0u8; 9];
        stream.read_exact(&mut header).await.expect("a frame");
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        stream.read_exact(&mut payload).await.expect("a payload");
        let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
        match header[3] {
            0x4 if header[4] & 0x1 == 0 => {
                stream
                    .write_all(&h2_frame(0x4, 0x1, 0, &[]))
                    .await
                    .expect("ack");
            }
            HEADERS if id == stream_id => return payload[0],
            _ => {}
        }
    }
}

/// Waits up to 5 s for the gateway to close `stream`, reading (and dropping) what it sends meanwhile.
async fn closed_within_5s(stream: &mut TcpStream) -> bool {
    let mut sink = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut sink))
        .await
        .is_ok()
}

#[tokio::test]
async fn h2c_connection_that_never_finishes_its_opening_is_cut_off_after_header_read_timeout() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "")).await;
    let settings = h2_frame(0x4, 0, 0, &[]);
    let mut preface_settings_half_headers = [H2_PREFACE, &settings].concat();
    // A HEADERS frame without END_HEADERS, and no CONTINUATION ever.
    preface_settings_half_headers.extend(h2_frame(HEADERS, END_STREAM, 1, &GET_API_BLOCK[..4]));
    let openings: [(&str, &[u8]); 4] = [
        ("one byte", b"P"),
        ("the preface alone", H2_PREFACE),
        ("preface and settings", &[H2_PREFACE, &settings].concat()),
        ("an unfinished header block", &preface_settings_half_headers),
    ];
    for (what, opening) in openings {
        let mut stream = TcpStream::connect(gateway.addr).await.expect("connect");
        stream.write_all(opening).await.expect("write");
        assert!(
            closed_within_5s(&mut stream).await,
            "{what}: still open after 5 s (header_read_timeout 500 ms)"
        );
    }
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn h2c_header_block_left_unfinished_after_requests_is_cut_off_but_a_quiet_connection_is_not()
{
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "")).await;
    let mut stream = TcpStream::connect(gateway.addr).await.expect("connect");
    let mut opening = [H2_PREFACE, &h2_frame(0x4, 0, 0, &[])].concat();
    opening.extend(h2_frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        GET_API_BLOCK,
    ));
    stream.write_all(&opening).await.expect("write");
    assert_eq!(h2_response_status(&mut stream, 1).await, 0x88, "200");

    // Quiet between requests for longer than header_read_timeout (500 ms): still served.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let second = h2_frame(HEADERS, END_STREAM | END_HEADERS, 3, GET_API_BLOCK);
    stream.write_all(&second).await.expect("write");
    assert_eq!(h2_response_status(&mut stream, 3).await, 0x88, "200");

    // Half a header block: the connection is closed after header_read_timeout.
    let half = h2_frame(HEADERS, END_STREAM, 5, &GET_API_BLOCK[..4]);
    stream.write_all(&half).await.expect("write");
    assert!(
        closed_within_5s(&mut stream).await,
        "an unfinished header block kept open for 5 s"
    );
    assert_eq!(upstream.hits(), 2);
}

/// Reads frames from `stream` until the gateway closes it, answering its PINGs if `pong`: whether a GOAWAY came
/// first.
async fn h2_goaway_then_close(stream: &mut TcpStream, pong: bool) -> bool {
    let mut goaway = false;
    loop {
        let mut header = [0u8; 9];
        if stream.read_exact(&mut header).await.is_err() {
            return goaway;
        }
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        if stream.read_exact(&mut payload).await.is_err() {
            return goaway;
        }
        goaway |= header[3] == 0x7;
        if pong && header[3] == 0x6 && header[4] & 0x1 == 0 {
            let _ = stream.write_all(&h2_frame(0x6, 0x1, 0, &payload)).await;
        }
    }
}

#[tokio::test]
async fn h2c_connection_idle_for_keepalive_timeout_is_sent_goaway_and_closed_but_not_while_a_request_is_in_flight(
) {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "  keepalive_timeout: 2s\n")).await;
    let mut stream = TcpStream::connect(gateway.addr).await.expect("connect");
    let mut opening = [H2_PREFACE, &h2_frame(0x4, 0, 0, &[])].concat();
    opening.extend(h2_frame(
        HEADERS,
        END_STREAM | END_HEADERS,
        1,
        GET_API_BLOCK,
    ));
    stream.write_all(&opening).await.expect("write");
    assert_eq!(h2_response_status(&mut stream, 1).await, 0x88, "200");

    // The upstream takes 3 s to answer /slow: longer than keepalive_timeout, and the connection waits for it.
    let slow: &[u8] = &[
        0x82, 0x86, 0x04, 0x09, b'/', b'a', b'p', b'i', b'/', b's', b'l', b'o', b'w', 0x01, 0x01,
        b'a',
    ];
    stream
        .write_all(&h2_frame(HEADERS, END_STREAM | END_HEADERS, 3, slow))
        .await
        .expect("write");
    assert_eq!(
        h2_response_status(&mut stream, 3).await,
        0x88,
        "200 after 3 s"
    );

    // Then idle: GOAWAY and the close after keepalive_timeout (2 s), not before.
    let idle = Instant::now();
    let goaway = tokio::time::timeout(
        Duration::from_secs(10),
        h2_goaway_then_close(&mut stream, true),
    )
    .await
    .expect("an idle connection closed within 10 s");
    assert!(goaway, "closed without GOAWAY");
    assert!(
        idle.elapsed() >= Duration::from_millis(1_800),
        "closed {:?} after its last answer, before keepalive_timeout",
        idle.elapsed()
    );
    assert_eq!(upstream.hits(), 2);

    // A client that never answers the GOAWAY's PING (which the graceful close waits for) is cut off too.
    let mut stream = TcpStream::connect(gateway.addr).await.expect("connect");
    stream.write_all(&opening).await.expect("write");
    let closed = tokio::time::timeout(
        Duration::from_secs(10),
        h2_goaway_then_close(&mut stream, false),
    )
    .await
    .expect("a client ignoring the close's PING still closed within 10 s");
    assert!(closed, "closed without GOAWAY");
}

// === server.body_read_timeout: a stalled body is 408 and its upstream request is cancelled ===

/// An upstream on raw TCP that reads request heads and never answers: it counts the requests whose head came and
/// the connections still open (each closed by the gateway once it gives its request up).
struct HangingUpstream {
    addr: std::net::SocketAddr,
    heads: Arc<std::sync::atomic::AtomicUsize>,
    open: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl HangingUpstream {
    async fn start() -> Self {
        use std::sync::atomic::Ordering;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let heads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let open = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (seen, still_open) = (heads.clone(), open.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (seen, still_open) = (seen.clone(), still_open.clone());
                still_open.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut read = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let mut head_seen = false;
                    // Until the gateway closes the connection: a clean end or a reset.
                    while let Ok(count @ 1..) = stream.read(&mut chunk).await {
                        read.extend_from_slice(&chunk[..count]);
                        if !head_seen && read.windows(4).any(|w| w == b"\r\n\r\n") {
                            head_seen = true;
                            seen.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    still_open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Self {
            addr,
            heads,
            open,
            task,
        }
    }

    fn heads(&self) -> usize {
        self.heads.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn open(&self) -> usize {
        self.open.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for HangingUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A request body that sends its first piece and then nothing, never ending.
struct StalledBody {
    sent: bool,
}

impl http_body::Body for StalledBody {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        if self.sent {
            return std::task::Poll::Pending;
        }
        self.sent = true;
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
            b"first piece",
        )))))
    }
}

fn stalling_yaml(upstream: std::net::SocketAddr) -> String {
    format!(
        r#"server:
  body_read_timeout: 500ms
upstreams:
  backend:
    targets: ["http://{upstream}"]
    timeout: 60s
routes:
  - name: up
    match: {{ path_prefix: /up }}
    upstream: backend
"#
    )
}

#[tokio::test]
async fn a_stalled_request_body_is_408_and_its_upstream_request_is_cancelled_over_http1() {
    let upstream = HangingUpstream::start().await;
    let gateway = start_gateway(&stalling_yaml(upstream.addr)).await;
    let request = b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nfirst piece";
    let mut stream = TcpStream::connect(gateway.addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let response = tokio::time::timeout(Duration::from_secs(5), read_response(&mut stream))
        .await
        .expect("an answer within 5 s (body_read_timeout 500 ms)");
    assert!(response.starts_with("HTTP/1.1 408"), "{response}");
    let body: serde_json::Value =
        serde_json::from_str(response.split_once("\r\n\r\n").expect("a body").1).expect("JSON");
    assert_eq!(body["error"], "body_timeout", "{response}");
    assert_eq!(
        upstream.heads(),
        1,
        "the request went upstream before its body stalled"
    );
    let cancelled = common::eventually(Duration::from_secs(5), async || upstream.open() == 0).await;
    assert!(cancelled.is_some(), "the upstream request is still open");
}

#[tokio::test]
async fn stalled_request_bodies_on_one_h2c_connection_are_408_and_their_upstream_requests_are_cancelled(
) {
    use http_body_util::BodyExt;
    const STREAMS: usize = 50;
    let upstream = HangingUpstream::start().await;
    let gateway = start_gateway(&stalling_yaml(upstream.addr)).await;
    let stream = TcpStream::connect(gateway.addr).await.expect("connect");
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2c handshake");
    tokio::spawn(connection);
    let url = gateway.url("/up");
    let requests = (0..STREAMS).map(|_| {
        let (mut sender, url) = (sender.clone(), url.clone());
        async move {
            let request = http::Request::post(url)
                .body(StalledBody { sent: false })
                .expect("request");
            let response = sender.send_request(request).await.expect("an answer");
            let status = response.status();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("a body")
                .to_bytes();
            (
                status,
                serde_json::from_slice::<serde_json::Value>(&body).expect("JSON"),
            )
        }
    });
    let answers = tokio::time::timeout(
        Duration::from_secs(10),
        futures_util::future::join_all(requests),
    )
    .await
    .expect("every stream answered within 10 s (body_read_timeout 500 ms)");
    for (status, body) in answers {
        assert_eq!(status, 408, "{body}");
        assert_eq!(body["error"], "body_timeout");
    }
    assert_eq!(upstream.heads(), STREAMS, "each request went upstream");
    let cancelled = common::eventually(Duration::from_secs(5), async || upstream.open() == 0).await;
    assert!(
        cancelled.is_some(),
        "{} upstream requests still open",
        upstream.open()
    );
}
