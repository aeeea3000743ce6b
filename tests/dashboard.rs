//! What the admin listener shows an operator live: `GET /stats` on the running binary (decisions per second by
//! route and limit, responses, the store), behind the admin token.

mod common;

use std::time::Duration;

use common::binary::Tollgate;
use common::http_client::{client, json_answer};
use serde_json::Value;

const TOKEN: &str = "dashboard-test-token-0123456789";

fn start(dir: &tempfile::TempDir) -> Tollgate {
    let path = dir.path().join("gateway.yaml");
    let yaml = format!(
        r#"listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0, token: {TOKEN} }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per_ip, key: ip, algorithm: fixed_window, limit: 5, period: 1h }}
      - {{ name: trial, key: ip, algorithm: fixed_window, limit: 1, period: 1h, shadow: true }}
"#
    );
    std::fs::write(&path, yaml).expect("write config");
    Tollgate::run(&path)
}

async fn stats(tollgate: &Tollgate) -> Value {
    let (status, body) = json_answer(
        client()
            .get(tollgate.admin_url("/stats"))
            .header("authorization", format!("Bearer {TOKEN}")),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn send(tollgate: &Tollgate, requests: usize) {
    for _ in 0..requests {
        client()
            .get(tollgate.url("/api"))
            .send()
            .await
            .expect("request");
    }
}

fn limit<'a>(stats: &'a Value, name: &str) -> &'a Value {
    stats["decisions"]
        .as_array()
        .and_then(|all| {
            all.iter()
                .find(|d| d["route"] == "api" && d["limit"] == name)
        })
        .unwrap_or_else(|| panic!("no api/{name} in {stats}"))
}

#[tokio::test]
async fn stats_give_decisions_per_second_by_route_and_limit_and_the_store_s_state() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start(&dir);
    let (status, _) = json_answer(client().get(tollgate.admin_url("/stats"))).await;
    assert_eq!(status, 401, "the stats need the admin token");

    stats(&tollgate).await;
    send(&tollgate, 20).await;
    // Rates are differences between samples, taken at most once a second.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let after = stats(&tollgate).await;
    let per_ip = limit(&after, "per_ip");
    let per_second = |field: &str| per_ip[field].as_f64().unwrap_or_default();
    assert!(per_second("allowed_per_second") > 0.0, "{per_ip}");
    // 15 of the 20 denied by per_ip: three times the 5 allowed, whatever the interval was.
    let ratio = per_second("denied_per_second") / per_second("allowed_per_second");
    assert!((ratio - 3.0).abs() < 1e-6, "{per_ip}");
    assert_eq!(
        per_ip["history"]["denied"].as_array().map(Vec::len),
        Some(1)
    );
    let trial = limit(&after, "trial");
    assert!(
        trial["shadow_denied_per_second"]
            .as_f64()
            .unwrap_or_default()
            > 0.0,
        "{trial}"
    );
    assert!(
        after["requests_per_second"]["api"]
            .as_f64()
            .unwrap_or_default()
            > 0.0,
        "{after}"
    );
    assert_eq!(after["store"]["readiness"]["store"], "memory", "{after}");
    assert_eq!(after["store"]["fallback_active"], false, "{after}");

    // A quiet second: the rates fall to zero, the history keeps the burst.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let quiet = stats(&tollgate).await;
    let per_ip = limit(&quiet, "per_ip");
    assert_eq!(per_ip["denied_per_second"], 0.0, "{per_ip}");
    assert_eq!(
        per_ip["history"]["denied"].as_array().map(Vec::len),
        Some(2)
    );
}
