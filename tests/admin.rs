//! The admin API: reading a limit's state without consuming, resetting it, and the bearer token that guards both.

mod common;

use common::http_client::client;
use common::redis::RedisServer;
use common::{serve_admin, start_gateway};
use serde_json::Value;

const TOKEN: &str = "s3cret-admin-token";

fn yaml(redis: Option<&RedisServer>) -> String {
    let store = match redis {
        Some(r) => format!(
            "  backend: redis\n  url: {}\n  timeout: 500ms\n  on_error: deny\n",
            r.url()
        ),
        None => "  backend: memory\n".to_owned(),
    };
    format!(
        r#"store:
{store}routes:
  - name: demo
    match: {{ path_prefix: /demo }}
    respond: {{ status: 200 }}
    limits:
      - name: per-ip
        key: ip
        algorithm: sliding_log
        limit: 3
        period: 1m
"#
    )
}

async fn get_json(request: reqwest::RequestBuilder) -> (u16, Value) {
    let response = request.send().await.expect("admin request");
    let status = response.status().as_u16();
    let body = serde_json::from_str(&response.text().await.expect("body")).unwrap_or(Value::Null);
    (status, body)
}

#[tokio::test]
async fn peek_reads_without_consuming_and_delete_resets() {
    for redis in [Some(RedisServer::start()), None] {
        let gateway = start_gateway(&yaml(redis.as_ref())).await;
        let admin = serve_admin(&gateway, Some(TOKEN)).await;
        let client = client();
        let limit_url = format!("{admin}/limits/demo/per-ip?key=127.0.0.1");
        for _ in 0..2 {
            client.get(gateway.url("/demo")).send().await.unwrap();
        }
        for _ in 0..3 {
            let (status, body) = get_json(client.get(&limit_url).bearer_auth(TOKEN)).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["remaining"], 1, "peeking consumes nothing: {body}");
            assert_eq!(body["capacity"], 3);
            assert_eq!(body["would_admit"], true);
            assert_eq!(body["algorithm"], "sliding_log");
            assert_eq!(body["store_key"], "tollgate:demo:per-ip:{127.0.0.1}");
        }
        client.get(gateway.url("/demo")).send().await.unwrap();
        assert_eq!(
            client
                .get(gateway.url("/demo"))
                .send()
                .await
                .unwrap()
                .status(),
            429
        );
        let (_, body) = get_json(client.get(&limit_url).bearer_auth(TOKEN)).await;
        assert_eq!(body["would_admit"], false);
        assert!(body["retry_after_ms"].as_u64().unwrap() > 50_000, "{body}");

        let (status, body) = get_json(client.delete(&limit_url).bearer_auth(TOKEN)).await;
        assert_eq!(status, 200);
        assert_eq!(body["existed"], true);
        assert_eq!(
            client
                .get(gateway.url("/demo"))
                .send()
                .await
                .unwrap()
                .status(),
            200,
            "reset: admitted again"
        );
        if let Some(redis) = &redis {
            assert_eq!(
                redis
                    .cli(&["ZCARD", "tollgate:demo:per-ip:{127.0.0.1}"])
                    .as_deref(),
                Some("1")
            );
        }
    }
}

#[tokio::test]
async fn limits_api_requires_the_token_when_one_is_set() {
    let gateway = start_gateway(&yaml(None)).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let client = client();
    let url = format!("{admin}/limits/demo/per-ip?key=1.2.3.4");
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    assert_eq!(client.delete(&url).send().await.unwrap().status(), 401);
    assert_eq!(
        client
            .get(&url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        client
            .get(&url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Probes and scrapers need no token.
    assert_eq!(
        client
            .get(format!("{admin}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{admin}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn unknown_routes_limits_and_missing_keys_are_named() {
    let gateway = start_gateway(&yaml(None)).await;
    let admin = serve_admin(&gateway, None).await;
    let client = client();
    let (status, body) = get_json(client.get(format!("{admin}/limits/nope/per-ip?key=x"))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_route"))
    );
    let (status, body) = get_json(client.get(format!("{admin}/limits/demo/nope?key=x"))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_limit"))
    );
    let (status, body) = get_json(client.get(format!("{admin}/limits/demo/per-ip"))).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("missing_key")));
}
