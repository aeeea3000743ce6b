//! The consumers' admin API: settings and keys set through one gateway's admin listener reach
//! another's within a second, requests that name unknown plans, limits or bad overrides are refused with the
//! name, a key is shown once and only its digest is kept, changes need the token, fail with 503 while Redis is
//! down, and each is an audit line naming who made it.

mod common;

use std::time::Duration;

use common::binary::Tollgate;
use common::http_client::{client, json_answer, status_with_key};
use common::redis::RedisServer;
use common::{eventually, serve_admin, start_gateway};
use serde_json::{json, Value};
use tollgate::consumers::api_key_digest;

const TOKEN: &str = "admin-s3cret";
const ONE_SECOND: Duration = Duration::from_secs(1);

fn yaml(store: &str) -> String {
    format!(
        r#"store:
{store}consumers:
  identify:
    - api_key: {{ header: x-api-key }}
  keys:
    - {{ key: static-key, consumer: acme, plan: free }}
  plans:
    free:
      limits:
        - {{ name: hourly, key: consumer, algorithm: gcra, rate: 10/1h, burst: 3 }}
    pro:
      limits:
        - {{ name: hourly, key: consumer, algorithm: gcra, rate: 100/1h, burst: 20 }}
        - {{ name: daily, key: consumer, algorithm: fixed_window, limit: 1000, period: 1d }}
        - {{ name: per-ip, key: [consumer, ip], algorithm: fixed_window, limit: 50, period: 1h }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    respond: {{ status: 200, body: "ok" }}
"#
    )
}

/// The suite's Redis store settings: a time budget a loaded machine keeps, and 503 rather than a silent
/// in-process decision should it not (a request decided by the fallback is not counted in Redis).
fn redis_store(redis: &RedisServer) -> String {
    common::store_yaml(Some(redis))
}

async fn call(request: reqwest::RequestBuilder) -> (u16, Value) {
    json_answer(request.header("authorization", format!("Bearer {TOKEN}"))).await
}

#[tokio::test]
async fn settings_put_through_one_gateway_are_read_through_another_within_a_second() {
    let redis = RedisServer::start();
    let yaml = yaml(&redis_store(&redis));
    let (one, other) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
    let (admin_one, admin_other) = (
        serve_admin(&one, Some(TOKEN)).await,
        serve_admin(&other, Some(TOKEN)).await,
    );
    let http = client();
    let settings = json!({"plan": "pro", "overrides": {"hourly": {"rate": "200/1h", "burst": 40}}});
    let (status, body) = call(
        http.put(format!("{admin_one}/consumers/acme"))
            .body(settings.to_string()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["created"], true);
    assert_eq!(body["settings"]["plan"], "pro");

    let seen = eventually(ONE_SECOND, async || {
        let (_, body) = call(http.get(format!("{admin_other}/consumers/acme"))).await;
        body["settings"]["plan"] == "pro"
    })
    .await;
    assert!(seen.is_some(), "the other gateway never saw the settings");
    let (status, body) = call(http.get(format!("{admin_other}/consumers/acme"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["plan"], "pro");
    let limits = body["limits"].as_array().expect("limits");
    assert_eq!(limits.len(), 3, "{body}");
    // The override's burst is the capacity, at the key every route shares; nothing consumed by reading.
    assert_eq!(limits[0]["name"], "hourly");
    assert_eq!(limits[0]["overridden"], true);
    assert_eq!(limits[0]["capacity"], 40);
    assert_eq!(limits[0]["remaining"], 40);
    assert_eq!(limits[0]["store_key"], "tollgate:consumer:hourly:{acme}");
    assert_eq!(limits[1]["overridden"], false);
    assert_eq!(limits[1]["capacity"], 1000);
    // Keyed per request too: named, no state.
    assert_eq!(limits[2]["keyed_by"], "consumer+ip", "{body}");
    assert!(limits[2].get("remaining").is_none());

    let (status, body) = call(http.delete(format!("{admin_other}/consumers/acme"))).await;
    assert_eq!((status, &body["deleted"]), (200, &json!(true)), "{body}");
    let gone = eventually(ONE_SECOND, async || {
        let (_, body) = call(http.get(format!("{admin_one}/consumers/acme"))).await;
        body["settings"].is_null()
    })
    .await;
    assert!(
        gone.is_some(),
        "the deletion never reached the first gateway"
    );
    let (status, body) = call(http.delete(format!("{admin_one}/consumers/acme"))).await;
    assert_eq!((status, &body["error"]), (404, &json!("unknown_consumer")));
}

/// The status of GET /api through `gateway` with `x-api-key: key`.
async fn api_status(gateway: &common::TestGateway, key: &str) -> u16 {
    status_with_key(gateway.url("/api"), key).await
}

#[tokio::test]
async fn admin_changes_through_one_gateway_change_the_others_answers_within_a_second() {
    let redis = RedisServer::start();
    let yaml = yaml(&redis_store(&redis));
    let (one, other) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
    let admin = serve_admin(&one, Some(TOKEN)).await;
    let http = client();
    assert_eq!(api_status(&other, "static-key").await, 200);

    let blocked = json!({"blocked": true}).to_string();
    let (status, _) = call(http.put(format!("{admin}/consumers/acme")).body(blocked)).await;
    assert_eq!(status, 200);
    assert!(
        eventually(ONE_SECOND, async || api_status(&other, "static-key").await
            == 403)
        .await
        .is_some(),
        "the block did not reach the other gateway"
    );

    let (status, issued) = call(http.post(format!("{admin}/consumers/globex/keys"))).await;
    assert_eq!(status, 201);
    let key = issued["key"].as_str().expect("key").to_owned();
    assert!(
        eventually(ONE_SECOND, async || api_status(&other, &key).await == 200)
            .await
            .is_some(),
        "the issued key was not accepted by the other gateway"
    );
    let key_id = issued["id"].as_str().expect("id");
    let (status, _) = call(http.delete(format!("{admin}/consumers/globex/keys/{key_id}"))).await;
    assert_eq!(status, 200);
    assert!(
        eventually(ONE_SECOND, async || api_status(&other, &key).await == 401)
            .await
            .is_some(),
        "the revoked key still works on the other gateway"
    );
}

#[tokio::test]
async fn a_key_is_shown_once_kept_as_a_digest_and_revoked_everywhere() {
    let redis = RedisServer::start();
    let yaml = yaml(&redis_store(&redis));
    let (one, other) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
    let admin_one = serve_admin(&one, Some(TOKEN)).await;
    let http = client();

    let response = http
        .post(format!("{admin_one}/consumers/globex/keys"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("post");
    assert_eq!(response.status().as_u16(), 201);
    assert_eq!(
        response
            .headers()
            .get("cache-control")
            .map(|v| v.as_bytes()),
        Some(&b"no-store"[..])
    );
    let issued: Value =
        serde_json::from_slice(&response.bytes().await.expect("body")).expect("json");
    let key = issued["key"].as_str().expect("key").to_owned();
    let key_id = issued["id"].as_str().expect("id").to_owned();
    assert!(key.starts_with("tg_") && key.len() >= 3 + 64, "{key}");
    let digest = api_key_digest(&key);
    let directory = other
        .gateway
        .consumers()
        .expect("consumers")
        .directory()
        .clone();
    assert!(eventually(ONE_SECOND, async || {
        directory.consumer_of_key(&digest).as_deref() == Some("globex")
    })
    .await
    .is_some());
    // Redis holds the digest, never the key; GET shows neither.
    let stored = redis
        .cli(&["HGET", "tollgate:{consumers}", "globex"])
        .expect("record");
    assert!(!stored.contains(&key[3..]), "{stored}");
    let (_, shown) = call(http.get(format!("{admin_one}/consumers/globex"))).await;
    assert_eq!(shown["settings"]["keys"][0]["id"], key_id.as_str());
    let text = shown.to_string();
    assert!(
        !text.contains(&key[3..]) && !text.contains("sha256"),
        "{text}"
    );

    let (status, body) =
        call(http.delete(format!("{admin_one}/consumers/globex/keys/{key_id}"))).await;
    assert_eq!((status, &body["revoked"]), (200, &json!(true)), "{body}");
    assert!(
        eventually(ONE_SECOND, async || directory
            .consumer_of_key(&digest)
            .is_none())
        .await
        .is_some(),
        "the revoked key still names its consumer on the other gateway"
    );
    let (status, body) =
        call(http.delete(format!("{admin_one}/consumers/globex/keys/{key_id}"))).await;
    assert_eq!((status, &body["error"]), (404, &json!("unknown_key")));
}

#[tokio::test]
async fn unknown_plans_limits_bad_overrides_and_ids_are_named() {
    let gateway = start_gateway(&yaml("  backend: memory\n")).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let http = client();
    let put = |id: &str, body: Value| {
        http.put(format!("{admin}/consumers/{id}"))
            .body(body.to_string())
    };
    for (id, body, code, named) in [
        ("acme", json!({"plan": "gold"}), "invalid_settings", "gold"),
        (
            "acme",
            json!({"plan": "free", "overrides": {"daily": {"limit": 5}}}),
            "invalid_settings",
            "daily",
        ),
        (
            "acme",
            json!({"overrides": {"monthly": {"limit": 5}}}),
            "invalid_settings",
            "monthly",
        ),
        (
            "acme",
            json!({"plan": "pro", "overrides": {"hourly": {"limit": 5}}}),
            "invalid_settings",
            "limit is not a parameter of gcra",
        ),
        (
            "acme",
            json!({"plan": "pro", "overrides": {"hourly": {"rate": "lots"}}}),
            "invalid_settings",
            "lots",
        ),
        (
            "acme",
            json!({"plan": "pro", "blokced": true}),
            "invalid_body",
            "blokced",
        ),
        (
            "acme",
            json!({"keys": []}),
            "invalid_body",
            "POST /consumers/{id}/keys",
        ),
        (
            "a%20b",
            json!({"plan": "pro"}),
            "invalid_consumer_id",
            "a b",
        ),
        (
            &"x".repeat(129),
            json!({"plan": "pro"}),
            "invalid_consumer_id",
            "128",
        ),
    ] {
        let (status, answer) = call(put(id, body.clone())).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"], code, "{body}: {answer}");
        let detail = answer["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(named), "{body}: {detail}");
    }
    // Nothing was written; ids of every allowed character are fine.
    assert!(gateway
        .gateway
        .consumers()
        .expect("consumers")
        .directory()
        .is_empty());
    let (status, body) = call(put("svc.a_b:c@d-1", json!({"plan": "free"}))).await;
    assert_eq!(status, 200, "{body}");
    // Without a runtime plan, an override must fit the limit of that name in every plan that has one.
    let (status, body) = call(put("bob", json!({"overrides": {"hourly": {"burst": 5}}}))).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = call(put("bob", json!({"overrides": {"daily": {"burst": 5}}}))).await;
    assert_eq!(
        (status, &body["error"]),
        (400, &json!("invalid_settings")),
        "{body}"
    );
    let (status, body) = call(http.get(format!("{admin}/consumers/acme?plan=free"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["limits"][0]["capacity"], 3, "{body}");
    // acme's static key names its plan: shown without asking.
    let (status, body) = call(http.get(format!("{admin}/consumers/acme"))).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["plan"], "free", "{body}");
    assert_eq!(body["limits"][0]["name"], "hourly", "{body}");
}

#[tokio::test]
async fn consumers_need_the_token_and_a_consumers_block() {
    let gateway = start_gateway(&yaml("  backend: memory\n")).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let http = client();
    for request in [
        http.put(format!("{admin}/consumers/acme"))
            .body(json!({"plan": "pro"}).to_string()),
        http.get(format!("{admin}/consumers/acme")),
        http.delete(format!("{admin}/consumers/acme")),
        http.post(format!("{admin}/consumers/acme/keys")),
        http.delete(format!("{admin}/consumers/acme/keys/k_1")),
    ] {
        let response = request.send().await.expect("send");
        assert_eq!(response.status().as_u16(), 401);
    }
    assert!(gateway
        .gateway
        .consumers()
        .expect("consumers")
        .directory()
        .is_empty());

    let plain = start_gateway(
        "routes:\n  - { name: r, match: { path_prefix: / }, respond: { status: 200 } }\n",
    )
    .await;
    assert!(plain.gateway.consumers().is_none());
    let admin = serve_admin(&plain, Some(TOKEN)).await;
    let (status, body) = call(http.get(format!("{admin}/consumers/acme"))).await;
    assert_eq!(
        (status, &body["error"]),
        (404, &json!("consumers_not_configured"))
    );
}

#[tokio::test]
async fn changes_fail_with_503_while_redis_is_down_and_reads_go_on() {
    let mut redis = RedisServer::start();
    let gateway = start_gateway(&yaml(&redis_store(&redis))).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let http = client();
    let directory = gateway
        .gateway
        .consumers()
        .expect("consumers")
        .directory()
        .clone();
    assert!(
        eventually(Duration::from_secs(10), async || directory.synced())
            .await
            .is_some()
    );
    let (status, _) = call(
        http.put(format!("{admin}/consumers/acme"))
            .body(json!({"plan": "pro"}).to_string()),
    )
    .await;
    assert_eq!(status, 200);

    redis.kill();
    let (status, body) = call(
        http.put(format!("{admin}/consumers/acme"))
            .body(json!({"plan": "free"}).to_string()),
    )
    .await;
    assert_eq!(
        (status, &body["error"]),
        (503, &json!("directory_unavailable")),
        "{body}"
    );
    let (status, body) = call(http.post(format!("{admin}/consumers/acme/keys"))).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(
        directory
            .consumer("acme")
            .and_then(|r| r.plan.clone())
            .as_deref(),
        Some("pro")
    );
}

#[tokio::test]
async fn each_change_is_an_audit_line_naming_the_admin_client_and_never_the_key() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    let config = format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0, token: {TOKEN} }}\n{}",
        yaml("  backend: memory\n")
    );
    std::fs::write(&path, config).expect("write config");
    let mut command = Tollgate::command(&path);
    command
        .args(["--log-format", "json"])
        .env("RUST_LOG", "info");
    let tollgate = Tollgate::spawn(command);
    let admin = format!("http://{}", tollgate.admin);
    let http = client();
    let (status, _) = call(
        http.put(format!("{admin}/consumers/acme"))
            .body(json!({"plan": "pro"}).to_string()),
    )
    .await;
    assert_eq!(status, 200);
    let (status, issued) = call(http.post(format!("{admin}/consumers/acme/keys"))).await;
    assert_eq!(status, 201);
    let key = issued["key"].as_str().expect("key").to_owned();

    let audit_lines = || -> Vec<Value> {
        tollgate
            .log()
            .lines()
            .filter(|line| line.contains("tollgate::audit"))
            .map(|line| serde_json::from_str(line).expect("json line"))
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(10), async || audit_lines().len() == 2)
            .await
            .is_some(),
        "one audit line per change:\n{}",
        tollgate.log()
    );
    let logged = audit_lines();
    let put = &logged[0]["fields"];
    assert_eq!(logged[0]["level"], "INFO");
    assert_eq!(put["what"], "consumer.put");
    assert_eq!(put["consumer"], "acme");
    assert_eq!(put["before"], "null");
    assert_eq!(put["after"], r#"{"plan":"pro","blocked":false}"#);
    // The client's address as the gateway saw it: loopback, and a port of the client's.
    let who: std::net::SocketAddr = put["who"]
        .as_str()
        .expect("who")
        .parse()
        .expect("an address");
    assert!(
        who.ip().is_loopback() && who.port() != tollgate.admin.port(),
        "{who}"
    );
    let added = &logged[1]["fields"];
    assert_eq!(added["what"], "key.add");
    let after = added["after"].as_str().expect("after");
    assert!(after.contains(&tollgate::consumers::digest_hex(&api_key_digest(&key))));
    assert!(
        !tollgate.log().contains(&key[3..]),
        "the key itself was logged"
    );
}

#[tokio::test]
async fn a_plan_limits_state_is_read_and_reset_for_every_instance() {
    for redis in [true, false] {
        let redis = redis.then(RedisServer::start);
        let store = redis
            .as_ref()
            .map_or_else(|| "  backend: memory\n".to_owned(), redis_store);
        let yaml = yaml(&store);
        let gateways = common::gateways_sharing(&yaml, redis.as_ref()).await;
        let admin = serve_admin(&gateways[0], Some(TOKEN)).await;
        let http = client();
        let what = if redis.is_some() { "redis" } else { "memory" };
        // acme's static key is on free: a burst of 3, then refused by every instance (which remembers it).
        for i in 0..3 {
            assert_eq!(
                api_status(&gateways[i % gateways.len()], "static-key").await,
                200
            );
        }
        for gateway in &gateways {
            assert_eq!(api_status(gateway, "static-key").await, 429, "{what}");
        }
        let state = format!("{admin}/consumers/acme/limits/hourly");
        let (status, body) = call(http.get(&state)).await;
        assert_eq!(status, 200, "{what}: {body}");
        assert_eq!(body["plan"], "free", "{body}");
        assert_eq!(
            body["limit"]["store_key"],
            "tollgate:consumer:hourly:{acme}"
        );
        assert_eq!(body["limit"]["capacity"], 3, "{body}");
        assert_eq!(body["limit"]["remaining"], 0, "{body}");
        assert_eq!(body["limit"]["would_admit"], false, "{body}");

        let (status, body) = call(http.delete(&state)).await;
        assert_eq!(status, 200, "{what}: {body}");
        assert_eq!(
            (&body["reset"], &body["existed"]),
            (&json!(true), &json!(true))
        );
        let (_, body) = call(http.get(&state)).await;
        assert_eq!(body["limit"]["remaining"], 3, "{what}: {body}");
        // Every instance forgets its refusal: the key admits again wherever it goes.
        for (i, gateway) in gateways.iter().enumerate() {
            let admitted = eventually(ONE_SECOND, async || {
                api_status(gateway, "static-key").await == 200
            })
            .await;
            assert!(admitted.is_some(), "{what}: gateway {i} still refuses");
        }

        // What cannot be read or reset is named.
        for (path, status, code) in [
            ("acme/limits/monthly", 404, "unknown_limit"),
            ("nobody/limits/hourly", 404, "no_plan"),
            ("nobody/limits/hourly?plan=gold", 400, "unknown_plan"),
        ] {
            let (got, body) = call(http.get(format!("{admin}/consumers/{path}"))).await;
            assert_eq!((got, &body["error"]), (status, &json!(code)), "{path}");
        }
        let per_request = format!("{admin}/consumers/acme/limits/per-ip?plan=pro");
        let (status, body) = call(http.delete(&per_request)).await;
        assert_eq!(
            (status, &body["error"]),
            (400, &json!("not_per_consumer")),
            "{body}"
        );
        let (status, body) = call(http.get(&per_request)).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["limit"]["keyed_by"], "consumer+ip", "{body}");
        let anonymous = client().delete(&state).send().await.expect("send");
        assert_eq!(anonymous.status(), 401);
    }
}

#[tokio::test]
async fn overrides_are_bounded_as_config_values_are() {
    let gateway = start_gateway(&yaml("  backend: memory\n")).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let http = client();
    let daily = "{ name: daily, key: consumer, algorithm: fixed_window, limit: 1000, period: 1d }";
    let hourly = "{ name: hourly, key: consumer, algorithm: gcra, rate: 100/1h, burst: 20 }";
    // Each override, and the same values written in the config: one is refused exactly when the other is.
    let cases = [
        (
            "daily",
            json!({"period": "99999999d"}),
            daily.replace("period: 1d", "period: 99999999d"),
        ),
        (
            "daily",
            json!({"period": "7d"}),
            daily.replace("period: 1d", "period: 7d"),
        ),
        (
            "daily",
            json!({"limit": 1u64 << 60}),
            daily.replace("limit: 1000", &format!("limit: {}", 1u64 << 60)),
        ),
        (
            "hourly",
            json!({"burst": 1u64 << 53}),
            hourly.replace("burst: 20", &format!("burst: {}", 1u64 << 53)),
        ),
        (
            "hourly",
            json!({"rate": "100/99999999d"}),
            hourly.replace("rate: 100/1h", "rate: 100/99999999d"),
        ),
        (
            "hourly",
            json!({"rate": "7/1h", "burst": 7}),
            hourly.replace("rate: 100/1h, burst: 20", "rate: 7/1h, burst: 7"),
        ),
    ];
    let base = yaml("  backend: memory\n");
    let mut refused = 0;
    for (limit, change, written) in cases {
        let original = if limit == "daily" { daily } else { hourly };
        let config = base.replace(original, &written);
        assert_ne!(config, base, "{written}");
        let config_ok = tollgate::config::parse(&config, std::path::Path::new("test.yaml")).is_ok();
        let body = json!({"plan": "pro", "overrides": {limit: change}});
        let (status, answer) = call(
            http.put(format!("{admin}/consumers/acme"))
                .body(body.to_string()),
        )
        .await;
        let expected = if config_ok { 200 } else { 400 };
        assert_eq!(
            status, expected,
            "{body}: {answer} (config valid: {config_ok})"
        );
        if !config_ok {
            refused += 1;
            assert_eq!(answer["error"], "invalid_settings", "{answer}");
            let detail = answer["detail"].as_str().unwrap_or_default();
            assert!(detail.contains(limit), "{detail}");
        }
    }
    // A burst of 2^53 and a period of 99999999d are beyond what both stores carry exactly, in the config as in
    // an override (the period once left a consumer refused for 8.6e12 s).
    assert!(refused >= 2, "{refused}");
    let body = json!({"plan": "pro", "overrides": {"daily": {"period": "99999999d"}}});
    let (status, answer) = call(
        http.put(format!("{admin}/consumers/acme"))
            .body(body.to_string()),
    )
    .await;
    assert_eq!(
        (status, &answer["error"]),
        (400, &json!("invalid_settings")),
        "{answer}"
    );
}

#[tokio::test]
async fn a_flushed_directory_is_one_warning_a_count_and_is_reseeded_from_its_listing() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("gateway.yaml");
    let config = format!(
        "listen: 127.0.0.1:0\nadmin: {{ listen: 127.0.0.1:0, token: {TOKEN} }}\n{}",
        yaml(&redis_store(&redis))
    );
    std::fs::write(&path, config).expect("write config");
    let mut command = Tollgate::command(&path);
    command.env("RUST_LOG", "warn");
    let tollgate = Tollgate::spawn(command);
    let admin = format!("http://{}", tollgate.admin);
    let http = client();
    let through = |key: String| {
        let url = tollgate.url("/api");
        async move { status_with_key(url, &key).await }
    };
    // Three consumers, one with a key; listed two to a page, whole, digests and no keys.
    for id in ["acme", "globex", "initech"] {
        let body = json!({"plan": "pro", "overrides": {"hourly": {"burst": 30}}});
        let (status, _) = call(
            http.put(format!("{admin}/consumers/{id}"))
                .body(body.to_string()),
        )
        .await;
        assert_eq!(status, 200);
    }
    let (_, issued) = call(http.post(format!("{admin}/consumers/globex/keys"))).await;
    let key = issued["key"].as_str().expect("key").to_owned();
    assert_eq!(through(key.clone()).await, 200);
    let mut listed = Vec::new();
    let mut after = String::new();
    loop {
        let (status, page) =
            call(http.get(format!("{admin}/consumers?limit=2&after={after}"))).await;
        assert_eq!(status, 200, "{page}");
        assert_eq!(page["total"], 3, "{page}");
        listed.extend(page["consumers"].as_array().expect("page").iter().cloned());
        match page["next"].as_str() {
            Some(next) => after = next.to_owned(),
            None => break,
        }
    }
    let ids: Vec<&str> = listed
        .iter()
        .map(|c| c["consumer"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["acme", "globex", "initech"]);
    // A last page that is full says no more follow.
    let (_, whole) = call(http.get(format!("{admin}/consumers?limit=3"))).await;
    assert_eq!(
        whole["consumers"].as_array().map(Vec::len),
        Some(3),
        "{whole}"
    );
    assert!(whole["next"].is_null(), "{whole}");
    let globex = &listed[1]["record"];
    assert_eq!(
        globex["keys"][0]["sha256"],
        tollgate::consumers::digest_hex(&api_key_digest(&key))
    );
    let backup = serde_json::to_string(&listed).expect("json");
    assert!(!backup.contains(&key[3..]), "a key itself is listed");

    // Flushed: every runtime record is gone, said once at WARN and counted.
    redis.cli(&["FLUSHALL"]);
    let warned = || {
        tollgate
            .log()
            .lines()
            .filter(|line| line.contains("WARN") && line.contains("lost its data"))
            .count()
    };
    let noticed = eventually(Duration::from_secs(2), async || warned() == 1).await;
    assert!(noticed.is_some(), "one WARN line:\n{}", tollgate.log());
    let metrics = common::http_client::metrics_text(&admin).await;
    assert!(
        metrics.contains("tollgate_consumer_directory_resets_total 1"),
        "{metrics}"
    );
    assert_eq!(
        through(key.clone()).await,
        401,
        "the flushed key:\n{}",
        tollgate.log()
    );

    // Re-seeded from the listing: the key identifies again, with nothing but its digest.
    for consumer in &listed {
        let id = consumer["consumer"].as_str().expect("id");
        let (status, body) = call(
            http.put(format!("{admin}/consumers/{id}/record"))
                .body(consumer["record"].to_string()),
        )
        .await;
        assert_eq!(status, 200, "{body}");
    }
    assert_eq!(through(key).await, 200);
    let (_, page) = call(http.get(format!("{admin}/consumers"))).await;
    assert_eq!(
        page["consumers"].as_array().map(Vec::len),
        Some(3),
        "{page}"
    );
    assert_eq!(
        page["consumers"][0]["record"]["overrides"]["hourly"]["burst"],
        30
    );
    assert_eq!(warned(), 1, "re-seeding is no loss:\n{}", tollgate.log());
    // A digest that is not one, or another consumer's, is refused.
    let mut bad = globex.clone();
    bad["keys"][0]["sha256"] = json!("beef");
    let (status, body) = call(
        http.put(format!("{admin}/consumers/globex/record"))
            .body(bad.to_string()),
    )
    .await;
    assert_eq!(
        (status, &body["error"]),
        (400, &json!("invalid_keys")),
        "{body}"
    );
    let (status, body) = call(
        http.put(format!("{admin}/consumers/acme/record"))
            .body(globex.to_string()),
    )
    .await;
    assert_eq!(
        (status, &body["error"]),
        (400, &json!("invalid_keys")),
        "{body}"
    );
}

#[tokio::test]
async fn an_import_sets_many_consumers_on_every_instance_and_a_bad_line_sets_none() {
    let redis = RedisServer::start();
    let yaml = yaml(&redis_store(&redis));
    let (one, other) = (start_gateway(&yaml).await, start_gateway(&yaml).await);
    let (admin_one, admin_other) = (
        serve_admin(&one, Some(TOKEN)).await,
        serve_admin(&other, Some(TOKEN)).await,
    );
    let http = client();
    // Both instances ready first: until its Redis connection is up an instance answers 503, not an import.
    for admin in [&admin_one, &admin_other] {
        let ready = eventually(ONE_SECOND * 10, async || {
            call(http.get(format!("{admin}/readyz"))).await.0 == 200
        })
        .await;
        assert!(ready.is_some(), "{admin} never ready");
    }
    let digest = tollgate::consumers::digest_hex(&api_key_digest("tg_imported"));
    let mut body: String = (0..2500)
        .map(|i| format!("{{\"consumer\":\"user-{i}\",\"record\":{{\"plan\":\"pro\"}}}}\n"))
        .collect();
    body.push_str(&format!(
        "\n{{\"consumer\":\"keyed\",\"record\":{{\"plan\":\"free\",\"blocked\":false,\"keys\":[{{\"id\":\"k_1\",\"sha256\":\"{digest}\",\"created_ms\":1}}]}}}}\n"
    ));
    let (status, answer) = call(
        http.post(format!("{admin_one}/consumers:import"))
            .body(body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["imported"], 2501);
    for admin in [&admin_one, &admin_other] {
        let seen = eventually(ONE_SECOND * 2, async || {
            let (_, shown) = call(http.get(format!("{admin}/consumers/user-2499"))).await;
            shown["settings"]["plan"] == "pro"
        })
        .await;
        assert!(seen.is_some(), "{admin} did not read the import");
    }
    // The imported key identifies its consumer on the other instance too.
    let identified = eventually(ONE_SECOND * 2, async || {
        let response = http
            .get(other.url("/api/x"))
            .header("x-api-key", "tg_imported")
            .send()
            .await
            .expect("request");
        response.status() == 200
    })
    .await;
    assert!(identified.is_some());

    // One bad line anywhere: 400 naming it, and nothing of the body is set.
    for (line, code) in [
        (
            r#"{"consumer":"x","record":{"plan":"gold"}}"#,
            "invalid_settings",
        ),
        (
            r#"{"consumer":"bad id","record":{"plan":"pro"}}"#,
            "invalid_consumer_id",
        ),
        (
            r#"{"consumer":"user-0","record":{"plan":"pro"}}"#,
            "duplicate_consumer",
        ),
        (
            r#"{"consumer":"x","record":{"keys":[{"id":"k","sha256":"nothex","created_ms":1}]}}"#,
            "invalid_keys",
        ),
        (
            &format!(
                r#"{{"consumer":"x","record":{{"keys":[{{"id":"k","sha256":"{digest}","created_ms":1}}]}}}}"#
            ),
            "invalid_keys",
        ),
        (
            r#"{"consumer":"x","record":{"plan":"pro"},"extra":1}"#,
            "invalid_body",
        ),
    ] {
        let body =
            format!("{{\"consumer\":\"user-0\",\"record\":{{\"plan\":\"free\"}}}}\n{line}\n");
        let (status, answer) = call(
            http.post(format!("{admin_one}/consumers:import"))
                .body(body),
        )
        .await;
        assert_eq!(status, 400, "{line}: {answer}");
        assert_eq!(answer["error"], code, "{line}: {answer}");
        assert!(answer.to_string().contains("line 2"), "{line}: {answer}");
    }
    let (_, shown) = call(http.get(format!("{admin_one}/consumers/user-0"))).await;
    assert_eq!(shown["settings"]["plan"], "pro");
    // Without the token: 401.
    let response = http
        .post(format!("{admin_one}/consumers:import"))
        .body("{\"consumer\":\"x\",\"record\":{}}\n")
        .send()
        .await
        .expect("request");
    assert_eq!(response.status(), 401);
}

#[tokio::test]
async fn bodies_that_are_arrays_or_name_a_member_twice_and_dot_ids_are_refused() {
    let gateway = start_gateway(&yaml("  backend: memory\n")).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let addr: std::net::SocketAddr = admin
        .trim_start_matches("http://")
        .parse()
        .expect("admin address");
    for (target, body, code) in [
        ("/consumers/acme", r#"["pro", {}, false]"#, "invalid_body"),
        (
            "/consumers/acme",
            r#"{"plan":"pro","plan":"free"}"#,
            "invalid_body",
        ),
        (
            "/consumers/acme",
            r#"{"plan":"pro","overrides":{"hourly":{"burst":1},"hourly":{"burst":900}}}"#,
            "invalid_body",
        ),
        (
            "/consumers/acme/record",
            r#"[null, {}, false, []]"#,
            "invalid_body",
        ),
        ("/consumers/%2E", r#"{"plan":"pro"}"#, "invalid_consumer_id"),
        (
            "/consumers/%2e%2E",
            r#"{"plan":"pro"}"#,
            "invalid_consumer_id",
        ),
    ] {
        // Written by hand: HTTP clients resolve `%2E` segments before sending.
        let request = format!(
            "PUT {target} HTTP/1.1\r\nHost: admin\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        let response = common::http_client::raw(addr, request.as_bytes()).await;
        assert!(
            response.starts_with("HTTP/1.1 400"),
            "{target} {body}: {response}"
        );
        assert!(
            response.contains(&format!("\"{code}\"")),
            "{target} {body}: {response}"
        );
    }
    assert!(gateway
        .gateway
        .consumers()
        .expect("consumers")
        .directory()
        .is_empty());
}

#[tokio::test]
async fn a_directory_larger_than_a_page_is_read_whole_a_page_per_call() {
    let redis = RedisServer::start();
    let yaml = yaml(&redis_store(&redis));
    let one = start_gateway(&yaml).await;
    let admin_one = serve_admin(&one, Some(TOKEN)).await;
    let http = client();
    let body: String = (0..25_000)
        .map(|i| format!("{{\"consumer\":\"user-{i}\",\"record\":{{\"plan\":\"pro\"}}}}\n"))
        .collect();
    let (status, answer) = call(
        http.post(format!("{admin_one}/consumers:import"))
            .body(body),
    )
    .await;
    assert_eq!(status, 200, "{answer}");

    // An instance that starts now reads the 25,000 records in pages (a page is about 2,000), never in one call.
    redis.cli(&["CONFIG", "RESETSTAT"]);
    let other = start_gateway(&yaml).await;
    let admin_other = serve_admin(&other, Some(TOKEN)).await;
    let read = eventually(ONE_SECOND * 5, async || {
        let (_, page) = call(http.get(format!("{admin_other}/consumers?limit=1"))).await;
        page["total"] == 25_000
    })
    .await;
    assert!(
        read.is_some(),
        "the other instance did not read every record"
    );
    for id in ["user-0", "user-12345", "user-24999"] {
        let (_, shown) = call(http.get(format!("{admin_other}/consumers/{id}"))).await;
        assert_eq!(shown["settings"]["plan"], "pro", "{id}: {shown}");
    }
    let stats = redis.cli(&["INFO", "commandstats"]).unwrap_or_default();
    let scans = stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_hscan:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(scans >= 3, "{scans} HSCAN calls:\n{stats}");
    assert!(!stats.contains("cmdstat_hgetall"), "{stats}");
}
