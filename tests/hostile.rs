//! Hostile input: oversized or slow request heads, smuggling-shaped framing, forged or malformed forwarding
//! headers, keys built to bloat Redis or pick a cluster slot, floods of distinct clients, an exposed admin.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::h2::{h2_frame, GET_API_BLOCK, H2_PREFACE};
use common::http_client::{client, raw};
use common::redis::RedisServer;
use common::start_gateway;
use common::upstream::Upstream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tollgate::limiter::store::{LimitCheck, MemoryStore};
use tollgate::limiter::{Algorithm, Limit, ManualClock};

fn yaml(upstream: &str, extra: &str) -> String {
    format!(
        r#"server:
  header_read_timeout: 500ms
  max_header_bytes: 16384
{extra}upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits:
      - name: per-ip
        key: ip
        algorithm: sliding_log
        limit: 3
        period: 1m
"#
    )
}

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

#[tokio::test]
async fn malformed_forwarded_for_from_a_trusted_proxy_falls_back_to_the_last_good_hop() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(
        &upstream.url(),
        "client_ip:\n  trusted_proxies: [127.0.0.1/32]\n",
    ))
    .await;
    let client = client();
    // `garbage` cannot be believed: the client is the hop that wrote it, 127.0.0.1 itself.
    for forged in ["203.0.113.1, garbage", "203.0.113.2, 300.1.1.1", "unknown"] {
        let response = client
            .get(gateway.url("/api"))
            .header("x-forwarded-for", forged)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success() || response.status() == 429);
    }
    // All three shared the 127.0.0.1 bucket of 3.
    let response = client.get(gateway.url("/api")).send().await.unwrap();
    assert_eq!(response.status(), 429);
}

#[tokio::test]
async fn hostile_key_values_are_digested_in_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let extra = format!(
        "store:\n  backend: redis\n  url: {}\n  timeout: 500ms\n  on_error: deny\n",
        redis.url()
    );
    let routes = yaml(&upstream.url(), &extra).replace("key: ip", "key: [header:x-api-key]");
    let gateway = start_gateway(&routes).await;
    let client = client();
    let long = "k".repeat(10_000);
    for value in ["{slot}", "a}b{c", long.as_str(), "tab\there"] {
        let response = client
            .get(gateway.url("/api"))
            .header("x-api-key", value)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{value:.20}");
    }
    // The route's keys (the store's lost-state marker, `tollgate:epoch`, is not one of them).
    let keys = redis.cli(&["KEYS", "tollgate:api:*"]).unwrap();
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    for key in keys {
        assert!(key.len() < 100, "{key}");
        let tag = key.split_once('{').unwrap().1;
        let tag = tag.strip_suffix('}').unwrap();
        assert_eq!(tag.len(), 64, "{key}");
        assert!(tag.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    }
}

/// SHA-256 of `text`, in hex.
fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[tokio::test]
async fn keys_made_from_credentials_are_digested_before_they_reach_the_store() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = format!(
        r#"store:
  backend: redis
  url: {redis}
  timeout: 500ms
  on_error: deny
upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
  anonymous: {{ plan: anonymous }}
  plans:
    anonymous:
      limits: [{{ name: by-key, key: [header:x-api-key], algorithm: sliding_log, limit: 100, period: 1h }}]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    consumers: off
    limits:
      - {{ name: by-auth, key: [header:authorization], missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
      - {{ name: by-cookie, key: [ip, header:cookie], missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
      - {{ name: by-api-key, key: [header:x-api-key], missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
      - {{ name: by-tenant, key: [header:x-tenant], secret: true, missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
      - {{ name: by-plain, key: [header:x-plain], missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
"#,
        redis = redis.url(),
        upstream = upstream.url()
    );
    let gateway = start_gateway(&yaml).await;
    let admin = common::serve_admin(&gateway, None).await;
    let client = client();
    let secrets = [
        ("authorization", "Bearer short-token"),
        ("cookie", "session=abc"),
        ("x-api-key", "live-key-1"),
        ("x-tenant", "tenant-secret"),
    ];
    let mut request = client.get(gateway.url("/api")).header("x-plain", "visible");
    for (name, value) in secrets {
        request = request.header(name, value);
    }
    assert_eq!(request.send().await.expect("request").status(), 200);

    let keys = redis.cli(&["KEYS", "*"]).expect("KEYS");
    for (_, value) in secrets {
        assert!(!keys.contains(value), "{value:?} in a store key:\n{keys}");
    }
    // Not a secret: as it was sent.
    assert!(keys.contains("tollgate:api:by-plain:{visible}"), "{keys}");
    for (limit, value) in [
        ("by-auth", "Bearer short-token".to_owned()),
        ("by-cookie", "127.0.0.1|session=abc".to_owned()),
        ("by-api-key", "live-key-1".to_owned()),
        ("by-tenant", "tenant-secret".to_owned()),
    ] {
        let key = format!("tollgate:api:{limit}:{{{}}}", sha256_hex(&value));
        assert!(keys.contains(&key), "{key} in\n{keys}");
        // The admin API takes the value as written and finds its digest.
        let url = format!("{admin}/limits/api/{limit}?key={}", urlencode(&value));
        let body: serde_json::Value = serde_json::from_str(
            &client
                .get(&url)
                .send()
                .await
                .expect("peek")
                .text()
                .await
                .expect("body"),
        )
        .expect("JSON");
        assert_eq!(body["store_key"], key.as_str(), "{body}");
        assert_eq!(body["remaining"], 99, "{body}");
    }
    // The plan's limit keyed by the consumers' key header too, though the route does not identify callers.
    assert!(!keys.contains("consumer:by-key:{live-key-1}"), "{keys}");
}

fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[test]
fn a_hundred_thousand_clients_stay_within_max_keys() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = MemoryStore::new(10_000, clock);
    let limit = Limit::new(
        "per-ip",
        Algorithm::SlidingLog {
            limit: 10,
            period_ms: 3_600_000,
        },
        1,
    )
    .unwrap();
    for i in 0..100_000u32 {
        let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
        let key = format!("tollgate:api:per-ip:{{{ip}}}");
        let outcome = store.check(&[LimitCheck {
            key: &key,
            limit: &limit,
        }]);
        assert!(outcome.allowed);
    }
    let held = store.len();
    assert!(held <= 10_048, "{held} keys held for max_keys 10000");
}

#[test]
fn admin_on_a_public_address_without_token_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("exposed.yaml");
    // Refused before binding anything: port 0 would do if it did bind.
    let yaml = "listen: 127.0.0.1:0\nadmin:\n  listen: 0.0.0.0:0\nstore:\n  backend: memory\n";
    std::fs::write(&path, yaml).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["run", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("admin.token"), "{stderr}");
}

// === Refusals of malformed framing, oversize heads and wrong admin tokens ===

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
async fn admin_token_of_another_length_or_with_the_right_prefix_is_401() {
    const TOKEN: &str = "s3cret-admin-token";
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&yaml(&upstream.url(), "")).await;
    let admin = common::serve_admin(&gateway, Some(TOKEN)).await;
    let client = client();
    let url = format!("{admin}/limits/api/per-ip?key=1.2.3.4");
    let longer = format!("{TOKEN}{}", "x".repeat(1000));
    for wrong in [
        "s",
        "s3cret-admin-toke",
        "s3cret-admin-tokenX",
        "s3cret-admin-tokeN",
        &longer,
    ] {
        let response = client.get(&url).bearer_auth(wrong).send().await.unwrap();
        assert_eq!(response.status(), 401, "{wrong:.30}");
    }
    let response = client.get(&url).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(response.status(), 200);
}

// === one view of the request ===
//
// An "inner" gateway trusting 127.0.0.1 as a proxy, with the routes a login-protecting deployment has, and a
// "front" gateway trusting nobody that proxies everything to it. The upstream echoes what it received.

fn inner_yaml(upstream: &str) -> String {
    format!(
        r#"client_ip:
  trusted_proxies: [127.0.0.1/32]
upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: login
    match: {{ path: /login, methods: [POST] }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 2, period: 1m }}]
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 5, period: 1m }}]
  - name: internal
    match: {{ path_prefix: /internal }}
    upstream: backend
    allow: [10.0.0.0/8]
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: keyed
    match: {{ path_prefix: /keyed }}
    upstream: backend
    limits: [{{ name: per-key, key: [header:x-api-key], algorithm: sliding_log, limit: 3, period: 1m }}]
  - name: limited-host
    match: {{ host: limited.example }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: catch-all
    match: {{ path_prefix: / }}
    upstream: backend
"#
    )
}

fn front_yaml(inner: std::net::SocketAddr) -> String {
    format!(
        "upstreams:\n  inner:\n    targets: [\"http://{inner}\"]\nroutes:\n  - name: all\n    match: {{ path_prefix: / }}\n    upstream: inner\n"
    )
}

/// Sends one raw request (which must end its head with `Connection: close`) and returns the status and the body.
async fn send(addr: std::net::SocketAddr, request: &str) -> (u16, String) {
    let response = raw(addr, request.as_bytes()).await;
    let status = response
        .get(9..12)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, body)| body.to_owned());
    (status, body)
}

/// The echoed request in a 200's body.
fn echoed(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not an echo: {body}"))
}

#[tokio::test]
async fn forged_client_addresses_through_a_front_gateway_are_not_believed() {
    let upstream = Upstream::start().await;
    let inner = start_gateway(&inner_yaml(&upstream.url())).await;
    let front = start_gateway(&front_yaml(inner.addr)).await;
    // A new forged address each time: the front must drop it, so the inner keys every request on 127.0.0.1.
    let mut statuses = Vec::new();
    for n in 1..=7 {
        let (status, body) = send(
            front.addr,
            &format!(
                "GET /api/x HTTP/1.1\r\nHost: a\r\nForwarded: for=203.0.113.{n}\r\nX-Real-IP: 203.0.113.{n}\r\nConnection: close\r\n\r\n"
            ),
        )
        .await;
        if status == 200 {
            let headers = &echoed(&body)["headers"];
            assert!(headers.get("forwarded").is_none(), "{headers}");
            assert!(headers.get("x-real-ip").is_none(), "{headers}");
            assert_eq!(
                headers["x-forwarded-for"], "127.0.0.1, 127.0.0.1",
                "{headers}"
            );
        }
        statuses.push(status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);

    // A forged internal address does not put anyone on the inner allowlist.
    let request =
        "GET /internal HTTP/1.1\r\nHost: a\r\nForwarded: for=10.1.2.3\r\nConnection: close\r\n\r\n";
    assert_eq!(send(front.addr, request).await.0, 200);
    assert_eq!(
        send(front.addr, request).await.0,
        429,
        "allowlisted by a forged Forwarded"
    );
}

#[tokio::test]
async fn a_percent_encoded_path_is_the_same_path() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    for _ in 0..5 {
        let (status, _) = send(
            gateway.addr,
            "GET /api/x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await;
        assert_eq!(status, 200);
    }
    for spelling in [
        "/%61pi/x",
        "/%61%70%69/x",
        "/API/../api/x",
        "/x/%2e%2e/api/x",
        "//api//x",
    ] {
        let request = format!("GET {spelling} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        assert_eq!(
            send(gateway.addr, &request).await.0,
            429,
            "{spelling} evaded /api"
        );
    }
    // The catch-all forwards the normalised path, never a spelling the upstream would read as another route's.
    let (status, body) = send(
        gateway.addr,
        "GET /%7Efree/%3f/%41 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(echoed(&body)["path"], "/~free/%3F/A");
    let (status, _) = send(
        gateway.addr,
        "GET /a%zz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn the_host_routed_on_is_the_host_forwarded_and_there_is_exactly_one() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    // The absolute-form target names the host: routed as free.example and forwarded as free.example.
    let (status, body) = send(
        gateway.addr,
        "GET http://free.example/v/x HTTP/1.1\r\nHost: limited.example\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200);
    let headers = &echoed(&body)["headers"];
    assert_eq!(headers["host"], "free.example", "{headers}");
    assert_eq!(headers["x-forwarded-host"], "free.example", "{headers}");

    // limited.example in any spelling takes the host route (limit 1).
    let limited = "GET /v HTTP/1.1\r\nHost: limited.example\r\nConnection: close\r\n\r\n";
    assert_eq!(send(gateway.addr, limited).await.0, 200);
    for spelling in [
        "GET /v HTTP/1.1\r\nHost: LIMITED.example.\r\nConnection: close\r\n\r\n",
        "GET http://limited.example:80/v HTTP/1.1\r\nHost: free.example\r\nConnection: close\r\n\r\n",
    ] {
        assert_eq!(send(gateway.addr, spelling).await.0, 429, "{spelling:?}");
    }

    for (request, why) in [
        ("GET /v HTTP/1.1\r\nHost: free.example\r\nHost: limited.example\r\nConnection: close\r\n\r\n", "two Hosts"),
        ("GET /v HTTP/1.1\r\nConnection: close\r\n\r\n", "no Host"),
        ("GET /v HTTP/1.1\r\nHost: a@limited.example\r\nConnection: close\r\n\r\n", "user info"),
        ("GET /v HTTP/1.1\r\nHost: limited.example:x\r\nConnection: close\r\n\r\n", "bad port"),
        ("GET /v HTTP/1.1\r\nHost: [limited.example]\r\nConnection: close\r\n\r\n", "a name in brackets"),
    ] {
        let (status, body) = send(gateway.addr, request).await;
        assert_eq!(status, 400, "{why}: {body}");
    }
    assert_eq!(upstream.hits(), 2);
}

#[tokio::test]
async fn every_forwarded_for_line_is_one_list_for_keying_and_forwarding() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    // Keyed on the address the whole list ends with (203.0.113.9), which is what the upstream is told, whatever
    // the first line says.
    for first in 1..=5 {
        let request = format!(
            "GET /api HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.{first}\r\nX-Forwarded-For: 203.0.113.9\r\nConnection: close\r\n\r\n"
        );
        let (status, body) = send(gateway.addr, &request).await;
        assert_eq!(status, 200);
        assert_eq!(
            echoed(&body)["headers"]["x-forwarded-for"],
            format!("198.51.100.{first}, 203.0.113.9, 127.0.0.1")
        );
    }
    let request = "GET /api HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.77\r\nX-Forwarded-For: 203.0.113.9\r\nConnection: close\r\n\r\n";
    assert_eq!(send(gateway.addr, request).await.0, 429);
}

#[tokio::test]
async fn a_key_header_or_parameter_sent_twice_is_refused() {
    let upstream = Upstream::start().await;
    let yaml = inner_yaml(&upstream.url()).replace(
        "key: [header:x-api-key]",
        "key: [header:x-api-key, \"query:tenant\"]",
    );
    let gateway = start_gateway(&yaml).await;
    for _ in 0..3 {
        let request =
            "GET /keyed?tenant=t HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n";
        assert_eq!(send(gateway.addr, request).await.0, 200);
    }
    for request in [
        "GET /keyed?tenant=t HTTP/1.1\r\nHost: a\r\nX-Api-Key: other\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n",
        "GET /keyed?tenant=t HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\nx-api-key: k1\r\nConnection: close\r\n\r\n",
        "GET /keyed?tenant=x&tenant=t HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n",
    ] {
        let (status, body) = send(gateway.addr, request).await;
        assert_eq!(status, 400, "{request:?}: {body}");
        assert!(body.contains("\"ambiguous_key\""), "{body}");
    }
    assert_eq!(upstream.hits(), 3);
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

#[tokio::test]
async fn ipv6_clients_share_a_limit_per_slash_64() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    let mut statuses = Vec::new();
    for n in 1..=6 {
        let request = format!(
            "GET /api HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 2001:db8:1:2::{n:x}\r\nConnection: close\r\n\r\n"
        );
        statuses.push(send(gateway.addr, &request).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    // Another /64 has a limit of its own.
    let request = "GET /api HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 2001:db8:1:3::1\r\nConnection: close\r\n\r\n";
    assert_eq!(send(gateway.addr, request).await.0, 200);
}

/// A gateway with API-key consumers in front of `upstream`, with `extra` under `server:`.
fn consumers_yaml(upstream: &str, server: &str) -> String {
    format!(
        r#"server:
  header_read_timeout: 2s
{server}upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
  keys:
    - {{ key: pro-key-1, consumer: acme, plan: pro }}
  anonymous: {{ plan: anonymous }}
  forward: {{ consumer: X-Consumer-Id, plan: X-Consumer-Plan }}
  plans:
    anonymous:
      limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 100, period: 1h }}]
    pro:
      limits: [{{ name: hourly, key: consumer, algorithm: sliding_log, limit: 100, period: 1h }}]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    consumers: required
"#
    )
}

#[tokio::test]
async fn connection_cannot_strip_the_fields_tollgate_writes() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&consumers_yaml(&upstream.url(), "")).await;
    let (status, body) = send(
        gateway.addr,
        "GET /api/x HTTP/1.1\r\nHost: a.example\r\nX-Api-Key: pro-key-1\r\nX-Secret: 1\r\nX-Request-Id: client-id\r\n\
         Connection: X-Consumer-Id, X-Consumer-Plan, Host, X-Forwarded-For, X-Forwarded-Host\r\n\
         Connection: X-Forwarded-Proto, Via, X-Request-Id, Forwarded, X-Secret\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let headers = &echoed(&body)["headers"];
    assert_eq!(headers["x-consumer-id"], "acme", "{headers}");
    assert_eq!(headers["x-consumer-plan"], "pro", "{headers}");
    assert_eq!(headers["host"], "a.example", "{headers}");
    assert_eq!(headers["x-forwarded-for"], "127.0.0.1", "{headers}");
    assert_eq!(headers["x-forwarded-host"], "a.example", "{headers}");
    assert_eq!(headers["x-forwarded-proto"], "http", "{headers}");
    assert_eq!(headers["via"], "1.1 tollgate", "{headers}");
    // The client's own fields named by Connection are gone: its X-Request-Id is replaced by tollgate's.
    assert!(headers.get("x-secret").is_none(), "{headers}");
    let id = headers["x-request-id"].as_str().expect("an id");
    assert!(id != "client-id" && id.len() == 32, "{headers}");
    assert!(headers.get("connection").is_none(), "{headers}");

    // A credential named by Connection is the client's own field, removed before it is read: the request is
    // anonymous, as the upstream (which never sees the key) would take it.
    let (status, _) = send(
        gateway.addr,
        "GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key: pro-key-1\r\nConnection: x-api-key, close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 401);
}

#[tokio::test]
async fn field_names_with_underscores_are_dropped_unless_kept() {
    let upstream = Upstream::start().await;
    let request = "GET /api/x HTTP/1.1\r\nHost: a\r\nX-Api-Key: pro-key-1\r\nX_Consumer_Id: alice\r\n\
                   X_consumer-plan: free\r\nX_Forwarded_For: 10.9.9.9\r\nx_request_id: forged\r\nX_Custom: 1\r\n\
                   Connection: close\r\n\r\n";
    let dropping = start_gateway(&consumers_yaml(&upstream.url(), "")).await;
    let (status, body) = send(dropping.addr, request).await;
    assert_eq!(status, 200, "{body}");
    let headers = echoed(&body)["headers"].clone();
    let underscored: Vec<&String> = headers
        .as_object()
        .expect("fields")
        .keys()
        .filter(|name| name.contains('_'))
        .collect();
    assert!(underscored.is_empty(), "{headers}");
    assert_eq!(headers["x-consumer-id"], "acme", "{headers}");

    let keeping = start_gateway(&consumers_yaml(
        &upstream.url(),
        "  underscores_in_headers: true\n",
    ))
    .await;
    let (status, body) = send(keeping.addr, request).await;
    assert_eq!(status, 200, "{body}");
    let headers = &echoed(&body)["headers"];
    assert_eq!(headers["x_custom"], "1", "{headers}");
    for protected in [
        "x_consumer_id",
        "x_consumer-plan",
        "x_forwarded_for",
        "x_request_id",
    ] {
        assert!(headers.get(protected).is_none(), "{protected}: {headers}");
    }
    assert_eq!(headers["x-consumer-id"], "acme", "{headers}");
}

#[tokio::test]
async fn only_the_client_ip_header_is_believed_so_a_spoofed_field_neither_allowlists_nor_skips_credentials(
) {
    let upstream = Upstream::start().await;
    let fields = [
        ("x-forwarded-for", "X-Forwarded-For: 10.1.2.3"),
        ("forwarded", "Forwarded: for=\"10.1.2.3\""),
        ("x-real-ip", "X-Real-IP: 10.1.2.3"),
    ];
    for (believed, _) in fields {
        let yaml = format!(
            "client_ip:\n  trusted_proxies: [127.0.0.1/32]\n  header: {believed}\n{}",
            consumers_yaml(&upstream.url(), "")
        )
        .replace(
            "    consumers: required\n",
            "    consumers: required\n    allow: [10.0.0.0/8]\n",
        );
        let gateway = start_gateway(&yaml).await;
        for (field, line) in fields {
            let request =
                format!("GET /api/x HTTP/1.1\r\nHost: a\r\n{line}\r\nConnection: close\r\n\r\n");
            let (status, body) = send(gateway.addr, &request).await;
            if field == believed {
                // The proxy's own field: allowlisted, so no credential is asked for.
                assert_eq!(status, 200, "{believed}: {field}: {body}");
                let headers = &echoed(&body)["headers"];
                assert_eq!(
                    headers["x-forwarded-for"], "10.1.2.3, 127.0.0.1",
                    "{headers}"
                );
                for (other, _) in fields {
                    if other != believed && other != "x-forwarded-for" {
                        assert!(headers.get(other).is_none(), "{believed}: {headers}");
                    }
                }
            } else {
                assert_eq!(status, 401, "{believed}: a spoofed {field} was believed");
            }
        }
    }
}

fn paths_yaml(upstream: &str, server: &str) -> String {
    format!(
        r#"server:
  header_read_timeout: 2s
{server}upstreams:
  backend:
    targets: ["{upstream}"]
routes:
  - name: login
    match: {{ path: /login, methods: [POST] }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 2, period: 1m }}]
  - name: purge
    match: {{ path: "/v1/items:purge" }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: cafe
    match: {{ path_prefix: "/caf\u00e9" }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: strict
    match: {{ path_prefix: /Strict, case_sensitive: true }}
    upstream: backend
    limits: [{{ name: per-ip, key: ip, algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: per-path
    match: {{ path_prefix: /files }}
    upstream: backend
    limits: [{{ name: per-path, key: [path], algorithm: sliding_log, limit: 1, period: 1m }}]
  - name: catch-all
    match: {{ path_prefix: / }}
    upstream: backend
"#
    )
}

async fn get(addr: std::net::SocketAddr, method: &str, target: &str) -> (u16, String) {
    let request = format!(
        "{method} {target} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    send(addr, &request).await
}

#[tokio::test]
async fn a_path_matches_with_its_trailing_slash_case_and_parameters_ignored() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&paths_yaml(&upstream.url(), "")).await;
    assert_eq!(get(gateway.addr, "POST", "/login").await.0, 200);
    let (status, body) = get(gateway.addr, "POST", "/login;jsessionid=1").await;
    assert_eq!(status, 200);
    // Forwarded faithfully: the upstream gets the canonical path, parameters and all.
    assert_eq!(echoed(&body)["path"], "/login;jsessionid=1");
    for spelling in [
        "/login/",
        "/LOGIN",
        "/Login;x=1/",
        "/x/..;/login",
        "/x/..;y/login;z",
    ] {
        assert_eq!(
            get(gateway.addr, "POST", spelling).await.0,
            429,
            "{spelling} evaded path: /login"
        );
    }
    // A path key counts every spelling as one path.
    assert_eq!(get(gateway.addr, "GET", "/files/a").await.0, 200);
    for spelling in ["/files/a/", "/FILES/A", "/files/a;v=2", "/files/%61"] {
        assert_eq!(
            get(gateway.addr, "GET", spelling).await.0,
            429,
            "{spelling}"
        );
    }
    // case_sensitive: true opts out of case folding, and only of it.
    assert_eq!(get(gateway.addr, "GET", "/Strict/x").await.0, 200);
    assert_eq!(get(gateway.addr, "GET", "/Strict/x/").await.0, 429);
    let (status, body) = get(gateway.addr, "GET", "/strict/x").await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn escapes_and_utf8_are_one_path_and_forwarded_canonical() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&paths_yaml(&upstream.url(), "")).await;
    assert_eq!(get(gateway.addr, "GET", "/v1/items%3Apurge").await.0, 200);
    assert_eq!(get(gateway.addr, "GET", "/v1/items:purge").await.0, 429);
    let (status, body) = get(gateway.addr, "GET", "/caf\u{e9}/./x").await;
    assert_eq!(status, 200);
    assert_eq!(echoed(&body)["path"], "/caf%C3%A9/x");
    for spelling in ["/caf%C3%A9/x", "/caf%c3%a9", "/CAF%C3%A9/y"] {
        assert_eq!(
            get(gateway.addr, "GET", spelling).await.0,
            429,
            "{spelling}"
        );
    }
    // What must stay escaped reaches the upstream escaped, in one spelling.
    let (status, body) = get(gateway.addr, "GET", "/other/a%7cb|c/%21%40").await;
    assert_eq!(status, 200);
    assert_eq!(echoed(&body)["path"], "/other/a%7Cb%7Cc/!@");
}

#[tokio::test]
async fn escaped_slashes_backslashes_nul_and_invalid_utf8_are_refused() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&paths_yaml(&upstream.url(), "")).await;
    for target in [
        "/files/a%2Fb",
        "/files/a%2fb",
        "/files/a%5Cb",
        "/files/a\\b",
        "/files/a%00",
        "/files/caf%E9",
        "/files/%C3%28",
    ] {
        let (status, body) = get(gateway.addr, "GET", target).await;
        assert_eq!(status, 400, "{target}: {body}");
        assert!(body.contains("\"bad_request\""), "{body}");
    }
    assert_eq!(upstream.hits(), 0);

    let keeping = start_gateway(&paths_yaml(&upstream.url(), "  escaped_slashes: keep\n")).await;
    let (status, body) = get(keeping.addr, "GET", "/files/a%2fb").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(echoed(&body)["path"], "/files/a%2Fb");
    assert_eq!(get(keeping.addr, "GET", "/files/a%5Cb").await.0, 400);
}

#[tokio::test]
async fn a_query_key_is_one_bucket_under_every_spelling_and_ambiguous_when_repeated() {
    let upstream = Upstream::start().await;
    let yaml =
        inner_yaml(&upstream.url()).replace("key: [header:x-api-key]", "key: [\"query:tenant\"]");
    let gateway = start_gateway(&yaml).await;
    let at = |query: &str| {
        format!("GET /keyed?{query} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    };
    for _ in 0..3 {
        assert_eq!(send(gateway.addr, &at("tenant=t")).await.0, 200);
    }
    for spelling in [
        "x=1;tenant=t",
        "TENANT=t",
        "tenant[]=t",
        "%74enant=t",
        "Tenant%5B%5D=t",
    ] {
        assert_eq!(
            send(gateway.addr, &at(spelling)).await.0,
            429,
            "{spelling} is a fresh bucket"
        );
    }
    for repeated in [
        "tenant=u&TENANT=v",
        "tenant=u;tenant=v",
        "tenant=u&tenant[]=v",
    ] {
        let (status, body) = send(gateway.addr, &at(repeated)).await;
        assert_eq!(status, 400, "{repeated}: {body}");
        assert!(body.contains("\"ambiguous_key\""), "{body}");
    }
    assert_eq!(upstream.hits(), 3);
}

/// Key values and API keys that are not UTF-8 are keyed by their bytes: `z\xff`, `z\xfe` and `z\xfd` are three
/// buckets (a lossy reading made them one, `z\u{FFFD}`), and neither is the bucket of the text `z\u{FFFD}` itself.
#[tokio::test]
async fn bytes_that_are_not_utf8_are_keys_of_their_own() {
    use sha2::{Digest, Sha256};
    let digest: String = Sha256::digest(b"z\xff")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let upstream = Upstream::start().await;
    for redis in [true, false] {
        let server = redis.then(RedisServer::start);
        let yaml = format!(
            r#"store:
{store}upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
    - api_key: {{ query: api_key }}
  keys:
    - {{ key: "sha256:{digest}", consumer: zff }}
  forward: {{ consumer: X-Consumer-Id }}
routes:
  - name: header
    match: {{ path_prefix: /header }}
    upstream: backend
    limits: [{{ name: per-tenant, key: [header:x-tenant], algorithm: sliding_log, limit: 1, period: 1h }}]
  - name: query
    match: {{ path_prefix: /query }}
    upstream: backend
    limits: [{{ name: per-tenant, key: [query:tenant], algorithm: sliding_log, limit: 1, period: 1h }}]
  - name: keys
    match: {{ path_prefix: /keys }}
    upstream: backend
    consumers: required
"#,
            store = common::store_yaml(server.as_ref()),
            upstream = upstream.url(),
        );
        let gateways = common::gateways_sharing(&yaml, server.as_ref()).await;
        let store = if redis { "redis" } else { "memory" };
        let http = client();
        let mut sent = 0;
        let mut send = async |path: &str, header: Option<(&str, &[u8])>| {
            let gateway = &gateways[sent % gateways.len()];
            sent += 1;
            let mut request = http.get(gateway.url(path));
            if let Some((name, value)) = header {
                let value = reqwest::header::HeaderValue::from_bytes(value).expect("value");
                request = request.header(name, value);
            }
            let response = request.send().await.expect("send");
            let status = response.status().as_u16();
            let body = response.bytes().await.expect("body");
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            (
                status,
                body["headers"]["x-consumer-id"].as_str().map(str::to_owned),
            )
        };
        let values: [&[u8]; 4] = [b"z\xff", b"z\xfe", b"z\xfd", "z\u{FFFD}".as_bytes()];
        for round in [200, 429] {
            for value in values {
                let (status, _) = send("/header", Some(("x-tenant", value))).await;
                assert_eq!(status, round, "x-tenant: {value:?}, {store}");
            }
            for query in ["z%FF", "z%FE", "z%FD", "z%EF%BF%BD"] {
                let (status, _) = send(&format!("/query?tenant={query}"), None).await;
                assert_eq!(status, round, "?tenant={query}, {store}");
            }
        }
        // The key whose digest the config lists is its bytes, in a header or a parameter; its neighbours are not.
        let zff = (200, Some("zff".to_owned()));
        assert_eq!(
            send("/keys", Some(("x-api-key", b"z\xff"))).await,
            zff,
            "{store}"
        );
        assert_eq!(send("/keys?api_key=z%FF", None).await, zff, "{store}");
        for value in [&b"z\xfe"[..], "z\u{FFFD}".as_bytes()] {
            let (status, _) = send("/keys", Some(("x-api-key", value))).await;
            assert_eq!(status, 401, "x-api-key: {value:?}, {store}");
        }
        for query in ["z%FE", "z%EF%BF%BD"] {
            let (status, _) = send(&format!("/keys?api_key={query}"), None).await;
            assert_eq!(status, 401, "?api_key={query}, {store}");
        }
    }
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
