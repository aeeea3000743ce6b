//! What operators see: Prometheus series on the admin listener, readiness that reports the fallback, request ids
//! passed upstream and returned.

mod common;

use common::http_client::{client, metrics_text};
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::{serve_admin, start_gateway};

fn series_value(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn metrics_count_requests_decisions_store_calls_and_fallback() {
    tollgate::telemetry::prometheus().expect("recorder");
    let mut redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = format!(
        r#"store:
  backend: redis
  url: {}
  timeout: 200ms
  on_error: local
upstreams:
  backend:
    targets: ["{}"]
routes:
  - name: metered
    match: {{ path_prefix: /metered }}
    upstream: backend
    limits:
      - name: per-ip
        key: [ip, path]
        algorithm: sliding_log
        limit: 2
        period: 1m
"#,
        redis.url(),
        upstream.url()
    );
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let client = client();
    for _ in 0..5 {
        client.get(gateway.url("/metered")).send().await.unwrap();
    }
    let metrics = client.get(format!("{admin}/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.unwrap();
    assert_eq!(
        series_value(
            &text,
            r#"tollgate_requests_total{route="metered",status="200"}"#
        ),
        Some(2.0),
        "{text}"
    );
    assert_eq!(
        series_value(
            &text,
            r#"tollgate_requests_total{route="metered",status="429"}"#
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        series_value(
            &text,
            r#"tollgate_decisions_total{route="metered",limit="per-ip",decision="allowed"}"#
        ),
        Some(2.0)
    );
    assert_eq!(
        series_value(
            &text,
            r#"tollgate_decisions_total{route="metered",limit="per-ip",decision="denied"}"#
        ),
        Some(3.0),
        "denials answered by the over-limit cache are counted too: {text}"
    );
    assert!(
        text.contains("tollgate_store_duration_seconds_bucket{le=\"0.001\"}"),
        "{text}"
    );
    assert!(
        text.contains("tollgate_upstream_duration_seconds_bucket{route=\"metered\""),
        "{text}"
    );
    assert_eq!(series_value(&text, "tollgate_store_fallback "), Some(0.0));

    redis.kill();
    // Another path is another key: not in the over-limit cache, so Redis is asked, and fails.
    client.get(gateway.url("/metered/x")).send().await.unwrap();
    let text = metrics_text(&admin).await;
    assert_eq!(
        series_value(&text, "tollgate_store_fallback "),
        Some(1.0),
        "{text}"
    );
    assert!(
        series_value(&text, "tollgate_store_errors_total ").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
    let ready = client.get(format!("{admin}/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200, "on_error: local still serves");
    let body: serde_json::Value = serde_json::from_str(&ready.text().await.unwrap()).unwrap();
    assert_eq!(body["status"], "degraded");
    assert_eq!(body["fallback_active"], true);
    assert_eq!(
        client
            .get(format!("{admin}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn request_ids_are_generated_passed_upstream_and_returned() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "upstreams:\n  backend:\n    targets: [\"{}\"]\nroutes:\n  - name: ids\n    match: {{ path_prefix: /ids }}\n    upstream: backend\n",
        upstream.url()
    );
    let gateway = start_gateway(&yaml).await;
    let client = client();

    let response = client.get(gateway.url("/ids")).send().await.unwrap();
    let returned = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(returned.len(), 32);
    assert!(
        returned
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "128 random bits in lower-case hex: {returned}"
    );
    let echo: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(echo["headers"]["x-request-id"], returned.as_str());

    let response = client
        .get(gateway.url("/ids"))
        .header("x-request-id", "client-chosen-42")
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["x-request-id"], "client-chosen-42");
    let echo: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(echo["headers"]["x-request-id"], "client-chosen-42");

    // An id no upstream should be handed (over 200 bytes) is replaced by one made here, upstream and back.
    let response = client
        .get(gateway.url("/ids"))
        .header("x-request-id", "x".repeat(201))
        .send()
        .await
        .unwrap();
    let made = response.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(made.len(), 32, "{made}");
    let echo: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(echo["headers"]["x-request-id"], made.as_str());

    let other = client.get(gateway.url("/ids")).send().await.unwrap();
    assert_ne!(
        other.headers()["x-request-id"].to_str().unwrap(),
        returned,
        "fresh ids"
    );
}

#[tokio::test]
async fn config_reloads_are_counted_by_result() {
    tollgate::telemetry::prometheus().expect("recorder");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.yaml");
    let good =
        "store: { backend: memory }\nroutes:\n  - name: here\n    respond: { status: 200 }\n";
    std::fs::write(&path, good).unwrap();
    let gateway = start_gateway(good).await;
    let admin = serve_admin(&gateway, None).await;
    let counted = |text: &str, result: &str| {
        series_value(
            text,
            &format!(r#"tollgate_config_reloads_total{{result="{result}"}}"#),
        )
        .unwrap_or(0.0)
    };
    let before = metrics_text(&admin).await;

    tollgate::reload::reload(&gateway.gateway, &path).expect("a valid config reloads");
    std::fs::write(
        &path,
        "routes: [ { name: here, respond: { status: 999 } } ]\n",
    )
    .unwrap();
    assert!(tollgate::reload::reload(&gateway.gateway, &path).is_err());

    let after = metrics_text(&admin).await;
    assert_eq!(
        counted(&after, "ok") - counted(&before, "ok"),
        1.0,
        "{after}"
    );
    assert_eq!(
        counted(&after, "error") - counted(&before, "error"),
        1.0,
        "{after}"
    );
}
