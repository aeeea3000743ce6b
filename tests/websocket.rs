//! WebSocket upgrades end to end: a real WebSocket client, the gateway, and a real WebSocket upstream (axum's).

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message as UpstreamMessage, WebSocket, WebSocketUpgrade};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::routing::{any, get};
use axum::{Json, Router};
use common::binary::Tollgate;
use common::config_builder::ConfigBuilder;
use common::pki::{Issued, TestCa};
use common::upstream::serve_tls;
use common::{eventually, serve_admin, start_gateway};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

/// A WebSocket upstream on a free loopback port:
/// - `/api/ws` sends the handshake's request fields as a JSON text message, then echoes every message;
/// - `/api/bye` closes at once with code 4000;
/// - any other path answers plain HTTP with the request fields as JSON (an upstream that declines upgrades).
struct WebSocketUpstream {
    addr: SocketAddr,
    handshakes: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl WebSocketUpstream {
    fn app(handshakes: &Arc<AtomicUsize>) -> Router {
        Router::new()
            .route("/api/ws", get(echo_socket))
            .route("/api/bye", get(close_at_once))
            .fallback(any(plain))
            .with_state(handshakes.clone())
    }

    async fn start() -> Self {
        let handshakes = Arc::new(AtomicUsize::new(0));
        let app = Self::app(&handshakes);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            handshakes,
            task,
        }
    }

    /// The same upstream over TLS, presenting `server`'s certificate.
    async fn start_tls(server: &Issued) -> Self {
        let handshakes = Arc::new(AtomicUsize::new(0));
        let tls = serve_tls(Self::app(&handshakes), server, None).await;
        Self {
            addr: tls.addr,
            handshakes,
            task: tls.task,
        }
    }

    fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl Drop for WebSocketUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn fields(headers: &HeaderMap) -> Value {
    let mut fields = Map::new();
    for (name, value) in headers {
        fields.insert(
            name.as_str().to_owned(),
            Value::from(String::from_utf8_lossy(value.as_bytes()).into_owned()),
        );
    }
    Value::Object(fields)
}

async fn echo_socket(
    State(handshakes): State<Arc<AtomicUsize>>,
    headers: HeaderMap,
    upgrade: WebSocketUpgrade,
) -> Response {
    handshakes.fetch_add(1, Ordering::SeqCst);
    let seen = json!({ "headers": fields(&headers) }).to_string();
    upgrade.on_upgrade(move |mut socket: WebSocket| async move {
        if socket
            .send(UpstreamMessage::Text(seen.into()))
            .await
            .is_err()
        {
            return;
        }
        while let Some(Ok(message)) = socket.recv().await {
            let echo = match message {
                UpstreamMessage::Text(text) => UpstreamMessage::Text(text),
                UpstreamMessage::Binary(bytes) => UpstreamMessage::Binary(bytes),
                UpstreamMessage::Close(_) => return,
                // Pings are answered by the library.
                _ => continue,
            };
            if socket.send(echo).await.is_err() {
                return;
            }
        }
    })
}

async fn close_at_once(
    State(handshakes): State<Arc<AtomicUsize>>,
    upgrade: WebSocketUpgrade,
) -> Response {
    handshakes.fetch_add(1, Ordering::SeqCst);
    upgrade.on_upgrade(|mut socket: WebSocket| async move {
        let _ = socket
            .send(UpstreamMessage::Close(Some(CloseFrame {
                code: 4000,
                reason: "bye".into(),
            })))
            .await;
        // Wait for the client's reply to the close before the connection goes.
        while let Some(Ok(_)) = socket.recv().await {}
    })
}

async fn plain(headers: HeaderMap) -> Json<Value> {
    Json(json!({ "headers": fields(&headers) }))
}

/// A gateway routing `/api` to `upstream`, with `limits` (YAML list items indented by 6 spaces) if any.
async fn gateway_for(upstream: &WebSocketUpstream, limits: &str) -> common::TestGateway {
    gateway_naming(upstream, "ws", limits).await
}

/// [`gateway_for`] with the upstream called `name` in the config.
async fn gateway_naming(
    upstream: &WebSocketUpstream,
    name: &str,
    limits: &str,
) -> common::TestGateway {
    let yaml = ConfigBuilder::new()
        .upstream_with(name, &format!("http://{}", upstream.addr), "timeout: 5s")
        .route("api", "/api")
        .to(name)
        .limits_yaml(limits)
        .build();
    start_gateway(&yaml).await
}

/// Sends a raw request head on a new connection and reads the response head, byte by byte so that nothing after it
/// is consumed: the connection is returned positioned at the first byte after the head.
async fn raw_head(addr: SocketAddr, head: &str) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write");
    (read_head(&mut stream).await, stream)
}

/// Reads a response head from `stream`, byte by byte, leaving it at the first byte after the head.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut response = Vec::new();
    let mut byte = [0u8; 1];
    while !response.ends_with(b"\r\n\r\n") {
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut byte))
            .await
            .expect("a response head within 5 s")
            .expect("read");
        assert_eq!(
            read,
            1,
            "closed after {:?}",
            String::from_utf8_lossy(&response)
        );
        response.push(byte[0]);
    }
    String::from_utf8_lossy(&response).into_owned()
}

fn handshake(path: &str, extra: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: chat.test\r\nConnection: Upgrade{extra}\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
}

/// Opens a WebSocket to `path` through the gateway with a real client library.
async fn connect(
    gateway: &common::TestGateway,
    path: &str,
) -> (
    WebSocketStream<TcpStream>,
    tokio_tungstenite::tungstenite::handshake::client::Response,
) {
    let stream = TcpStream::connect(gateway.addr).await.expect("connect");
    let request = format!("ws://{}{path}", gateway.addr)
        .into_client_request()
        .expect("request");
    tokio_tungstenite::client_async(request, stream)
        .await
        .expect("the handshake passes the gateway")
}

async fn next_text(socket: &mut WebSocketStream<TcpStream>) -> String {
    match tokio::time::timeout(Duration::from_secs(5), socket.next()).await {
        Ok(Some(Ok(Message::Text(text)))) => text.as_str().to_owned(),
        other => panic!("expected a text message, got {other:?}"),
    }
}

#[tokio::test]
async fn messages_cross_the_gateway_both_ways() {
    let upstream = WebSocketUpstream::start().await;
    let gateway = gateway_for(&upstream, "").await;
    let (mut socket, response) = connect(&gateway, "/api/ws").await;
    assert_eq!(response.status(), 101);
    assert!(response.headers().contains_key("x-request-id"));
    assert_eq!(response.headers()["via"], "1.1 tollgate");

    let seen: Value = serde_json::from_str(&next_text(&mut socket).await).expect("json");
    assert_eq!(seen["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["headers"]["via"], "1.1 tollgate");

    socket
        .send(Message::text("ping over the tunnel"))
        .await
        .expect("send");
    assert_eq!(next_text(&mut socket).await, "ping over the tunnel");
    let binary: Vec<u8> = (0..=255).cycle().take(200_000).collect();
    socket
        .send(Message::binary(binary.clone()))
        .await
        .expect("send");
    match tokio::time::timeout(Duration::from_secs(5), socket.next()).await {
        Ok(Some(Ok(Message::Binary(echoed)))) => assert!(echoed == binary, "binary echo differs"),
        other => panic!("expected the binary echo, got {other:?}"),
    }
    socket.close(None).await.expect("close");
    assert_eq!(upstream.handshakes(), 1);
}

#[tokio::test]
async fn the_handshake_keeps_its_upgrade_fields_and_loses_the_other_hop_by_hop_ones() {
    let upstream = WebSocketUpstream::start().await;
    let gateway = gateway_for(&upstream, "").await;
    let (head, stream) = raw_head(
        gateway.addr,
        &handshake(
            "/api/ws",
            ", X-Secret\r\nX-Secret: hop\r\nKeep-Alive: timeout=5\r\nX-Kept: yes",
        ),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("\r\nupgrade: websocket\r\n"), "{head}");
    assert!(lower.contains("\r\nconnection: upgrade\r\n"), "{head}");
    assert!(
        lower.contains("\r\nsec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo=\r\n"),
        "{head}"
    );

    let mut socket = WebSocketStream::from_raw_socket(stream, Role::Client, None).await;
    let seen: Value = serde_json::from_str(&next_text(&mut socket).await).expect("json");
    let fields = &seen["headers"];
    assert_eq!(fields["upgrade"], "websocket");
    assert_eq!(fields["connection"], "upgrade");
    assert_eq!(fields["sec-websocket-key"], "dGhlIHNhbXBsZSBub25jZQ==");
    assert_eq!(fields["x-kept"], "yes");
    assert!(
        fields.get("x-secret").is_none(),
        "named by Connection: {fields}"
    );
    assert!(fields.get("keep-alive").is_none(), "{fields}");
    socket
        .send(Message::text("still a tunnel"))
        .await
        .expect("send");
    assert_eq!(next_text(&mut socket).await, "still a tunnel");
}

#[tokio::test]
async fn a_handshake_over_the_limit_is_refused_before_the_upstream() {
    let upstream = WebSocketUpstream::start().await;
    // sliding_log: exact over any minute, so a window boundary between the handshakes cannot admit a third.
    let limits = "      - name: per-ip\n        key: ip\n        algorithm: sliding_log\n        limit: 2\n        \
                  period: 1m\n";
    let gateway = gateway_for(&upstream, limits).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let (head, stream) = raw_head(gateway.addr, &handshake("/api/ws", "")).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("\r\nx-ratelimit-limit: 2\r\n"),
            "{head}"
        );
        open.push(WebSocketStream::from_raw_socket(stream, Role::Client, None).await);
    }
    let (head, _) = raw_head(gateway.addr, &handshake("/api/ws", "")).await;
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert!(
        head.to_ascii_lowercase().contains("\r\nretry-after: "),
        "{head}"
    );
    assert_eq!(upstream.handshakes(), 2);

    // The limit counts handshakes, not messages: the open tunnels carry on.
    for socket in &mut open {
        next_text(socket).await;
        for n in 0..5 {
            socket
                .send(Message::text(format!("message {n}")))
                .await
                .expect("send");
            assert_eq!(next_text(socket).await, format!("message {n}"));
        }
    }
}

#[tokio::test]
async fn an_upstream_that_declines_the_upgrade_is_answered_as_usual() {
    let upstream = WebSocketUpstream::start().await;
    let gateway = gateway_for(&upstream, "").await;
    let (head, mut stream) = raw_head(gateway.addr, &handshake("/api/plain", "")).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("\r\nupgrade:"),
        "{head}"
    );
    let length: usize = head
        .to_ascii_lowercase()
        .split("\r\ncontent-length: ")
        .nth(1)
        .and_then(|rest| rest.split("\r\n").next())
        .and_then(|n| n.parse().ok())
        .expect("content-length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.expect("body");
    let seen: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(
        seen["headers"]["upgrade"], "websocket",
        "the upgrade was offered"
    );

    // Still plain HTTP/1.1 on the client's connection: another request on it is answered.
    stream
        .write_all(b"GET /api/plain HTTP/1.1\r\nHost: chat.test\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut rest))
        .await
        .expect("answered within 5 s")
        .expect("read");
    assert!(
        rest.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&rest)
    );
    assert_eq!(upstream.handshakes(), 0);
}

#[tokio::test]
async fn upgrades_to_other_protocols_are_not_passed_on() {
    let upstream = WebSocketUpstream::start().await;
    let gateway = gateway_for(&upstream, "").await;
    let response = common::http_client::raw(
        gateway.addr,
        b"GET /api/plain HTTP/1.1\r\nHost: chat.test\r\nConnection: Upgrade, HTTP2-Settings, close\r\nUpgrade: h2c\r\n\
          HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n\r\n",
    )
    .await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let body = &response[response.find("\r\n\r\n").expect("head end") + 4..];
    let seen: Value = serde_json::from_str(body).expect("json");
    assert!(seen["headers"].get("upgrade").is_none(), "{seen}");
    assert!(
        seen["headers"].get("http2-settings").is_none(),
        "named by Connection: {seen}"
    );
}

#[tokio::test]
async fn the_tunnel_ends_when_the_upstream_closes_it() {
    let upstream = WebSocketUpstream::start().await;
    let gateway = gateway_for(&upstream, "").await;
    let (mut socket, _) = connect(&gateway, "/api/bye").await;
    match tokio::time::timeout(Duration::from_secs(5), socket.next()).await {
        Ok(Some(Ok(Message::Close(Some(frame))))) => {
            assert_eq!(u16::from(frame.code), 4000);
            assert_eq!(frame.reason.as_str(), "bye");
        }
        other => panic!("expected the upstream's close, got {other:?}"),
    }
    // The close is answered by the library; then the gateway closes the client's side as the upstream's goes.
    let end = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(Ok(_)) = socket.next().await {}
    })
    .await;
    assert!(
        end.is_ok(),
        "the tunnel stayed open after the upstream closed"
    );
}

/// The value of `tollgate_websocket_tunnels` for `upstream` on the admin listener at `admin`.
async fn open_tunnels(admin: &str, upstream: &str) -> Option<f64> {
    let text = common::http_client::metrics_text(admin).await;
    let series = format!("tollgate_websocket_tunnels{{upstream=\"{upstream}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test]
async fn open_tunnels_are_counted_until_they_close() {
    tollgate::telemetry::prometheus().expect("this test process's recorder");
    let upstream = WebSocketUpstream::start().await;
    // An upstream name no other test uses: the recorder is shared by the whole test process.
    let gateway = gateway_naming(&upstream, "ws_counted", "").await;
    let admin = serve_admin(&gateway, None).await;
    let mut sockets = Vec::new();
    for _ in 0..2 {
        let (head, stream) = raw_head(gateway.addr, &handshake("/api/ws", "")).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        let mut socket = WebSocketStream::from_raw_socket(stream, Role::Client, None).await;
        // The first message proves the tunnel is spliced (the gauge moves as it starts).
        next_text(&mut socket).await;
        sockets.push(socket);
    }
    assert_eq!(open_tunnels(&admin, "ws_counted").await, Some(2.0));
    for mut socket in sockets {
        socket.close(None).await.expect("close");
        while let Ok(Some(Ok(_))) =
            tokio::time::timeout(Duration::from_secs(5), socket.next()).await
        {}
    }
    let mut open = None;
    eventually(Duration::from_secs(5), async || {
        open = open_tunnels(&admin, "ws_counted").await;
        open == Some(0.0)
    })
    .await;
    assert_eq!(
        open,
        Some(0.0),
        "the gauge comes back down as the tunnels close"
    );
}

/// A client's text frame: final, masked (RFC 6455 §5.3), with a payload under 126 bytes.
fn masked_text_frame(text: &str) -> Vec<u8> {
    let mask = [0x37, 0xfa, 0x21, 0x3d];
    let length = u8::try_from(text.len()).expect("short text");
    assert!(length < 126);
    let mut frame = vec![0x81, 0x80 | length];
    frame.extend_from_slice(&mask);
    frame.extend(text.bytes().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    frame
}

#[tokio::test]
async fn a_frame_sent_with_the_handshake_is_not_lost() {
    // The client writes its first frame in the same packet as the handshake, before any 101: the gateway has read
    // it with the request head, and must hand it to the tunnel rather than drop it.
    let upstream = WebSocketUpstream::start().await;
    let gateway = gateway_for(&upstream, "").await;
    let mut opening = handshake("/api/ws", "").into_bytes();
    opening.extend(masked_text_frame("sent early"));
    let mut stream = TcpStream::connect(gateway.addr).await.expect("connect");
    stream.write_all(&opening).await.expect("write");
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let mut socket = WebSocketStream::from_raw_socket(stream, Role::Client, None).await;
    next_text(&mut socket).await;
    assert_eq!(next_text(&mut socket).await, "sent early");
}

#[tokio::test]
async fn a_keep_alive_connection_that_rested_between_requests_upgrades() {
    let upstream = WebSocketUpstream::start().await;
    let gateway = gateway_for(&upstream, "").await;
    let (head, mut stream) =
        raw_head(gateway.addr, "GET /api/plain HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let length: usize = head
        .to_ascii_lowercase()
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("a content-length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.expect("the body");
    // Idle past the second after which a connection rests with its socket alone (docs/operations.md): the
    // handshake comes to a new hyper connection, which hands the socket to the tunnel.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let request = format!("ws://{}/api/ws", gateway.addr)
        .into_client_request()
        .expect("request");
    let (mut socket, response) = tokio_tungstenite::client_async(request, stream)
        .await
        .expect("the handshake passes the gateway");
    assert_eq!(response.status(), 101);
    next_text(&mut socket).await;
    socket
        .send(Message::text("after a rest"))
        .await
        .expect("send");
    assert_eq!(next_text(&mut socket).await, "after a rest");
    assert_eq!(upstream.handshakes(), 1);
}

#[tokio::test]
async fn a_websocket_reaches_an_https_upstream_over_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ca = TestCa::new(dir.path(), "upstream");
    let upstream = WebSocketUpstream::start_tls(&ca.issue("server", &["ws.internal"])).await;
    let tls = format!(
        "tls: {{ ca_file: {:?}, server_name: ws.internal }}",
        ca.ca_file.display().to_string()
    );
    let yaml = ConfigBuilder::new()
        .upstream_with("secure", &format!("https://{}", upstream.addr), &tls)
        .route("api", "/api")
        .to("secure")
        .build();
    let gateway = start_gateway(&yaml).await;
    let (mut socket, response) = connect(&gateway, "/api/ws").await;
    assert_eq!(response.status(), 101);
    let seen: Value = serde_json::from_str(&next_text(&mut socket).await).expect("json");
    assert_eq!(seen["headers"]["x-test-sni"], "ws.internal");
    socket.send(Message::text("over tls")).await.expect("send");
    assert_eq!(next_text(&mut socket).await, "over tls");
    socket.close(None).await.expect("close");
    assert_eq!(upstream.handshakes(), 1);
}

/// Opens a WebSocket to `path` on the gateway listening at `addr`, with a real client library; reads the upstream's
/// first message (the handshake's fields).
async fn open_at(addr: SocketAddr, path: &str) -> WebSocketStream<TcpStream> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let request = format!("ws://{addr}{path}")
        .into_client_request()
        .expect("request");
    let (mut socket, response) = tokio_tungstenite::client_async(request, stream)
        .await
        .expect("the handshake passes the gateway");
    assert_eq!(response.status(), 101);
    next_text(&mut socket).await;
    socket
}

/// Sends `text` through `socket` and expects it echoed.
async fn echoed_through(socket: &mut WebSocketStream<TcpStream>, text: &str) {
    socket.send(Message::text(text)).await.expect("send");
    assert_eq!(next_text(socket).await, text);
}

#[tokio::test]
async fn on_sigterm_open_websockets_get_the_grace_period_then_the_rest_are_cut() {
    let upstream = WebSocketUpstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    let yaml = ConfigBuilder::new()
        .admin()
        .top("server:\n  shutdown_delay: 0s\n  shutdown_grace: 5s\n")
        .upstream("ws", &format!("http://{}", upstream.addr))
        .route("api", "/api")
        .to("ws")
        .build();
    std::fs::write(&path, yaml).expect("write config");
    let mut command = Tollgate::command(&path);
    command.env("RUST_LOG", "warn");
    let mut process = Tollgate::spawn(command);
    let mut cut = open_at(process.listen, "/api/ws").await;
    let mut closed = open_at(process.listen, "/api/ws").await;

    let status = std::process::Command::new("kill")
        .args(["-TERM", &process.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    let readyz = process.admin_url("/readyz");
    let draining = eventually(Duration::from_secs(5), async || {
        match common::http_client::client().get(&readyz).send().await {
            Ok(response) => response.status() == 503,
            // Gone already: the tunnels were not waited for.
            Err(_) => true,
        }
    })
    .await;
    assert!(draining.is_some(), "the drain never began");

    // The listener is closed, but both tunnels carry messages within the grace period; one closes by itself.
    echoed_through(&mut cut, "still open while draining").await;
    echoed_through(&mut closed, "this one too").await;
    closed.close(None).await.expect("close");
    while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_secs(5), closed.next()).await {}
    drop(closed);

    // The other is cut when the grace period ends, and the process exits 0 saying so.
    let ended = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(Ok(_)) = cut.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the tunnel outlived the grace period");
    let mut exit = None;
    let exited = eventually(Duration::from_secs(10), async || {
        exit = process.process.0.try_wait().expect("wait");
        exit.is_some()
    })
    .await;
    assert!(
        exited.is_some(),
        "tollgate did not exit:\n{}",
        process.log()
    );
    assert_eq!(exit.and_then(|s| s.code()), Some(0));
    let log = process.log();
    let line = log
        .lines()
        .find(|line| line.contains("drain ended with connections still open"))
        .unwrap_or_else(|| panic!("no line for the cut:\n{log}"));
    assert!(
        line.contains("finished=1") && line.contains("cut=1"),
        "{line}"
    );
}

#[tokio::test]
async fn a_websocket_crosses_a_route_that_reads_token_usage_and_spends_no_tokens() {
    let upstream = WebSocketUpstream::start().await;
    let gateway = start_gateway(&format!(
        r#"store:
  backend: memory
upstreams:
  ws: {{ targets: ["http://{}"] }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: ws
    usage: {{ format: openai, reserve: {{ completion_default: 100 }} }}
    limits:
      - {{ name: tpm, key: ip, algorithm: fixed_window, limit: 1000, period: 1h, counts: total_tokens }}
"#,
        upstream.addr
    ))
    .await;
    let admin = serve_admin(&gateway, None).await;
    let (mut socket, response) = connect(&gateway, "/api/ws").await;
    assert_eq!(response.status(), 101);
    next_text(&mut socket).await;
    socket.send(Message::text("tokens?")).await.expect("send");
    assert_eq!(next_text(&mut socket).await, "tokens?");
    socket.close(None).await.expect("close");
    drop(socket);
    let url = format!("{admin}/limits/api/tpm?key=127.0.0.1");
    let (_, state) =
        common::http_client::json_answer(common::http_client::client().get(&url)).await;
    assert_eq!(state["remaining"], 1000, "{state}");
}
