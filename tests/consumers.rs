//! Consumers and plans end to end: API keys naming consumers, plan limits shared across routes and
//! gateway instances, the anonymous plan, 401 / 400 refusals and the forwarded consumer headers; against a real
//! Redis shared by two gateways and against the in-process store, which must decide alike.

mod common;

use common::http_client::{client, metrics_text};
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::{gateways_sharing, serve_admin, store_yaml, TestGateway};
use std::time::Duration;

use serde_json::Value;

/// Plan limits are `sliding_log`: exact over any hour, so that no test's count can straddle a window's edge.
/// A config with two routes on one upstream (`/a` optional, `/b` optional, `/private` required), keys for a `pro`
/// and a `free` consumer, an anonymous plan, and forwarded consumer headers.
fn gateway_yaml(store: &str, upstream: &str) -> String {
    format!(
        r#"listen: 127.0.0.1:0
store:
{store}upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
    - api_key: {{ query: api_key }}
  keys:
    - {{ key: pro-key-1, consumer: acme, plan: pro }}
    - {{ key: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", consumer: bob, plan: free }}
  anonymous: {{ plan: anonymous }}
  forward: {{ consumer: X-Consumer-Id, plan: X-Consumer-Plan }}
  plans:
    anonymous:
      limits:
        - {{ name: per-ip, key: ip, algorithm: sliding_log, limit: 2, period: 1h }}
    free:
      limits:
        - {{ name: hourly, key: consumer, algorithm: sliding_log, limit: 3, period: 1h }}
    pro:
      limits:
        - {{ name: hourly, key: consumer, algorithm: sliding_log, limit: 6, period: 1h }}
routes:
  - name: a
    match: {{ path_prefix: /a }}
    upstream: backend
    limits:
      - {{ name: route-wide, key: route, algorithm: fixed_window, limit: 1000, period: 1h }}
  - name: b
    match: {{ path_prefix: /b }}
    upstream: backend
  - name: private
    match: {{ path_prefix: /private }}
    upstream: backend
    consumers: required
"#
    )
}

/// Gateways sharing one store: two on one Redis, or one on the in-process store.
struct Setup {
    gateways: Vec<TestGateway>,
    upstream: Upstream,
    _redis: Option<RedisServer>,
}

async fn setup(redis: bool) -> Setup {
    let upstream = Upstream::start().await;
    let redis = redis.then(RedisServer::start);
    let yaml = gateway_yaml(&store_yaml(redis.as_ref()), &upstream.url());
    let gateways = gateways_sharing(&yaml, redis.as_ref()).await;
    Setup {
        gateways,
        upstream,
        _redis: redis,
    }
}

impl Setup {
    /// The `i`th request's URL for `path`: requests alternate between the gateways.
    fn url(&self, i: usize, path: &str) -> String {
        self.gateways[i % self.gateways.len()].url(path)
    }
}

/// Sends GET `path` with `x-api-key: key` (when given) through the gateways in turn, `count` times, alternating
/// `/a` and `/b` when `path` is `None`; returns the statuses.
async fn statuses(setup: &Setup, key: Option<&str>, count: usize) -> Vec<u16> {
    let http = client();
    let mut statuses = Vec::new();
    for i in 0..count {
        let path = if i % 2 == 0 { "/a/x" } else { "/b/y" };
        let mut request = http.get(setup.url(i, path));
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        statuses.push(request.send().await.expect("send").status().as_u16());
    }
    statuses
}

#[tokio::test]
async fn each_key_gets_its_plans_limits_across_routes_and_gateways() {
    for redis in [true, false] {
        let setup = setup(redis).await;
        let store = if redis { "redis" } else { "memory" };
        // `test` is the key whose digest the config lists for bob (free: 3 an hour).
        let free = statuses(&setup, Some("test"), 5).await;
        assert_eq!(free, [200, 200, 200, 429, 429], "free plan, {store}");
        let pro = statuses(&setup, Some("pro-key-1"), 8).await;
        assert_eq!(
            pro,
            [200, 200, 200, 200, 200, 200, 429, 429],
            "pro plan, {store}"
        );
        let anonymous = statuses(&setup, None, 3).await;
        assert_eq!(anonymous, [200, 200, 429], "anonymous plan, {store}");
    }
}

#[tokio::test]
async fn a_plan_refusal_names_the_plan_limit_and_its_fields() {
    let setup = setup(false).await;
    let http = client();
    let allowed = http
        .get(setup.url(0, "/a/x"))
        .header("x-api-key", "test")
        .send()
        .await
        .expect("send");
    assert_eq!(allowed.status(), 200);
    assert_eq!(
        allowed.headers()["ratelimit-policy"],
        "\"route-wide\";q=1000;w=3600, \"free.hourly\";q=3;w=3600"
    );
    let current = allowed.headers()["ratelimit"].to_str().expect("text");
    assert!(current.starts_with("\"free.hourly\";r=2;t="), "{current}");
    for _ in 0..2 {
        http.get(setup.url(0, "/b/x"))
            .header("x-api-key", "test")
            .send()
            .await
            .expect("send");
    }
    let denied = http
        .get(setup.url(0, "/a/x"))
        .header("x-api-key", "test")
        .send()
        .await
        .expect("send");
    assert_eq!(denied.status(), 429);
    let body: Value = serde_json::from_slice(&denied.bytes().await.expect("body")).expect("json");
    assert_eq!(body["limit"], "free.hourly");
    assert_eq!(body["route"], "a");
}

#[tokio::test]
async fn credentials_that_do_not_verify_are_refused_before_any_limit() {
    let setup = setup(false).await;
    let http = client();
    let unknown = http
        .get(setup.url(0, "/a/x"))
        .header("x-api-key", "not-a-key")
        .send()
        .await
        .expect("send");
    assert_eq!(unknown.status(), 401);
    assert_eq!(
        unknown.headers()["www-authenticate"],
        "ApiKey realm=\"tollgate\", error=\"unknown_key\""
    );
    let body: Value = serde_json::from_slice(&unknown.bytes().await.expect("body")).expect("json");
    assert_eq!(
        body,
        serde_json::json!({"error": "unauthorized", "reason": "unknown_key"})
    );

    // A required route without a credential: 401 with the challenge of every credential accepted.
    let missing = http
        .get(setup.url(0, "/private"))
        .send()
        .await
        .expect("send");
    assert_eq!(missing.status(), 401);
    assert_eq!(
        missing.headers()["www-authenticate"],
        "ApiKey realm=\"tollgate\""
    );
    let with_key = http
        .get(setup.url(0, "/private?api_key=pro-key-1"))
        .send()
        .await
        .expect("send");
    assert_eq!(with_key.status(), 200);

    // The same key twice, in two header lines or two query parameters: which one the upstream reads is a guess.
    let twice = http
        .get(setup.url(0, "/a/x?api_key=pro-key-1&api_key=test"))
        .send()
        .await
        .expect("send");
    assert_eq!(twice.status(), 400);
    let mut request = reqwest::Request::new(
        reqwest::Method::GET,
        setup.url(0, "/a/x").parse().expect("url"),
    );
    request
        .headers_mut()
        .append("x-api-key", "pro-key-1".parse().expect("value"));
    request
        .headers_mut()
        .append("x-api-key", "pro-key-1".parse().expect("value"));
    assert_eq!(http.execute(request).await.expect("send").status(), 400);

    // None of these consumed anything: the anonymous plan still has its 2, the free key its 3.
    assert_eq!(statuses(&setup, None, 3).await, [200, 200, 429]);
    assert_eq!(
        statuses(&setup, Some("test"), 4).await,
        [200, 200, 200, 429]
    );
}

#[tokio::test]
async fn the_upstream_learns_the_caller_from_tollgate_only() {
    let setup = setup(false).await;
    let http = client();
    let echo = |response: reqwest::Response| async move {
        let body: Value =
            serde_json::from_slice(&response.bytes().await.expect("body")).expect("json");
        body["headers"].clone()
    };
    let identified = http
        .get(setup.url(0, "/a/x"))
        .header("x-api-key", "pro-key-1")
        .header("x-consumer-id", "someone-else")
        .header("x-consumer-plan", "enterprise")
        .send()
        .await
        .expect("send");
    let headers = echo(identified).await;
    assert_eq!(headers["x-consumer-id"], "acme");
    assert_eq!(headers["x-consumer-plan"], "pro");

    let anonymous = http
        .get(setup.url(0, "/b/x"))
        .header("x-consumer-id", "acme")
        .send()
        .await
        .expect("send");
    let headers = echo(anonymous).await;
    assert_eq!(
        headers.get("x-consumer-id"),
        None,
        "a client's copy is dropped"
    );
    assert_eq!(headers["x-consumer-plan"], "anonymous");
}

/// `hide_credentials: true` takes the key that named the caller out of the request sent upstream, the header or
/// the query parameter (the rest of the query as sent); an identifier without it forwards its key as before.
#[tokio::test]
async fn a_hidden_credential_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let yaml = gateway_yaml("  backend: memory\n", &upstream.url()).replace(
        r#"    - api_key: { header: x-api-key }
    - api_key: { query: api_key }"#,
        r#"    - api_key: { header: x-api-key, hide_credentials: true }
    - api_key: { query: api_key, hide_credentials: true }
    - api_key: { header: x-shown-key }"#,
    );
    let gateway = common::start_gateway(&yaml).await;
    let http = client();
    let sent = async |target: &str, header: Option<(&str, &str)>| {
        let mut request = http.get(gateway.url(target));
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let response = request.send().await.expect("send");
        assert_eq!(response.status(), 200, "{target}");
        let body = response.bytes().await.expect("body");
        serde_json::from_slice::<Value>(&body).expect("json")
    };
    let echoed = sent("/a/x?keep=1", Some(("x-api-key", "pro-key-1"))).await;
    assert_eq!(echoed["headers"]["x-consumer-id"], "acme");
    assert_eq!(echoed["headers"].get("x-api-key"), None, "{echoed}");
    assert_eq!(echoed["query"], "keep=1");
    for (query, kept) in [
        (
            "a=1&api_key=pro-key-1&b=%41+c;d",
            Value::from("a=1&b=%41+c;d"),
        ),
        ("api_key=pro-key-1", Value::Null),
        ("x=1;API%5Fkey[]=pro-key-1", Value::from("x=1")),
    ] {
        let echoed = sent(&format!("/a/x?{query}"), None).await;
        assert_eq!(echoed["headers"]["x-consumer-id"], "acme", "{query}");
        assert_eq!(echoed["query"], kept, "{query}");
    }
    // Off by default: the upstream still gets the key of an identifier that does not hide it.
    let echoed = sent("/a/x?keep=2", Some(("x-shown-key", "test"))).await;
    assert_eq!(echoed["headers"]["x-consumer-id"], "bob");
    assert_eq!(echoed["headers"]["x-shown-key"], "test");
    assert_eq!(echoed["query"], "keep=2");
}

#[tokio::test]
async fn plan_decisions_are_counted_by_plan_never_by_consumer() {
    // Counters are registered when the config is compiled: the recorder comes first.
    tollgate::telemetry::prometheus().expect("recorder");
    let setup = setup(false).await;
    let admin = serve_admin(&setup.gateways[0], None).await;
    assert_eq!(statuses(&setup, Some("pro-key-1"), 1).await, [200]);
    let text = metrics_text(&admin).await;
    let line = text
        .lines()
        .find(|line| {
            line.starts_with("tollgate_decisions_total")
                && line.contains("route=\"a\"")
                && line.contains("plan=\"pro\"")
                && line.contains("decision=\"allowed\"")
        })
        .unwrap_or_else(|| panic!("no pro decisions in\n{text}"));
    assert!(line.contains("limit=\"hourly\""), "{line}");
    assert!(line.ends_with(" 1"), "{line}");
    assert!(!text.contains("acme"), "a consumer id in the metrics");
}

/// The runtime directory of the `i`th gateway.
fn directory(setup: &Setup, i: usize) -> std::sync::Arc<tollgate::consumers::directory::Directory> {
    let consumers = setup.gateways[i].gateway.consumers().expect("consumers");
    std::sync::Arc::clone(consumers.directory())
}

/// The status of one GET /a/x with `x-api-key: key` through gateway `i`.
async fn status_with_key(setup: &Setup, i: usize, key: &str) -> u16 {
    client()
        .get(setup.gateways[i].url("/a/x"))
        .header("x-api-key", key)
        .send()
        .await
        .expect("send")
        .status()
        .as_u16()
}

/// Waits until every gateway answers `expected` for `key` (each probe may consume from the key's plan).
async fn everywhere(setup: &Setup, key: &str, expected: u16) {
    for i in 0..setup.gateways.len() {
        let seen = common::eventually(Duration::from_secs(1), async || {
            status_with_key(setup, i, key).await == expected
        })
        .await;
        assert!(
            seen.is_some(),
            "gateway {i} never answered {expected} for {key}"
        );
    }
}

#[tokio::test]
async fn runtime_settings_change_plans_block_and_issue_keys_on_every_instance() {
    for redis in [true, false] {
        let setup = setup(redis).await;
        let store = if redis { "redis" } else { "memory" };
        let settings = directory(&setup, 0);
        for i in 0..setup.gateways.len() {
            let directory = directory(&setup, i);
            let synced =
                common::eventually(Duration::from_secs(5), async || directory.synced()).await;
            assert!(synced.is_some(), "gateway {i}'s directory never read Redis");
        }

        // bob's static key says free (3 an hour); the runtime plan wins: pro, 6 an hour, on both gateways.
        let record = serde_json::from_value(serde_json::json!({"plan": "pro"})).expect("record");
        settings.put("bob", record).await.expect("put");
        for i in 0..setup.gateways.len() {
            let directory = directory(&setup, i);
            let arrived = common::eventually(Duration::from_secs(1), async || {
                directory
                    .consumer("bob")
                    .and_then(|r| r.plan.clone())
                    .as_deref()
                    == Some("pro")
            })
            .await;
            assert!(
                arrived.is_some(),
                "gateway {i} never saw bob's plan, {store}"
            );
        }
        let pro = statuses(&setup, Some("test"), 7).await;
        assert_eq!(
            pro,
            [200, 200, 200, 200, 200, 200, 429],
            "pro for bob, {store}"
        );

        // Blocked: 403 everywhere, with no limit asked.
        let record = serde_json::from_value(serde_json::json!({"blocked": true})).expect("record");
        settings.put("acme", record).await.expect("put");
        everywhere(&setup, "pro-key-1", 403).await;
        settings.delete("acme").await.expect("delete");
        everywhere(&setup, "pro-key-1", 200).await;

        // A key issued at runtime names its consumer on every instance, until it is revoked.
        let (issued, key) = settings.add_key("carol").await.expect("key");
        everywhere(&setup, &key, 200).await;
        assert!(settings
            .revoke_key("carol", &issued.id)
            .await
            .expect("revoke"));
        everywhere(&setup, &key, 401).await;
    }
}

#[tokio::test]
async fn an_override_replaces_one_limit_for_one_consumer() {
    let setup = setup(false).await;
    let record = serde_json::from_value(serde_json::json!({
        "plan": "free",
        "overrides": {"hourly": {"limit": 5}},
    }))
    .expect("record");
    directory(&setup, 0).put("bob", record).await.expect("put");
    let response = client()
        .get(setup.url(0, "/a/x"))
        .header("x-api-key", "test")
        .send()
        .await
        .expect("send");
    assert_eq!(
        response.headers()["ratelimit-policy"],
        "\"route-wide\";q=1000;w=3600, \"free.hourly\";q=5;w=3600"
    );
    assert_eq!(response.headers()["x-ratelimit-limit"], "5");
    assert_eq!(
        statuses(&setup, Some("test"), 5).await,
        [200, 200, 200, 200, 429]
    );
    // Changed again: the next request counts against the new parameter, not one compiled before.
    let record = serde_json::from_value(serde_json::json!({
        "plan": "free",
        "overrides": {"hourly": {"limit": 7}},
    }))
    .expect("record");
    directory(&setup, 0).put("bob", record).await.expect("put");
    assert_eq!(statuses(&setup, Some("test"), 3).await, [200, 200, 429]);
    // Another free consumer keeps the plan's own 3.
    let record = serde_json::from_value(serde_json::json!({"plan": "free"})).expect("record");
    directory(&setup, 0).put("acme", record).await.expect("put");
    assert_eq!(
        statuses(&setup, Some("pro-key-1"), 4).await,
        [200, 200, 200, 429]
    );
}

#[tokio::test]
async fn runtime_settings_outlive_a_config_reload_and_follow_its_plans() {
    let setup = setup(false).await;
    let record = serde_json::from_value(serde_json::json!({
        "plan": "pro",
        "overrides": {"hourly": {"limit": 4}},
    }))
    .expect("record");
    directory(&setup, 0).put("bob", record).await.expect("put");
    assert_eq!(statuses(&setup, Some("test"), 1).await, [200]);

    // The same file reloaded: the runtime plan and override still decide (3 left of bob's 4).
    let gateway = &setup.gateways[0].gateway;
    let yaml = gateway_yaml("  backend: memory\n", &setup.upstream.url());
    gateway.reload(&common::config(&yaml));
    assert_eq!(
        statuses(&setup, Some("test"), 4).await,
        [200, 200, 200, 429]
    );

    // A reload that gives pro's hourly limit another name: the override names no limit of the plan any more and
    // is passed over, and the renamed limit starts bob afresh at pro's own 6.
    gateway.reload(&common::config(&yaml.replace(
        "name: hourly, key: consumer, algorithm: sliding_log, limit: 6",
        "name: pro-hourly, key: consumer, algorithm: sliding_log, limit: 6",
    )));
    assert_eq!(
        statuses(&setup, Some("test"), 7).await,
        [200, 200, 200, 200, 200, 200, 429]
    );
}

/// GET /a/x through `gateway` from client `address` (via X-Forwarded-For) with `x-api-key: key`.
async fn from_client(gateway: &TestGateway, address: &str, key: Option<&str>) -> reqwest::Response {
    let mut request = client()
        .get(gateway.url("/a/x"))
        .header("x-forwarded-for", address);
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    request.send().await.expect("send")
}

#[tokio::test]
async fn an_address_past_its_failed_credentials_has_every_credential_refused_unchecked() {
    for redis in [true, false] {
        let upstream = Upstream::start().await;
        let redis = redis.then(RedisServer::start);
        let yaml = gateway_yaml(&store_yaml(redis.as_ref()), &upstream.url()).replace(
            "consumers:\n  identify:",
            "client_ip:\n  trusted_proxies: [127.0.0.1/32]\nconsumers:\n  failed_credentials: { limit: 3, period: 1m }\n  identify:",
        );
        let gateways = gateways_sharing(&yaml, redis.as_ref()).await;
        let store = if redis.is_some() { "redis" } else { "memory" };
        let at = |i: usize| &gateways[i % gateways.len()];
        // Three wrong keys, spread over the instances: 401 each, and each counted for 203.0.113.9.
        for i in 0..3 {
            let status = from_client(at(i), "203.0.113.9", Some("guess"))
                .await
                .status();
            assert_eq!(status, 401, "guess {i}, {store}");
        }
        // The fourth is over the limit, wherever it arrives.
        let refused = from_client(at(3), "203.0.113.9", Some("guess")).await;
        assert_eq!(refused.status(), 429, "{store}");
        let retry_after: u64 = refused.headers()["retry-after"]
            .to_str()
            .expect("text")
            .parse()
            .expect("seconds");
        // A sliding window: at most two periods away.
        assert!((1..=120).contains(&retry_after), "{retry_after}");
        let body: Value =
            serde_json::from_slice(&refused.bytes().await.expect("body")).expect("json");
        assert_eq!(body["error"], "too_many_failed_credentials");
        // From then on, even the right key is not checked, on that instance; without a key the address is an
        // anonymous caller as before; and another address is not concerned.
        let right = from_client(at(3), "203.0.113.9", Some("pro-key-1")).await;
        assert_eq!(right.status(), 429, "a valid key while blocked, {store}");
        let anonymous = from_client(at(3), "203.0.113.9", None).await;
        assert_eq!(anonymous.status(), 200, "{store}");
        let other = from_client(at(3), "198.51.100.7", Some("pro-key-1")).await;
        assert_eq!(other.status(), 200, "{store}");
    }
}

/// Puts `record` (JSON) for `id` through gateway 0 and waits until every gateway holds it.
async fn put_everywhere(setup: &Setup, id: &str, record: Value) {
    let record: tollgate::consumers::directory::ConsumerRecord =
        serde_json::from_value(record).expect("record");
    directory(setup, 0)
        .put(id, record.clone())
        .await
        .expect("put");
    for i in 0..setup.gateways.len() {
        let directory = directory(setup, i);
        let arrived = common::eventually(Duration::from_secs(2), async || {
            directory.consumer(id).as_ref() == Some(&record)
        })
        .await;
        assert!(arrived.is_some(), "gateway {i} never saw {id}'s record");
    }
}

/// GET /a/x with `x-api-key: key` through gateway `i`: the status and `X-RateLimit-Limit`.
async fn decided(setup: &Setup, i: usize, key: &str) -> (u16, String) {
    let response = client()
        .get(setup.gateways[i].url("/a/x"))
        .header("x-api-key", key)
        .send()
        .await
        .expect("send");
    let limit = response.headers()["x-ratelimit-limit"]
        .to_str()
        .expect("text")
        .to_owned();
    (response.status().as_u16(), limit)
}

#[tokio::test]
async fn a_raised_plan_limit_applies_at_once_after_an_override_or_a_plan_change() {
    for redis in [true, false] {
        let setup = setup(redis).await;
        let store = if redis { "redis" } else { "memory" };
        let n = setup.gateways.len();
        // bob (free, 3 an hour) spends his 3; then every instance refuses him and remembers it for twenty minutes.
        assert_eq!(statuses(&setup, Some("test"), 3).await, [200; 3], "{store}");
        for i in 0..n {
            assert_eq!(
                decided(&setup, i, "test").await,
                (429, "3".into()),
                "{store}"
            );
        }
        // An override to 3 + n: one more on each instance, at once.
        let raised = 3 + n as u64;
        put_everywhere(
            &setup,
            "bob",
            serde_json::json!({"plan": "free", "overrides": {"hourly": {"limit": raised}}}),
        )
        .await;
        for i in 0..n {
            let expected = (200, raised.to_string());
            assert_eq!(decided(&setup, i, "test").await, expected, "{store}");
        }
        for i in 0..n {
            let expected = (429, raised.to_string());
            assert_eq!(decided(&setup, i, "test").await, expected, "{store}");
        }
        // A plan change to pro (6 an hour) with the override gone: decided by pro's limit on every instance.
        put_everywhere(&setup, "bob", serde_json::json!({"plan": "pro"})).await;
        let spent = raised;
        for i in 0..n {
            let status = if spent + (i as u64) < 6 { 200 } else { 429 };
            assert_eq!(
                decided(&setup, i, "test").await,
                (status, "6".into()),
                "{store}"
            );
        }
    }
}
