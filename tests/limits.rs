//! End-to-end limiting: exact admission counts, headers, keys, shared state, run against a real Redis and against
//! the in-process store, which must give the same answers.

mod common;

use common::config_builder::ConfigBuilder;
use common::http_client::client;
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::{count, serve_admin, start_gateway, store_yaml, TestGateway};

/// The two stores every test runs against.
#[derive(Debug, Clone, Copy)]
enum Store {
    Redis,
    Memory,
}

const STORES: [Store; 2] = [Store::Redis, Store::Memory];

/// A gateway with one upstream route `/api` carrying `limits` (YAML list items, indented by 6 spaces), plus
/// `trusted_proxies`. Holds the Redis server (if any) alive as long as the gateway.
struct Setup {
    gateway: TestGateway,
    upstream: Upstream,
    _redis: Option<RedisServer>,
}

async fn setup(store: Store, trusted: &str, limits: &str) -> Setup {
    let upstream = Upstream::start().await;
    let redis = matches!(store, Store::Redis).then(RedisServer::start);
    let yaml = gateway_yaml(store_yaml(redis.as_ref()), trusted, &upstream.url(), limits);
    let gateway = start_gateway(&yaml).await;
    Setup {
        gateway,
        upstream,
        _redis: redis,
    }
}

fn gateway_yaml(store: String, trusted: &str, upstream: &str, limits: &str) -> String {
    ConfigBuilder::new()
        .store_yaml(&store)
        .top(&format!("client_ip:\n  trusted_proxies: [{trusted}]\n"))
        .upstream("backend", upstream)
        .route("api", "/api")
        .to("backend")
        .limits_yaml(limits)
        .build()
}

/// Sends `n` GETs one after another; returns the statuses.
async fn hammer(url: &str, n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
    let client = client();
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        let mut request = client.get(url);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        statuses.push(request.send().await.expect("request").status().as_u16());
    }
    statuses
}

const PER_IP_LOG_5: &str = "      - name: per-ip\n        key: ip\n        algorithm: sliding_log\n        limit: 5\n        period: 1m\n";

#[tokio::test]
async fn sliding_log_admits_exactly_its_limit() {
    for store in STORES {
        let s = setup(store, "", PER_IP_LOG_5).await;
        let statuses = hammer(&s.gateway.url("/api/items"), 20, &[]).await;
        assert_eq!(count(&statuses, 200), 5, "{store:?}: {statuses:?}");
        assert_eq!(count(&statuses, 429), 15, "{store:?}");
        assert_eq!(
            s.upstream.hits(),
            5,
            "{store:?}: denied requests must not reach the upstream"
        );
    }
}

#[tokio::test]
async fn sliding_window_admits_exactly_its_limit() {
    // A window of 20000 days (2024-10-04 to 2079-07-08 on Redis's clock): none ends during the test.
    let limits = "      - name: per-ip\n        key: ip\n        algorithm: sliding_window\n        limit: 10\n        period: 20000d\n";
    for store in STORES {
        let s = setup(store, "", limits).await;
        let statuses = hammer(&s.gateway.url("/api"), 25, &[]).await;
        assert_eq!(count(&statuses, 200), 10, "{store:?}: {statuses:?}");
        assert_eq!(s.upstream.hits(), 10, "{store:?}");
    }
}

#[tokio::test]
async fn token_bucket_admits_its_burst() {
    let limits = "      - name: per-ip\n        key: ip\n        algorithm: token_bucket\n        rate: 1/1h\n        burst: 3\n";
    for store in STORES {
        let s = setup(store, "", limits).await;
        let statuses = hammer(&s.gateway.url("/api"), 10, &[]).await;
        assert_eq!(count(&statuses, 200), 3, "{store:?}: {statuses:?}");
    }
}

#[tokio::test]
async fn denied_response_carries_retry_after_and_rate_limit_headers() {
    for store in STORES {
        let s = setup(store, "", PER_IP_LOG_5).await;
        let client = client();
        let first = client
            .get(s.gateway.url("/api"))
            .send()
            .await
            .expect("first");
        assert_eq!(first.status(), 200);
        assert_eq!(first.headers()["x-ratelimit-limit"], "5");
        assert_eq!(first.headers()["x-ratelimit-remaining"], "4");
        assert_eq!(first.headers()["ratelimit-policy"], "\"per-ip\";q=5;w=60");
        hammer(&s.gateway.url("/api"), 4, &[]).await;

        let denied = client
            .get(s.gateway.url("/api"))
            .send()
            .await
            .expect("denied");
        assert_eq!(denied.status(), 429, "{store:?}");
        let h = denied.headers().clone();
        let retry_after: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
        assert!(
            (58..=60).contains(&retry_after),
            "{store:?}: Retry-After {retry_after}"
        );
        assert_eq!(h["x-ratelimit-limit"], "5");
        assert_eq!(h["x-ratelimit-remaining"], "0");
        let reset: u64 = h["x-ratelimit-reset"].to_str().unwrap().parse().unwrap();
        assert!((58..=60).contains(&reset), "{store:?}: reset {reset}");
        assert_eq!(h["ratelimit-policy"], "\"per-ip\";q=5;w=60");
        assert_eq!(h["ratelimit"], format!("\"per-ip\";r=0;t={reset}").as_str());
        assert_eq!(h["content-type"], "application/json");
        let body: serde_json::Value = serde_json::from_str(&denied.text().await.unwrap()).unwrap();
        assert_eq!(body["error"], "rate_limited");
        assert_eq!(body["route"], "api");
        assert_eq!(body["limit"], "per-ip");
        let retry_ms = body["retry_after_ms"].as_u64().unwrap();
        assert!(
            retry_ms > 57_000 && retry_ms <= 60_000,
            "{store:?}: {retry_ms}"
        );
        assert_eq!(retry_after, retry_ms.div_ceil(1000));
    }
}

#[tokio::test]
async fn header_keys_are_counted_separately() {
    let limits = "      - name: per-key\n        key: [header:x-api-key]\n        missing: skip\n        algorithm: sliding_log\n        limit: 2\n        period: 1m\n";
    for store in STORES {
        let s = setup(store, "", limits).await;
        let url = s.gateway.url("/api");
        let a = hammer(&url, 4, &[("x-api-key", "alpha")]).await;
        let b = hammer(&url, 4, &[("x-api-key", "beta")]).await;
        assert_eq!(count(&a, 200), 2, "{store:?}");
        assert_eq!(count(&b, 200), 2, "{store:?}");
        // `missing: skip`: without the header the limit does not apply.
        let none = hammer(&url, 5, &[]).await;
        assert_eq!(count(&none, 200), 5, "{store:?}");
    }
}

#[tokio::test]
async fn forwarded_for_is_believed_only_from_trusted_proxies() {
    for store in STORES {
        // The test client connects from 127.0.0.1: trusted here, so each X-Forwarded-For is its own client.
        let trusted = setup(store, "127.0.0.1/32", PER_IP_LOG_5).await;
        let url = trusted.gateway.url("/api");
        let one = hammer(&url, 6, &[("x-forwarded-for", "203.0.113.1")]).await;
        let two = hammer(&url, 6, &[("x-forwarded-for", "198.51.100.2, 203.0.113.2")]).await;
        assert_eq!(count(&one, 200), 5, "{store:?}");
        assert_eq!(count(&two, 200), 5, "{store:?}");

        // Untrusted: the header is ignored and both "clients" share the peer's bucket.
        let untrusted = setup(store, "10.0.0.0/8", PER_IP_LOG_5).await;
        let url = untrusted.gateway.url("/api");
        let one = hammer(&url, 6, &[("x-forwarded-for", "203.0.113.1")]).await;
        let two = hammer(&url, 6, &[("x-forwarded-for", "203.0.113.2")]).await;
        assert_eq!(count(&one, 200) + count(&two, 200), 5, "{store:?}");
    }
}

#[tokio::test]
async fn a_denied_request_consumes_from_no_limit() {
    let limits = "      - name: wide
        key: ip
        algorithm: sliding_log
        limit: 10
        period: 1m
      - name: narrow
        key: [header:x-user]
        missing: skip
        algorithm: sliding_log
        limit: 2
        period: 1m
";
    for store in STORES {
        let s = setup(store, "", limits).await;
        let url = s.gateway.url("/api");
        // 2 admitted, 6 refused by `narrow`: `wide` must have lost only 2.
        let statuses = hammer(&url, 8, &[("x-user", "u1")]).await;
        assert_eq!(count(&statuses, 200), 2, "{store:?}");
        let rest = hammer(&url, 10, &[]).await;
        assert_eq!(count(&rest, 200), 8, "{store:?}: {rest:?}");
    }
}

#[tokio::test]
async fn two_gateways_sharing_redis_enforce_one_limit() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let limits = "      - name: global\n        key: route\n        algorithm: sliding_log\n        limit: 10\n        period: 1m\n";
    let yaml = gateway_yaml(store_yaml(Some(&redis)), "", &upstream.url(), limits);
    let a = start_gateway(&yaml).await;
    let b = start_gateway(&yaml).await;
    let client = client();
    let mut admitted = 0;
    for i in 0..30 {
        let gateway = if i % 2 == 0 { &a } else { &b };
        if client
            .get(gateway.url("/api"))
            .send()
            .await
            .unwrap()
            .status()
            == 200
        {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 10);
    assert_eq!(upstream.hits(), 10);
}

#[tokio::test]
async fn redis_keys_follow_the_documented_layout_and_expire() {
    let s = setup(Store::Redis, "", PER_IP_LOG_5).await;
    hammer(&s.gateway.url("/api"), 1, &[]).await;
    let redis = s._redis.as_ref().unwrap();
    // The route's keys (the store's lost-state marker, `tollgate:epoch`, is not one of them).
    let keys = redis.cli(&["KEYS", "tollgate:api:*"]).unwrap();
    assert_eq!(keys, "tollgate:api:per-ip:{127.0.0.1}");
    let ttl: i64 = redis.cli(&["PTTL", &keys]).unwrap().parse().unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "ttl {ttl}");
}

#[tokio::test]
async fn script_is_reloaded_after_redis_forgets_it() {
    // `on_error: deny` in this setup: had the reload failed, the request would get 503.
    let s = setup(Store::Redis, "", PER_IP_LOG_5).await;
    let redis = s._redis.as_ref().unwrap();
    assert_eq!(hammer(&s.gateway.url("/api"), 1, &[]).await, [200]);
    assert_eq!(redis.cli(&["SCRIPT", "FLUSH"]).as_deref(), Some("OK"));
    assert_eq!(hammer(&s.gateway.url("/api"), 1, &[]).await, [200]);
    let keys = redis
        .cli(&["ZCARD", "tollgate:api:per-ip:{127.0.0.1}"])
        .unwrap();
    assert_eq!(keys, "2", "both requests were counted in Redis");
}

#[tokio::test]
async fn allowlisted_clients_skip_the_limits() {
    for store in STORES {
        let upstream = Upstream::start().await;
        let redis = matches!(store, Store::Redis).then(RedisServer::start);
        let base = gateway_yaml(
            store_yaml(redis.as_ref()),
            "127.0.0.1/32",
            &upstream.url(),
            PER_IP_LOG_5,
        );
        let yaml = base.replace(
            "    upstream: backend\n",
            "    upstream: backend\n    allow: [127.0.0.1, 10.0.0.0/8]\n",
        );
        let gateway = start_gateway(&yaml).await;
        let url = gateway.url("/api");
        // The test client is 127.0.0.1: allowlisted.
        let statuses = hammer(&url, 12, &[]).await;
        assert_eq!(count(&statuses, 200), 12, "{store:?}");
        // Through the trusted proxy 127.0.0.1, a client outside the allowlist is limited as usual.
        let outsider = hammer(&url, 7, &[("x-forwarded-for", "203.0.113.50")]).await;
        assert_eq!(count(&outsider, 200), 5, "{store:?}");
        if let Some(redis) = &redis {
            let keys = redis.cli(&["KEYS", "tollgate:api:*"]).unwrap();
            assert_eq!(
                keys, "tollgate:api:per-ip:{203.0.113.50}",
                "allowlisted requests cost Redis nothing"
            );
        }
    }
}

#[tokio::test]
async fn shadow_limits_are_decided_and_counted_but_never_enforced() {
    let limits = "      - name: enforced
        key: ip
        algorithm: sliding_log
        limit: 6
        period: 1m
      - name: trial
        key: ip
        algorithm: sliding_log
        limit: 2
        period: 1m
        shadow: true
      - name: trial-delay
        key: ip
        algorithm: leaky_bucket
        rate: 1/1h
        burst: 1
        mode: delay
        max_delay: 1h
        shadow: true
";
    for store in STORES {
        let s = setup(store, "", limits).await;
        let url = s.gateway.url("/api");
        let started = std::time::Instant::now();
        let client = client();
        let first = client.get(&url).send().await.unwrap();
        assert_eq!(
            first.headers()["ratelimit-policy"],
            "\"enforced\";q=6;w=60",
            "{store:?}: shadow limits are not advertised"
        );
        assert_eq!(first.headers()["x-ratelimit-limit"], "6");
        let rest = hammer(&url, 7, &[]).await;
        // `trial` (2) would have denied from the 3rd request on; only `enforced` (6) does.
        assert_eq!(count(&rest, 200), 5, "{store:?}: {rest:?}");
        assert_eq!(s.upstream.hits(), 6);
        // The shadow leaky bucket in delay mode would hold requests for an hour: nothing is held.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(5),
            "{store:?}"
        );
        if let (Store::Redis, Some(redis)) = (store, &s._redis) {
            let trial = redis
                .cli(&["ZCARD", "tollgate:api:trial:{127.0.0.1}"])
                .unwrap();
            assert_eq!(trial, "2", "a shadow limit consumes only what it admits");
        }
    }
}

#[tokio::test]
async fn a_request_held_by_a_delaying_limit_gives_its_place_back_when_its_client_leaves() {
    // The meter holds the second request for an hour; the window (of 20000 days, which no test outlives) counts
    // every admitted request.
    let limits = "      - name: meter
        key: ip
        algorithm: leaky_bucket
        rate: 1/1h
        burst: 1
        mode: delay
        max_delay: 1h
      - name: counted
        key: ip
        algorithm: fixed_window
        limit: 100
        period: 20000d
";
    for store in STORES {
        let s = setup(store, "", limits).await;
        let admin = serve_admin(&s.gateway, None).await;
        let url = s.gateway.url("/api");
        let first = client().get(&url).send().await.expect("first request");
        assert_eq!(first.status(), 200, "{store:?}");
        // Held: the client gives up after 300 ms, as nginx users expect the queue to move on without it.
        let held = client()
            .get(&url)
            .timeout(std::time::Duration::from_millis(300))
            .send()
            .await;
        assert!(held.is_err(), "{store:?}: the second request was not held");
        let state = |limit: &'static str| {
            let admin = admin.clone();
            async move {
                let body = client()
                    .get(format!("{admin}/limits/api/{limit}?key=127.0.0.1"))
                    .send()
                    .await
                    .expect("admin")
                    .text()
                    .await
                    .expect("body");
                serde_json::from_str::<serde_json::Value>(&body).expect("JSON")
            }
        };
        // Given back on a task of its own once the request is dropped: the states read as after the first alone.
        let given_back = common::eventually(std::time::Duration::from_secs(5), async || {
            state("counted").await["remaining"] == 99
        })
        .await;
        let counted = state("counted").await;
        assert!(given_back.is_some(), "{store:?}: {counted}");
        let meter = state("meter").await;
        let reset = meter["reset_after_ms"].as_u64().expect("reset_after_ms");
        assert!(
            reset <= 3_600_000,
            "{store:?}: the meter still holds two: {meter}"
        );
        assert_eq!(s.upstream.hits(), 1, "{store:?}");
    }
}

/// A gateway on `store` (its entries as written) routing `/api` to `upstream` under one `sliding_log` limit per
/// `x-api-key`, of `window` (`limit: 5, period: 30s`).
fn per_api_key_yaml(store: &str, upstream: &Upstream, window: &str) -> String {
    ConfigBuilder::new()
        .store_yaml(store)
        .upstream("backend", &upstream.url())
        .route("api", "/api")
        .to("backend")
        .limit(
            "per-key",
            "[header:x-api-key]",
            &format!("algorithm: sliding_log, {window}"),
        )
        .build()
}

#[tokio::test]
async fn a_flood_of_new_keys_does_not_reset_a_key_over_its_limit() {
    // The memory store holds 640 keys; 2,000 new ones must not push out the victim's full log.
    let upstream = Upstream::start().await;
    let yaml = per_api_key_yaml(
        "  backend: memory\n  max_keys: 640\n",
        &upstream,
        "limit: 5, period: 30s",
    );
    let gateway = start_gateway(&yaml).await;
    let url = gateway.url("/api");
    let victim = hammer(&url, 8, &[("x-api-key", "victim")]).await;
    assert_eq!(count(&victim, 200), 5, "{victim:?}");

    let mut flood = tokio::task::JoinSet::new();
    for worker in 0..4 {
        let url = url.clone();
        flood.spawn(async move {
            let client = client();
            for i in 0..500 {
                let status = client
                    .get(&url)
                    .header("x-api-key", format!("flood-{worker}-{i}"))
                    .send()
                    .await
                    .expect("flood request")
                    .status();
                assert_eq!(status, 200, "a new key with room to displace");
            }
        });
    }
    while let Some(done) = flood.join_next().await {
        done.expect("flood worker");
    }

    let after = hammer(&url, 20, &[("x-api-key", "victim")]).await;
    assert_eq!(count(&after, 200), 0, "the victim stays refused: {after:?}");
}

#[tokio::test]
async fn when_full_decides_new_keys_while_the_store_holds_only_keys_over_their_limit() {
    let metrics = tollgate::telemetry::prometheus().expect("recorder");
    let full_total = || {
        metrics
            .render()
            .lines()
            .find(|line| line.starts_with("tollgate_store_full_total"))
            .and_then(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let upstream = Upstream::start().await;
    for when_full in ["deny", "allow"] {
        // 64 keys, one a shard; each key is over its limit after one request, so none may be displaced: of 100
        // new keys at most 64 find room.
        let store = format!("  backend: memory\n  max_keys: 64\n  when_full: {when_full}\n");
        let yaml = per_api_key_yaml(&store, &upstream, "limit: 1, period: 1m");
        let gateway = start_gateway(&yaml).await;
        let client = client();
        let before = full_total();
        let mut statuses = Vec::new();
        for i in 0..100 {
            let response = client
                .get(gateway.url("/api"))
                .header("x-api-key", format!("client-{i}"))
                .send()
                .await
                .expect("request");
            if response.status() == 429 {
                // The limit's fields agree with Retry-After: nothing left, full again no sooner than it admits.
                let number = |name: &str| -> u64 {
                    response.headers()[name]
                        .to_str()
                        .expect("text")
                        .parse()
                        .expect("a number")
                };
                let (retry_after, reset) = (number("retry-after"), number("x-ratelimit-reset"));
                assert!(
                    reset >= retry_after,
                    "reset {reset} beside Retry-After {retry_after}"
                );
                assert_eq!(number("x-ratelimit-remaining"), 0);
            }
            statuses.push(response.status().as_u16());
        }
        let refused = full_total() - before;
        match when_full {
            "deny" => {
                assert!(count(&statuses, 200) <= 64, "{statuses:?}");
                assert_eq!(count(&statuses, 429), 100 - count(&statuses, 200));
                assert_eq!(refused as usize, count(&statuses, 429));
            }
            _ => {
                assert_eq!(count(&statuses, 200), 100, "{statuses:?}");
                assert!(
                    refused >= 36,
                    "{refused} counted in tollgate_store_full_total"
                );
            }
        }
    }
}

/// One limit of capacity `capacity` per algorithm, as YAML list items; the bucket algorithms keep their rate
/// (their state is measured in it), so only the capacity changes between two calls. The windows are 20000 days
/// long (2024-10-04 to 2079-07-08 on Redis's clock): none ends during a test.
fn limit_of(algorithm: &str, capacity: u64) -> String {
    let params = match algorithm {
        "fixed_window" | "sliding_window" => format!("limit: {capacity}\n        period: 20000d"),
        "sliding_log" => format!("limit: {capacity}\n        period: 1h"),
        "leaky_bucket" => format!("rate: 3/1h\n        burst: {capacity}\n        mode: reject"),
        _ => format!("rate: 3/1h\n        burst: {capacity}"),
    };
    format!(
        "      - name: per-ip\n        key: ip\n        algorithm: {algorithm}\n        {params}\n"
    )
}

#[tokio::test]
async fn a_raised_limit_applies_at_once_after_a_reload_on_every_instance() {
    let algorithms = [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
        "leaky_bucket",
    ];
    for store in STORES {
        for algorithm in algorithms {
            let upstream = Upstream::start().await;
            let redis = matches!(store, Store::Redis).then(RedisServer::start);
            let yaml = |capacity| {
                gateway_yaml(
                    store_yaml(redis.as_ref()),
                    "",
                    &upstream.url(),
                    &limit_of(algorithm, capacity),
                )
            };
            let gateways = common::gateways_sharing(&yaml(3), redis.as_ref()).await;
            let at = |i: usize| &gateways[i % gateways.len()];
            let http = client();
            let get = |i: usize| http.get(at(i).url("/api")).send();
            let what = format!("{store:?} {algorithm}");
            // Three admitted, then every instance has refused the key (and remembers it until its retry time: the
            // window's end, or twenty minutes away at 3 an hour).
            let mut seen = Vec::new();
            for i in 0..3 + gateways.len() {
                seen.push(get(i).await.expect("send").status().as_u16());
            }
            assert_eq!(count(&seen, 200), 3, "{what}: {seen:?}");
            let refused = get(0).await.expect("send");
            assert_eq!(refused.status(), 429, "{what}");
            assert_eq!(refused.headers()["x-ratelimit-limit"], "3", "{what}");

            for gateway in &gateways {
                gateway.gateway.reload(&common::config(&yaml(8)));
            }
            for i in 0..5 {
                let admitted = get(i).await.expect("send");
                assert_eq!(admitted.status(), 200, "{what}: raised request {i}");
                assert_eq!(admitted.headers()["x-ratelimit-limit"], "8", "{what}");
            }
            if matches!(
                algorithm,
                "sliding_log" | "token_bucket" | "gcra" | "leaky_bucket"
            ) {
                // Exact over any interval: the new limit is kept too (a token bucket keeps the tokens it lacks).
                assert_eq!(get(5).await.expect("send").status(), 429, "{what}");
            }
        }
    }
}

#[tokio::test]
async fn one_route_flooding_the_memory_store_leaves_room_for_every_other() {
    // 640 keys, at most 160 of one limit (a quarter): 2,000 keys over their limit on one route cannot take the
    // room the other routes' new clients need.
    let upstream = Upstream::start().await;
    let per_key = |limit: u32| format!("algorithm: sliding_log, limit: {limit}, period: 1m");
    let yaml = ConfigBuilder::new()
        .store_yaml("  backend: memory\n  max_keys: 640\n")
        .upstream("backend", &upstream.url())
        .route("flooded", "/flooded")
        .to("backend")
        .limit("per-key", "[header:x-key]", &per_key(1))
        .route("other", "/other")
        .to("backend")
        .limit("per-key", "[header:x-key]", &per_key(100))
        .build();
    let gateway = start_gateway(&yaml).await;
    let client = client();
    for i in 0..2_000 {
        let status = client
            .get(gateway.url("/flooded"))
            .header("x-key", format!("flood-{i}"))
            .send()
            .await
            .expect("flood request")
            .status();
        assert!(status == 200 || status == 429, "{status}");
    }
    for i in 0..300 {
        let status = client
            .get(gateway.url("/other"))
            .header("x-key", format!("client-{i}"))
            .send()
            .await
            .expect("request")
            .status();
        assert_eq!(
            status, 200,
            "client-{i} found no room beside the flooded route"
        );
    }
}
