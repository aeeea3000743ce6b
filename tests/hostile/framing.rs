//! Malformed and smuggling-shaped framing: oversize heads (431), conflicting lengths and framings, malformed chunks,
//! bodies cut short (400, never an upstream failure), methods in other cases and CONNECT.

use std::time::Duration;

use crate::common::http_client::raw;
use crate::common::start_gateway;
use crate::common::upstream::Upstream;
use crate::{inner_yaml, send, yaml};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn oversized_request_head_gets_431() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "")).await;
    let big = "x".repeat(40_000);
    let request =
        format!("GET /api HTTP/1.1\r\nHost: a\r\nX-Big: {big}\r\nConnection: close\r\n\r\n");
    let response = raw(gateway.addr, request.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 431"), "{response:.80}");
    // Still incomplete when the read buffer was full: refused by the HTTP server, with the documented body.
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
    assert_eq!(body["error"], "header_too_large", "{response}");
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn conflicting_framing_never_reaches_the_upstream_ambiguous() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "")).await;
    // Two different lengths: refused outright.
    let two_lengths = b"POST /api HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 5\r\nConnection: close\r\n\r\nabcde";
    let response = raw(gateway.addr, two_lengths).await;
    assert!(response.starts_with("HTTP/1.1 400"), "{response:.80}");
    assert_eq!(upstream.hits(), 0);

    // Transfer-Encoding and Content-Length: the chunked framing wins, Content-Length is dropped (RFC 9112 §6.3)
    // and the connection is closed after the response, so the upstream sees one request with one framing and
    // the bytes after the empty chunk are discarded, never a second request smuggled in behind the first.
    let smuggle = b"POST /api/first HTTP/1.1\r\nHost: a\r\nContent-Length: 43\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /api/second HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";
    let response = raw(gateway.addr, smuggle).await;
    assert_eq!(response.matches("HTTP/1.1 ").count(), 1, "{response}");
    assert!(response.contains("connection: close"), "{response}");
    assert!(response.contains("\"path\":\"/api/first\""), "{response}");
    assert!(!response.contains("/api/second"), "{response}");
    assert!(!response.contains("\"content-length\""), "{response}");
    assert_eq!(upstream.hits(), 1);
}

/// A gateway with an upstream route `framing` at `/up` and a `respond` route `here` at `/here`, both unlimited.
fn framing_yaml(upstream: &str, max_header_bytes: usize) -> String {
    format!(
        r#"server:
  header_read_timeout: 2s
  max_header_bytes: {max_header_bytes}
upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: framing
    match: {{ path_prefix: /up }}
    upstream: backend
  - name: here
    match: {{ path_prefix: /here }}
    respond: {{ status: 200, body: here }}
"#
    )
}

/// Writes `request`, closes the writing half (the body ends where `request` does) and reads the answer.
async fn send_then_half_close(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    stream.shutdown().await.expect("half close");
    let mut buffer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut buffer)).await;
    String::from_utf8_lossy(&buffer).into_owned()
}

fn upstream_durations(route: &str) -> f64 {
    let metrics = tollgate::telemetry::prometheus()
        .expect("recorder")
        .render();
    let prefix = format!("tollgate_upstream_duration_seconds_count{{route=\"{route}\"}}");
    metrics
        .lines()
        .find(|line| line.starts_with(&prefix))
        .and_then(|line| line.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().expect("a number"))
}

#[tokio::test]
async fn malformed_chunk_size_is_400_not_an_upstream_failure() {
    tollgate::telemetry::prometheus().expect("recorder");
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&framing_yaml(&upstream.url(), 65536)).await;
    for path in ["/up", "/here"] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff1\r\nabc\r\n0\r\n\r\n"
        );
        let response = raw(gateway.addr, request.as_bytes()).await;
        assert!(response.starts_with("HTTP/1.1 400"), "{path}: {response}");
        assert!(
            response.contains(r#"{"error":"bad_request""#),
            "{path}: {response}"
        );
    }
    // Told apart from an upstream failure: no upstream exchange recorded for the route.
    assert_eq!(upstream_durations("framing"), 0.0);
}

#[tokio::test]
async fn body_cut_short_is_400_not_an_upstream_failure() {
    tollgate::telemetry::prometheus().expect("recorder");
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&framing_yaml(&upstream.url(), 65536)).await;
    for path in ["/up", "/here"] {
        for request in [
            format!("POST {path} HTTP/1.1\r\nHost: a\r\nContent-Length: 100\r\n\r\nonly ten b"),
            format!(
                "POST {path} HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n20\r\nshort"
            ),
        ] {
            let response = send_then_half_close(gateway.addr, request.as_bytes()).await;
            assert!(
                response.starts_with("HTTP/1.1 400"),
                "{request:.60}: {response}"
            );
            assert!(response.contains(r#"{"error":"bad_request""#), "{response}");
        }
    }
    assert_eq!(upstream_durations("framing"), 0.0);
}

#[tokio::test]
async fn conflicting_lengths_are_400_before_any_route() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&framing_yaml(&upstream.url(), 65536)).await;
    for path in ["/up", "/here"] {
        for framing in [
            "Content-Length: 4\r\nContent-Length: 5\r\n",
            "Content-Length: 4, 5\r\n",
            "Content-Length: -4\r\n",
            "Transfer-Encoding: gzip\r\n",
            "Transfer-Encoding: chunked, gzip\r\n",
        ] {
            let request = format!(
                "POST {path} HTTP/1.1\r\nHost: a\r\n{framing}Connection: close\r\n\r\nabcde"
            );
            let response = raw(gateway.addr, request.as_bytes()).await;
            assert!(
                response.starts_with("HTTP/1.1 400"),
                "{framing}: {response}"
            );
            // With the JSON body of every other refusal, though the HTTP server refuses it before any route.
            let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
            let body: serde_json::Value = serde_json::from_str(body).expect("a JSON body");
            assert_eq!(body["error"], "bad_request", "{framing}: {response}");
            assert!(response
                .to_ascii_lowercase()
                .contains("content-type: application/json"));
        }
    }
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn oversize_head_in_one_write_gets_431() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&framing_yaml(&upstream.url(), 65536)).await;
    for path in ["/up", "/here"] {
        for size in [70_000, 114_000] {
            // One write: the whole head can reach the server's buffer in one read, past its size check.
            let big = "x".repeat(size);
            let request = format!("GET {path} HTTP/1.1\r\nHost: a\r\nX-Big: {big}\r\n\r\n");
            let response = raw(gateway.addr, request.as_bytes()).await;
            assert!(
                response.starts_with("HTTP/1.1 431"),
                "{path} {size}: {response:.300}"
            );
            assert!(
                response.contains(r#"{"error":"header_too_large""#),
                "{response:.300}"
            );
        }
    }
    // A head just within the limit still passes.
    let fits = format!(
        "GET /here HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "x".repeat(60_000)
    );
    let response = raw(gateway.addr, fits.as_bytes()).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response:.300}");
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn oversize_head_over_h2c_gets_431() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&framing_yaml(&upstream.url(), 65536)).await;
    let h2 = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    for path in ["/up", "/here"] {
        for size in [70_000, 114_000] {
            let response = h2
                .get(gateway.url(path))
                .header("x-big", "x".repeat(size))
                .send()
                .await
                .expect("request");
            assert_eq!(response.version(), reqwest::Version::HTTP_2);
            assert_eq!(response.status(), 431, "{path} {size}");
        }
    }
    assert_eq!(upstream.hits(), 0);
}

#[tokio::test]
async fn case_variant_methods_and_connect_are_refused() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    for _ in 0..2 {
        let request =
            "POST /login HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        assert_eq!(send(gateway.addr, request).await.0, 200);
    }
    let (status, _) = send(
        gateway.addr,
        "post /login HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(
        status, 400,
        "a lower-case post must not pass the POST route's limit"
    );
    let (status, body) = send(
        gateway.addr,
        "CONNECT /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 405, "{body}");
    let (status, body) = send(
        gateway.addr,
        "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 405, "authority form: {body}");
    assert_eq!(upstream.hits(), 2);
}
