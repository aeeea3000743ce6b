//! The access log read back from the JSON log of the running binary: each field an on-call engineer looks for
//! (the refusing limit, the caller and its plan, bytes each way, the upstream and its time, whole microseconds, the
//! trace id), and a line for a client that left in the middle of its answer.

mod common;

use std::time::Duration;

use axum::body::Body;
use axum::routing::get;
use axum::Router;
use bytes::Bytes;
use common::binary::Tollgate;
use common::eventually;
use common::http_client::client;
use common::upstream::Upstream;
use serde_json::Value;
use tokio::net::TcpListener;

/// The access lines the gateway wrote so far, as JSON.
fn access_lines(gateway: &Tollgate) -> Vec<Value> {
    gateway
        .log()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "tollgate::access")
        .map(|line| line["fields"].clone())
        .collect()
}

/// Waits for the `n`th access line and returns it.
async fn access_line(gateway: &Tollgate, n: usize) -> Value {
    eventually(Duration::from_secs(10), async || {
        access_lines(gateway).len() > n
    })
    .await;
    access_lines(gateway).swap_remove(n)
}

/// The binary with JSON logs at `info`, on `yaml`.
fn gateway(dir: &tempfile::TempDir, yaml: &str) -> Tollgate {
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, yaml).expect("config written");
    let mut command = Tollgate::command(&path);
    command
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info");
    Tollgate::spawn(command)
}

#[tokio::test]
async fn a_line_names_the_caller_the_upstream_the_bytes_and_the_refusing_limit() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
store:
  backend: memory
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
  keys:
    - {{ key: secret-acme, consumer: acme, plan: pro }}
  plans:
    pro:
      limits:
        - {{ name: hourly, key: consumer, algorithm: fixed_window, limit: 1, period: 1h }}
upstreams:
  backend:
    targets: ["{}"]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    consumers: required
"#,
        upstream.url()
    );
    let gateway = gateway(&dir, &yaml);
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let admitted = client()
        .post(gateway.url("/api/orders"))
        .header("x-api-key", "secret-acme")
        .header("traceparent", traceparent)
        .body("12345")
        .send()
        .await
        .expect("request");
    assert_eq!(admitted.status(), 200);
    let answered = admitted.bytes().await.expect("body").len() as u64;
    let line = access_line(&gateway, 0).await;
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], "/api/orders");
    assert_eq!(line["route"], "api");
    assert_eq!(line["status"], 200);
    assert_eq!(line["consumer"], "acme");
    assert_eq!(line["plan"], "pro");
    assert_eq!(line["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(line["upstream"], upstream.addr.to_string());
    assert_eq!(line["bytes_received"], 5);
    assert_eq!(line["bytes_sent"], answered);
    assert!(line.get("limit").is_none(), "{line}");
    let upstream_us = line["upstream_us"].as_u64().expect("upstream_us, whole");
    let duration_us = line["duration_us"].as_u64().expect("duration_us, whole");
    assert!(upstream_us > 0 && upstream_us <= duration_us, "{line}");
    assert!(line.get("duration_ms").is_none(), "{line}");

    let refused = client()
        .get(gateway.url("/api/orders"))
        .header("x-api-key", "secret-acme")
        .send()
        .await
        .expect("request");
    assert_eq!(refused.status(), 429);
    let body = refused.bytes().await.expect("body").len() as u64;
    let line = access_line(&gateway, 1).await;
    assert_eq!(line["status"], 429);
    assert_eq!(line["limit"], "pro.hourly");
    assert_eq!(line["consumer"], "acme");
    assert_eq!(line["plan"], "pro");
    assert_eq!(line["bytes_sent"], body);
    assert!(line.get("upstream").is_none(), "{line}");
    assert!(line.get("upstream_us").is_none(), "{line}");
    // No traceparent came: no trace id is made up for the log.
    assert!(line.get("trace_id").is_none(), "{line}");

    // An unknown key: refused before any limit, and no consumer to name.
    let unknown = client()
        .get(gateway.url("/api/orders"))
        .header("x-api-key", "nobody")
        .send()
        .await
        .expect("request");
    assert_eq!(unknown.status(), 401);
    let line = access_line(&gateway, 2).await;
    assert_eq!(line["status"], 401);
    assert!(
        line.get("consumer").is_none() && line.get("limit").is_none(),
        "{line}"
    );
    assert!(
        !gateway.log().contains("nobody"),
        "a credential reached the log"
    );
}

/// An upstream whose answer is 100 chunks of 1,000 bytes, one every 20 ms.
async fn trickling_upstream() -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let app = Router::new().fallback(get(|| async {
        let chunks = futures_util::stream::unfold(0, |sent| async move {
            if sent == 100 {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            Some((
                Ok::<_, std::io::Error>(Bytes::from(vec![b'x'; 1000])),
                sent + 1,
            ))
        });
        Body::from_stream(chunks)
    }));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

#[tokio::test]
async fn a_client_that_leaves_mid_answer_still_gets_its_line_with_what_was_sent() {
    let (upstream, _task) = trickling_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\nstore:\n  backend: memory\nupstreams:\n  slow:\n    targets: [\"{upstream}\"]\nroutes:\n  - name: stream\n    match: {{ path_prefix: /stream }}\n    upstream: slow\n"
    );
    let gateway = gateway(&dir, &yaml);
    let mut response = client()
        .get(gateway.url("/stream"))
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 200);
    let first = response.chunk().await.expect("read").expect("a chunk");
    assert!(!first.is_empty());
    // No line while the answer is still being sent: its size is not known yet.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(access_lines(&gateway).is_empty(), "{}", gateway.log());
    drop(response);
    let line = access_line(&gateway, 0).await;
    assert_eq!(line["status"], 200);
    let sent = line["bytes_sent"].as_u64().expect("bytes_sent");
    assert!((1000..100_000).contains(&sent), "{line}");
}
