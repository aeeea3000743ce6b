//! Redis failures under load: each `on_error` policy answers with its own answer and never waits past the
//! store timeout, the circuit breaker stops asking a dead or frozen Redis, limiting returns to Redis when it is
//! back, and the over-limit cache spares Redis the floods on denied keys.

mod common;

use std::time::{Duration, Instant};

use common::binary::Tollgate;
use common::config_builder::ConfigBuilder;
use common::http_client::{client, json_answer};
use common::redis::RedisServer;
use common::{
    eventually, serve_admin, start_gateway, start_gateway_without_waiting, ReservedPort,
    TestGateway,
};
use serde_json::json;
use tollgate::limiter::store::{LimitCheck, RedisStore, StoreError};
use tollgate::limiter::{Algorithm, Limit};

/// Slack over the store timeout for a request on a loaded two-core machine.
const SLACK: Duration = Duration::from_millis(700);

/// A route `/demo` answering 200 itself, `limit` a minute per client address, on `redis` with `on_error` and a
/// time budget of `timeout_ms`.
fn yaml(redis: &RedisServer, on_error: &str, timeout_ms: u64, limit: u64) -> String {
    let store = format!(
        "  backend: redis\n  url: {}\n  timeout: {timeout_ms}ms\n  on_error: {on_error}\n",
        redis.url()
    );
    ConfigBuilder::new()
        .store_yaml(&store)
        .route("demo", "/demo")
        .respond(200, "ok")
        .limit(
            "per-ip",
            "ip",
            &format!("algorithm: sliding_log, limit: {limit}, period: 1m"),
        )
        .build()
}

/// Sends `n` requests one by one; returns (status, latency) of each.
async fn timed_requests(gateway: &TestGateway, n: usize) -> Vec<(u16, Duration)> {
    let client = client();
    let mut results = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let response = client
            .get(gateway.url("/demo"))
            .send()
            .await
            .expect("request");
        results.push((response.status().as_u16(), started.elapsed()));
    }
    results
}

fn max_latency(results: &[(u16, Duration)]) -> Duration {
    results.iter().map(|r| r.1).max().unwrap_or_default()
}

#[tokio::test]
async fn local_policy_keeps_limiting_in_process_and_returns_to_redis() {
    let mut redis = RedisServer::start();
    let gateway = start_gateway(&yaml(&redis, "local", 100, 1_000)).await;
    assert!(timed_requests(&gateway, 5).await.iter().all(|r| r.0 == 200));

    redis.kill();
    let during = timed_requests(&gateway, 50).await;
    assert!(
        during.iter().all(|r| r.0 == 200),
        "local fallback admits: {during:?}"
    );
    let worst = max_latency(&during);
    assert!(
        worst < Duration::from_millis(100) + SLACK,
        "a request waited {worst:?}"
    );
    assert!(gateway.gateway.limiter().fallback_active());

    // Back on the same port: requests are decided by Redis again without a restart.
    redis.restart();
    // Back means: Redis holds limit state again and the fallback is over. (A check sent just before a timeout
    // can still land in Redis while its request was answered by the fallback, so the first alone proves little.)
    let back = eventually(Duration::from_secs(5), async || {
        timed_requests(&gateway, 1).await;
        redis.cli(&["DBSIZE"]).as_deref() != Some("0")
            && !gateway.gateway.limiter().fallback_active()
    })
    .await
    .expect("limiting never returned to redis");
    println!("limiting returned to redis {back:?} after it was reachable again");
    assert!(back < Duration::from_secs(2), "took {back:?}");
}

#[tokio::test]
async fn local_fallback_still_enforces_the_limit() {
    let mut redis = RedisServer::start();
    let gateway = start_gateway(&yaml(&redis, "local", 100, 3)).await;
    redis.kill();
    let statuses: Vec<u16> = timed_requests(&gateway, 8)
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        3,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|&&s| s == 429).count(),
        5,
        "{statuses:?}"
    );
}

#[tokio::test]
async fn deny_policy_answers_503_quickly() {
    let mut redis = RedisServer::start();
    let gateway = start_gateway(&yaml(&redis, "deny", 100, 1_000)).await;
    redis.kill();
    let results = timed_requests(&gateway, 20).await;
    assert!(results.iter().all(|r| r.0 == 503), "{results:?}");
    assert!(max_latency(&results) < Duration::from_millis(100) + SLACK);
    let response = client().get(gateway.url("/demo")).send().await.unwrap();
    assert_eq!(response.headers()["retry-after"], "1");
    let body: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(body["error"], "limiter_unavailable");
}

#[tokio::test]
async fn allow_policy_admits_without_limits() {
    let mut redis = RedisServer::start();
    let gateway = start_gateway(&yaml(&redis, "allow", 100, 2)).await;
    redis.kill();
    let results = timed_requests(&gateway, 10).await;
    assert!(
        results.iter().all(|r| r.0 == 200),
        "limit 2 but redis is down and the policy admits: {results:?}"
    );
    let response = client().get(gateway.url("/demo")).send().await.unwrap();
    assert!(
        response.headers().get("x-ratelimit-limit").is_none(),
        "no decision, no rate-limit headers"
    );
}

#[tokio::test]
async fn frozen_redis_is_treated_as_dead_and_the_breaker_stops_waiting_for_it() {
    let redis = RedisServer::start();
    let gateway = start_gateway(&yaml(&redis, "local", 200, 1_000)).await;
    timed_requests(&gateway, 3).await;

    redis.pause();
    let first = timed_requests(&gateway, 3).await;
    assert!(first.iter().all(|r| r.0 == 200), "{first:?}");
    assert!(max_latency(&first) < Duration::from_millis(200) + SLACK);
    // Three timeouts opened the circuit: later requests do not wait for Redis at all.
    let later = timed_requests(&gateway, 20).await;
    assert!(later.iter().all(|r| r.0 == 200));
    let worst = max_latency(&later);
    assert!(
        worst < Duration::from_millis(150),
        "circuit open, yet a request took {worst:?}"
    );
    assert!(gateway.gateway.limiter().fallback_active());
    let readiness = gateway.gateway.limiter().readiness();
    assert!(!readiness.ready);
    let reason = readiness.reason.unwrap_or_default();
    assert!(reason.contains("did not answer"), "{reason}");

    redis.resume();
    let back = eventually(Duration::from_secs(5), async || {
        timed_requests(&gateway, 1).await;
        !gateway.gateway.limiter().fallback_active()
    })
    .await;
    assert!(
        back.is_some(),
        "limiting never returned to redis after SIGCONT"
    );
}

#[tokio::test]
async fn a_flood_on_a_denied_key_costs_redis_almost_nothing() {
    let redis = RedisServer::start();
    let gateway = start_gateway(&yaml(&redis, "deny", 500, 5)).await;
    // Counted once the gateway has settled: its first call to Redis made (it is ready), and listening for resets
    // (as it subscribes, it forgets the denials it remembered: one would be asked of Redis again).
    let settled = eventually(Duration::from_secs(5), async || {
        gateway.gateway.limiter().readiness().ready
            && redis
                .cli(&["PUBSUB", "NUMSUB", "tollgate:resets"])
                .is_some_and(|answer| answer.ends_with('1'))
    })
    .await;
    assert!(settled.is_some(), "the gateway never settled");
    let (before, started) = (redis.command_calls("evalsha"), Instant::now());
    let statuses: Vec<u16> = timed_requests(&gateway, 300)
        .await
        .iter()
        .map(|r| r.0)
        .collect();
    let calls = redis.command_calls("evalsha") - before;
    // The gateway asks Redis whether it still answers once a second, with the same script: not the flood's calls.
    let health_checks = started.elapsed().as_secs() + 1;
    assert_eq!(
        statuses.iter().filter(|&&s| s == 200).count(),
        5,
        "decisions stay exact"
    );
    assert_eq!(statuses.iter().filter(|&&s| s == 429).count(), 295);
    println!("300 requests on one key, limit 5: {calls} EVALSHA calls");
    // 5 admitted, 1 denied before it is remembered (2 should the forgetting that follows the subscription come after).
    assert!(
        calls <= 7 + health_checks,
        "{calls} script calls for a flood on one denied key ({health_checks} health checks at most)"
    );
}

// === Answered without Redis, never counted by it ===

/// The members of the `sliding_log` key `key`: what Redis has counted.
fn counted(redis: &RedisServer, key: &str) -> u64 {
    redis
        .cli(&["ZCARD", key])
        .and_then(|n| n.parse().ok())
        .expect("ZCARD")
}

#[tokio::test]
async fn a_check_that_reaches_redis_after_its_deadline_counts_nothing() {
    let redis = RedisServer::start();
    // One connection: the checks written while Redis is frozen, and the peek after, go through the same socket,
    // so Redis has run the late checks by the time it answers the peek.
    let store = RedisStore::connect(&redis.url(), 1, Duration::from_millis(300)).expect("store");
    assert!(store.wait_connected(Duration::from_secs(5)).await);
    let limit = Limit::new(
        "late",
        Algorithm::SlidingLog {
            limit: 10,
            period_ms: 60_000,
        },
        1,
    )
    .expect("valid limit");
    let checks = [LimitCheck {
        key: "late:{t}",
        limit: &limit,
    }];
    // One decided check first (a loaded machine may need a second try): the store has seen Redis's clock.
    let decided = eventually(Duration::from_secs(10), async || {
        store.check(&checks, None).await.is_ok()
    })
    .await;
    assert!(decided.is_some(), "no check was ever decided");
    let before = counted(&redis, "late:{t}");

    // Frozen: each check is written to the socket, waits its 300 ms and is answered without Redis.
    redis.pause();
    for _ in 0..3 {
        let error = store
            .check(&checks, None)
            .await
            .expect_err("redis is frozen");
        // Timed out by the batch's deadline or by fred's own timer, whichever fired first.
        let timed_out = match &error {
            StoreError::Timeout(_) => true,
            StoreError::Redis(error) => *error.kind() == fred::error::ErrorKind::Timeout,
            _ => false,
        };
        assert!(timed_out, "{error}");
    }
    redis.resume();
    // Redis now runs the three late checks, then this one: the late ones changed nothing.
    let state = store
        .peek(checks[0])
        .await
        .expect("peeked after the late checks");
    assert_eq!(
        counted(&redis, "late:{t}"),
        before,
        "late checks were counted"
    );
    assert_eq!(state.remaining, 10 - before);
}

#[tokio::test]
async fn requests_answered_during_a_client_pause_are_not_counted_when_it_ends() {
    for on_error in ["deny", "local"] {
        let redis = RedisServer::start();
        let gateway = start_gateway(&yaml(&redis, on_error, 100, 10)).await;
        let admitted = timed_requests(&gateway, 1).await;
        assert_eq!(admitted[0].0, 200, "{on_error}");
        let before = counted(&redis, "tollgate:demo:per-ip:{127.0.0.1}");
        assert_eq!(before, 1, "{on_error}");

        // Redis holds every write (the script among them) for a second; each request is answered by the policy.
        let paused_at = Instant::now();
        assert_eq!(
            redis.cli(&["CLIENT", "PAUSE", "1000", "WRITE"]).as_deref(),
            Some("OK")
        );
        let during = timed_requests(&gateway, 3).await;
        let expected = if on_error == "deny" { 503 } else { 200 };
        assert!(
            during.iter().all(|r| r.0 == expected),
            "{on_error}: {during:?}"
        );
        // Once the pause is over Redis runs whatever it held, and the gateway's probe finds it answering again.
        tokio::time::sleep_until((paused_at + Duration::from_millis(1_200)).into()).await;
        let back = eventually(Duration::from_secs(10), async || {
            let limiter = gateway.gateway.limiter();
            !limiter.fallback_active() && limiter.readiness().ready
        })
        .await;
        assert!(back.is_some(), "{on_error}: redis never answered again");
        // The held calls changed nothing. What `local` admitted meanwhile is then carried into Redis, once (so
        // that instances admit at most their number times the limit): counted exactly once, never twice.
        let carried = if on_error == "local" {
            during.len() as u64
        } else {
            0
        };
        let settled = eventually(Duration::from_secs(2), async || {
            counted(&redis, "tollgate:demo:per-ip:{127.0.0.1}") == before + carried
        })
        .await;
        assert!(
            settled.is_some(),
            "{on_error}: redis counted {} of {before} + {carried}",
            counted(&redis, "tollgate:demo:per-ip:{127.0.0.1}")
        );
        let more = eventually(Duration::from_millis(500), async || {
            counted(&redis, "tollgate:demo:per-ip:{127.0.0.1}") != before + carried
        })
        .await;
        assert!(
            more.is_none(),
            "{on_error}: requests answered without redis were counted twice"
        );
    }
}

// === Start in any order, recover at once ===

/// The limit two gateways share in the tests below: exact (`sliding_log`), per `x-tenant`.
const SHARED_LIMIT: usize = 5;

/// A gateway on `url` refusing with 503 while Redis fails (`on_error: deny`): a 200 or a 429 was decided by Redis.
fn shared_yaml(url: &str) -> String {
    format!(
        r#"store:
  backend: redis
  url: {url}
  timeout: 500ms
  on_error: deny
routes:
  - name: demo
    match: {{ path_prefix: /demo }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - name: per-tenant
        key: [header:x-tenant]
        algorithm: sliding_log
        limit: {SHARED_LIMIT}
        period: 1m
"#
    )
}

/// Two gateways on one Redis URL, started without waiting for it, and their admin listeners.
struct Pair {
    gateways: [TestGateway; 2],
    admins: [String; 2],
}

async fn two_gateways(url: &str) -> Pair {
    let gateways = [
        start_gateway_without_waiting(&shared_yaml(url)).await,
        start_gateway_without_waiting(&shared_yaml(url)).await,
    ];
    let admins = [
        serve_admin(&gateways[0], None).await,
        serve_admin(&gateways[1], None).await,
    ];
    Pair { gateways, admins }
}

async fn tenant_status(gateway: &TestGateway, tenant: &str) -> u16 {
    client()
        .get(gateway.url("/demo"))
        .header("x-tenant", tenant)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

/// `GET /readyz` on the admin listener at `admin`: its status and body.
async fn readyz(admin: &str) -> (u16, serde_json::Value) {
    let (status, body) = json_answer(client().get(format!("{admin}/readyz"))).await;
    assert!(
        body.is_object(),
        "/readyz answered {status} without a JSON object"
    );
    (status, body)
}

/// Polls `/readyz` on every admin listener until each says `status` with a reason (when degraded) containing
/// `reason`, at most 10 s; returns how long that took.
async fn until_readyz(admins: &[String], status: &str, reason: &str) -> Duration {
    let mut last = serde_json::Value::Null;
    let took = eventually(Duration::from_secs(10), async || {
        for admin in admins {
            let (_, body) = readyz(admin).await;
            let matches = body["status"] == status
                && (status == "ready" || body["reason"].as_str().unwrap_or("").contains(reason));
            if !matches {
                last = body;
                return false;
            }
        }
        true
    })
    .await;
    took.unwrap_or_else(|| panic!("/readyz never said {status} ({reason}): {last}"))
}

/// Sends `2 * SHARED_LIMIT` requests for `tenant`, alternating between the gateways, and checks that exactly
/// `SHARED_LIMIT` were admitted between them and the others refused by the limit (none by the fallback).
async fn assert_shared_exactly(gateways: &[TestGateway], tenant: &str) {
    let mut statuses = Vec::new();
    for i in 0..2 * SHARED_LIMIT {
        statuses.push(tenant_status(&gateways[i % 2], tenant).await);
    }
    let admitted = statuses.iter().filter(|&&s| s == 200).count();
    let limited = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!(
        (admitted, limited),
        (SHARED_LIMIT, SHARED_LIMIT),
        "one shared limit between two gateways: {statuses:?}"
    );
}

async fn assert_refused(gateways: &[TestGateway]) {
    for gateway in gateways {
        assert_eq!(tenant_status(gateway, "t").await, 503, "on_error: deny");
    }
}

#[tokio::test]
async fn gateways_started_before_redis_share_its_limit_once_it_answers() {
    // Held, not listening: connections are refused until Redis listens there.
    let port = ReservedPort::new();
    let pair = two_gateways(&format!("redis://{}", port.addr())).await;
    // Serving from the first second, by the policy, and saying why.
    assert_refused(&pair.gateways).await;
    until_readyz(&pair.admins, "degraded", "refused").await;

    let _redis = RedisServer::start_on(port);
    let took = until_readyz(&pair.admins, "ready", "").await;
    println!("both gateways ready {took:?} after redis answered PING");
    assert_shared_exactly(&pair.gateways, "t").await;
}

#[tokio::test]
async fn gateways_share_the_limit_again_after_redis_restarts_empty() {
    let mut redis = RedisServer::start();
    let pair = two_gateways(&redis.url()).await;
    until_readyz(&pair.admins, "ready", "").await;
    assert_eq!(tenant_status(&pair.gateways[0], "t").await, 200);

    redis.kill();
    assert_refused(&pair.gateways).await;
    until_readyz(&pair.admins, "degraded", "refused").await;
    // A restart without persistence, or a new instance in its place: keys and the script cache are gone.
    redis.restart();
    let took = until_readyz(&pair.admins, "ready", "").await;
    println!("both gateways ready {took:?} after redis answered PING again");
    // What was counted went with the old instance.
    assert_shared_exactly(&pair.gateways, "t").await;
}

#[tokio::test]
async fn a_password_fixed_at_runtime_is_taken_without_a_restart() {
    let mut redis = RedisServer::start_with_password("old");
    let url = format!("redis://:new@127.0.0.1:{}", redis.port);
    let pair = two_gateways(&url).await;
    assert_refused(&pair.gateways).await;
    // Redis's own words, not "connection closed".
    until_readyz(&pair.admins, "degraded", "WRONGPASS").await;

    redis.set_password("new");
    let took = until_readyz(&pair.admins, "ready", "").await;
    println!("both gateways ready {took:?} after CONFIG SET requirepass");
    assert_shared_exactly(&pair.gateways, "t").await;
}

// === Readiness ===

#[tokio::test]
async fn readyz_is_ready_only_after_a_limiter_call_succeeded_and_may_answer_503_meanwhile() {
    let redis = RedisServer::start_with_password("right");
    let yaml = format!(
        "admin:\n  readyz_degraded_status: 503\n{}",
        shared_yaml(&format!("redis://:wrong@127.0.0.1:{}", redis.port))
    );
    let config = common::config(&yaml);
    let gateway = start_gateway_without_waiting(&yaml).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind admin");
    let admin = format!("http://{}", listener.local_addr().expect("admin address"));
    let router = tollgate::admin::router_for(gateway.gateway.clone(), &config.admin);
    tokio::spawn(async move { axum::serve(listener, router).await });

    // Connected to nothing yet, or refused: degraded from the start, never "ready" before a call succeeded.
    let (status, body) = readyz(&admin).await;
    assert_eq!(
        (status, &body["status"]),
        (503, &json!("degraded")),
        "{body}"
    );
    assert!(body["reason"].is_string(), "{body}");
    until_readyz(std::slice::from_ref(&admin), "degraded", "WRONGPASS").await;
    let (status, body) = readyz(&admin).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["on_error"], "deny", "{body}");
}

#[tokio::test]
async fn an_outage_is_logged_once_in_redis_words_and_never_per_request() {
    let mut redis = RedisServer::start_with_password("right");
    let dir = tempfile::tempdir().expect("temporary directory");
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n{}",
        shared_yaml(&format!("redis://:wrong@127.0.0.1:{}", redis.port))
    );
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, yaml).expect("write config");
    // A process of its own: its log is the gateway's alone.
    let mut command = Tollgate::command(&config);
    command.env_remove("RUST_LOG");
    let gateway = Tollgate::spawn(command);
    let url = gateway.url("/demo");
    let admin = gateway.admin_url("");
    for _ in 0..40 {
        let response = client().get(&url).header("x-tenant", "t").send().await;
        assert_eq!(response.expect("request").status(), 503);
    }
    until_readyz(std::slice::from_ref(&admin), "degraded", "WRONGPASS").await;

    let text = gateway.log();
    let warnings: Vec<&str> = text.lines().filter(|l| l.contains("WARN")).collect();
    // At most: the start-up's "unreachable", the first failure (perhaps "not connected" yet), Redis's reason.
    assert!(
        warnings.len() <= 3,
        "{} warnings for 40 refused requests:\n{text}",
        warnings.len()
    );
    let named = warnings.iter().filter(|l| l.contains("WRONGPASS")).count();
    assert_eq!(named, 1, "the refusal is named once:\n{text}");

    // Fixed: the end of the outage is one line. Then Redis goes away while no request comes: still named.
    redis.set_password("wrong");
    until_readyz(std::slice::from_ref(&admin), "ready", "").await;
    redis.kill();
    let logged = eventually(Duration::from_secs(10), async || {
        let text = gateway.log();
        text.contains("redis answers again") && text.contains("redis failed: Connection refused")
    })
    .await;
    let text = gateway.log();
    assert!(logged.is_some(), "{text}");
    assert!(!text.to_lowercase().contains("connection closed"), "{text}");
}

/// `tollgate_store_fallback`'s value in `admin`'s `/metrics`.
async fn fallback_gauge(admin: &str) -> Option<f64> {
    common::http_client::metrics_text(admin)
        .await
        .lines()
        .find(|line| line.starts_with("tollgate_store_fallback "))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
}

/// Waits until `/readyz` says `fallback_active: expected` and the gauge agrees (0 or 1), at most 10 s.
async fn until_fallback(admin: &str, expected: bool) {
    let mut last = (serde_json::Value::Null, None);
    let agreed = eventually(Duration::from_secs(10), async || {
        let (_, body) = readyz(admin).await;
        let gauge = fallback_gauge(admin).await;
        let agrees =
            body["fallback_active"] == expected && gauge == Some(f64::from(u8::from(expected)));
        last = (body, gauge);
        agrees
    })
    .await;
    assert!(
        agreed.is_some(),
        "fallback_active never {expected}: /readyz {}, gauge {:?}",
        last.0,
        last.1
    );
}

#[tokio::test]
async fn readiness_and_the_fallback_gauge_follow_the_store_without_any_request() {
    let port = ReservedPort::new();
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = dir.path().join("gateway.yaml");
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n{}",
        shared_yaml(&format!("redis://{}", port.addr()))
    );
    std::fs::write(&config, yaml).expect("write config");
    // A process of its own: its metrics are the gateway's alone. No request is sent to it in this test.
    let gateway = Tollgate::run(&config);
    let admin = gateway.admin_url("");

    // Started with Redis down: degraded, and the fallback said so, before any request found out.
    until_readyz(std::slice::from_ref(&admin), "degraded", "refused").await;
    until_fallback(&admin, true).await;

    let mut redis = RedisServer::start_on(port);
    until_readyz(std::slice::from_ref(&admin), "ready", "").await;
    until_fallback(&admin, false).await;

    // Redis goes away from an idle gateway: the watch finds out.
    redis.kill();
    until_readyz(std::slice::from_ref(&admin), "degraded", "").await;
    until_fallback(&admin, true).await;
    redis.restart();
    until_readyz(std::slice::from_ref(&admin), "ready", "").await;
    until_fallback(&admin, false).await;
}

#[tokio::test]
async fn readiness_names_an_unresolvable_host_in_plain_words() {
    let yaml = shared_yaml("redis://no-such-host.invalid:6379");
    let config = common::config(&yaml);
    let gateway = start_gateway_without_waiting(&yaml).await;
    let admin = serve_admin(&gateway, config.admin.token.as_deref()).await;
    let mut last = serde_json::Value::Null;
    let named = eventually(Duration::from_secs(10), async || {
        let (_, body) = readyz(&admin).await;
        let reason = body["reason"].as_str().unwrap_or("").to_owned();
        last = body;
        !reason.is_empty()
            && reason != "no limiter call has succeeded yet"
            && reason != "not connected to redis"
    })
    .await;
    assert!(named.is_some(), "{last}");
    let reason = last["reason"].as_str().unwrap_or("");
    println!("readiness reason: {reason}");
    // The resolver's own sentence, not the Debug of an io::Error (`Custom { kind: ..., error: "..." }`).
    assert!(
        !reason.contains('{') && !reason.contains("kind:"),
        "{reason}"
    );
    assert!(
        reason.contains("no-such-host.invalid")
            || reason.contains("lookup")
            || reason.contains("resol"),
        "{reason}"
    );
}

// === Out of memory and eviction ===

#[tokio::test]
async fn out_of_memory_redis_refuses_the_script_whole() {
    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), 1, Duration::from_secs(1)).expect("store");
    assert!(store.wait_connected(Duration::from_secs(5)).await);
    let limit = Limit::new(
        "log",
        Algorithm::SlidingLog {
            limit: 5,
            period_ms: 1_000,
        },
        1,
    )
    .expect("valid limit");
    let checks = [LimitCheck {
        key: "oom:{t}",
        limit: &limit,
    }];
    let decided = store.check(&checks, Some(10_000)).await.expect("decided");
    assert!(decided.allowed);
    assert_eq!(redis.cli(&["ZCARD", "oom:{t}"]).as_deref(), Some("1"));

    // Below what it holds, under noeviction (the default): every write that may grow memory is refused.
    assert_eq!(
        redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).as_deref(),
        Some("OK")
    );
    // 1.5 s later the first entry has left the window: the script would remove it (a write that frees memory)
    // and then add one. Undeclared, Redis checked only the first write and let the ZADD through.
    let error = store
        .check(&checks, Some(11_500))
        .await
        .expect_err("refused under OOM");
    assert!(error.to_string().contains("OOM"), "{error}");
    // Untouched: the old entry is still there, and nothing was added.
    let members = redis
        .cli(&["ZRANGE", "oom:{t}", "0", "-1", "WITHSCORES"])
        .unwrap_or_default();
    let scores: Vec<&str> = members.lines().skip(1).step_by(2).collect();
    assert_eq!(scores, ["10000"], "{members}");
}

#[tokio::test]
async fn out_of_memory_is_a_store_failure_readyz_names_and_recovers_from() {
    let redis = RedisServer::start();
    let pair = two_gateways(&redis.url()).await;
    until_readyz(&pair.admins, "ready", "").await;
    assert_eq!(tenant_status(&pair.gateways[0], "before").await, 200);

    assert_eq!(
        redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).as_deref(),
        Some("OK")
    );
    // The policy answers (deny: 503), and readiness says why; the probe, a script call, keeps failing with
    // the requests (a PING would succeed and close the circuit again and again).
    assert_refused(&pair.gateways).await;
    until_readyz(&pair.admins, "degraded", "OOM").await;
    for _ in 0..5 {
        assert_refused(&pair.gateways).await;
        let (_, body) = readyz(&pair.admins[0]).await;
        assert_eq!(body["status"], "degraded", "{body}");
    }

    assert_eq!(
        redis.cli(&["CONFIG", "SET", "maxmemory", "0"]).as_deref(),
        Some("OK")
    );
    until_readyz(&pair.admins, "ready", "").await;
    assert_shared_exactly(&pair.gateways, "t").await;
}

#[tokio::test]
async fn an_evicting_maxmemory_policy_is_named_in_readyz() {
    let redis = RedisServer::start_with(
        &["--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"],
        &[],
    );
    let pair = two_gateways(&redis.url()).await;
    until_readyz(&pair.admins, "ready", "").await;
    let mut last = serde_json::Value::Null;
    let named = eventually(Duration::from_secs(10), async || {
        last = readyz(&pair.admins[0]).await.1;
        last["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("allkeys-lru"))
    })
    .await;
    assert!(named.is_some(), "{last}");
    // A warning, not a failure: limiting works meanwhile.
    assert_eq!(last["status"], "ready", "{last}");

    // noeviction is fine.
    let redis = RedisServer::start_with(&["--maxmemory", "100mb"], &[]);
    let pair = two_gateways(&redis.url()).await;
    until_readyz(&pair.admins, "ready", "").await;
    assert_shared_exactly(&pair.gateways, "t").await;
    assert!(readyz(&pair.admins[0]).await.1.get("warnings").is_none());
}

#[tokio::test]
async fn evictions_redis_makes_are_warned_once_counted_and_named_in_readyz() {
    let redis = RedisServer::start_with(
        &["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"],
        &[],
    );
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = dir.path().join("gateway.yaml");
    let yaml = format!(
        "listen: 127.0.0.1:0\nadmin:\n  listen: 127.0.0.1:0\n{}",
        shared_yaml(&redis.url())
    );
    std::fs::write(&config, yaml).expect("write config");
    // A process of its own: its metrics and its log are the gateway's alone.
    let gateway = Tollgate::run(&config);
    let admin = gateway.admin_url("");
    until_readyz(std::slice::from_ref(&admin), "ready", "").await;
    // The policy is named from the start; nothing was evicted yet.
    let (_, body) = readyz(&admin).await;
    assert_eq!(body["warnings"].as_array().map(Vec::len), Some(1), "{body}");
    assert_eq!(common::http_client::evicted_keys_counted(&admin).await, 0.0);
    // A tenant at its limit.
    let client = client();
    for _ in 0..SHARED_LIMIT {
        let status = client
            .get(gateway.url("/demo"))
            .header("x-tenant", "full")
            .send()
            .await
            .expect("request")
            .status();
        assert_eq!(status, 200);
    }

    let port = redis.port;
    tokio::task::spawn_blocking(move || common::redis::flood(port, 20_000, "first"))
        .await
        .expect("flood");
    let stats = redis.cli(&["INFO", "stats"]).unwrap_or_default();
    assert!(!stats.contains("evicted_keys:0\n"), "{stats}");
    let mut last = serde_json::Value::Null;
    let told = eventually(Duration::from_secs(10), async || {
        last = readyz(&admin).await.1;
        let named = last["warnings"].as_array().is_some_and(|w| {
            w.iter()
                .any(|w| w.as_str().unwrap_or("").contains("evicted"))
        });
        named && common::http_client::evicted_keys_counted(&admin).await > 0.0
    })
    .await;
    assert!(told.is_some(), "{last}\n{}", gateway.log());
    // A warning, not a failure: limiting goes on (with what Redis still holds).
    assert_eq!(last["status"], "ready", "{last}");
    let counted = common::http_client::evicted_keys_counted(&admin).await;
    assert!(counted >= 1_000.0, "{counted}");
    // The episode goes on: counted again, never warned again.
    tokio::task::spawn_blocking(move || common::redis::flood(port, 20_000, "second"))
        .await
        .expect("flood");
    let more = eventually(Duration::from_secs(10), async || {
        common::http_client::evicted_keys_counted(&admin).await > counted
    })
    .await;
    assert!(more.is_some(), "the second flood was not counted");
    let warned = gateway.log().matches("redis is evicting keys").count();
    assert_eq!(warned, 1, "{}", gateway.log());
}

#[tokio::test]
async fn a_redis_that_refuses_config_get_is_used_all_the_same() {
    // A managed Redis or an ACL user without CONFIG: the policy cannot be read, which is no failure.
    let redis = RedisServer::start_with(
        &[
            "--requirepass",
            "admin",
            "--maxmemory",
            "100mb",
            "--maxmemory-policy",
            "allkeys-lru",
        ],
        &["-a", "admin", "--no-auth-warning"],
    );
    let acl = [
        "ACL", "SETUSER", "limited", "on", ">secret", "~*", "&*", "+@all", "-config",
    ];
    assert_eq!(redis.cli(&acl).as_deref(), Some("OK"));
    let pair = two_gateways(&format!("redis://limited:secret@127.0.0.1:{}", redis.port)).await;
    until_readyz(&pair.admins, "ready", "").await;
    assert_shared_exactly(&pair.gateways, "t").await;
    let (_, body) = readyz(&pair.admins[0]).await;
    assert!(body.get("warnings").is_none(), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_local_fallbacks_admit_is_carried_into_redis_so_two_instances_admit_at_most_twice_the_limit(
) {
    use tollgate::limiter::{Backend, OnError, RateLimiter, SystemClock};
    let redis = RedisServer::start();
    let instance = || async {
        let store =
            RedisStore::connect(&redis.url(), 1, Duration::from_millis(100)).expect("connect");
        assert!(store.wait_connected(Duration::from_secs(10)).await);
        RateLimiter::new(
            Backend::Redis(store),
            Duration::from_millis(100),
            OnError::Local,
            1_000,
            std::sync::Arc::new(SystemClock),
        )
    };
    let instances = [instance().await, instance().await];
    // Exact over any hour: whatever is admitted in this test is in one window.
    let limit = Limit::new(
        "per-key",
        Algorithm::SlidingLog {
            limit: 5,
            period_ms: 3_600_000,
        },
        1,
    )
    .expect("valid");
    let key = "tollgate:carry:per-key:{k}";
    let check = [LimitCheck { key, limit: &limit }];
    for limiter in &instances {
        let ready = eventually(Duration::from_secs(5), async || limiter.readiness().ready).await;
        assert!(ready.is_some(), "{:?}", limiter.readiness());
    }

    // Redis frozen: each instance's fallback admits its own 5.
    redis.pause();
    let mut admitted = 0;
    for limiter in &instances {
        for _ in 0..8 {
            let outcome = limiter.check(&check).await.expect("decided locally");
            admitted += usize::from(outcome.allowed);
        }
        assert!(limiter.fallback_active());
    }
    assert_eq!(admitted, 10, "5 by each fallback");

    // Back: what the fallbacks took is counted in Redis, which admits nothing more in the window.
    redis.resume();
    let carried = eventually(Duration::from_secs(5), async || {
        redis.cli(&["ZCARD", key]).as_deref() == Some("5")
    })
    .await;
    assert!(
        carried.is_some(),
        "redis holds {:?}",
        redis.cli(&["ZCARD", key])
    );
    for limiter in &instances {
        let ready = eventually(Duration::from_secs(5), async || limiter.readiness().ready).await;
        assert!(ready.is_some(), "{:?}", limiter.readiness());
    }
    for i in 0..10 {
        let outcome = instances[i % 2]
            .check(&check)
            .await
            .expect("decided by redis");
        admitted += usize::from(outcome.allowed);
    }
    assert_eq!(
        admitted, 10,
        "at most 2 × the limit over the window, with two instances"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_fallback_filled_is_carried_before_redis_decides_on_it_again() {
    use tollgate::limiter::{Backend, OnError, RateLimiter, SystemClock};
    let redis = RedisServer::start();
    let store =
        RedisStore::connect(&redis.url(), 1, Duration::from_millis(1_000)).expect("connect");
    assert!(store.wait_connected(Duration::from_secs(10)).await);
    // A budget the carry keeps on a loaded machine: within it, the request waits for its key's carry.
    let limiter = RateLimiter::new(
        Backend::Redis(store),
        Duration::from_millis(1_000),
        OnError::Local,
        100_000,
        std::sync::Arc::new(SystemClock),
    );
    let limit = Limit::new(
        "per-key",
        Algorithm::SlidingLog {
            limit: 5,
            period_ms: 3_600_000,
        },
        1,
    )
    .expect("valid");
    let ready = eventually(Duration::from_secs(5), async || limiter.readiness().ready).await;
    assert!(ready.is_some(), "{:?}", limiter.readiness());

    // Redis frozen: the fallback fills the hot key, and admits once on each of thousands of others, which the
    // carry works through in its own order once Redis is back.
    redis.pause();
    let hot = "tollgate:carry:per-key:{hot}";
    for _ in 0..5 {
        let outcome = limiter
            .check(&[LimitCheck {
                key: hot,
                limit: &limit,
            }])
            .await
            .expect("decided locally");
        assert!(outcome.allowed);
    }
    for i in 0..3_000 {
        let key = format!("tollgate:carry:per-key:{{k{i}}}");
        let outcome = limiter
            .check(&[LimitCheck {
                key: &key,
                limit: &limit,
            }])
            .await
            .expect("decided locally");
        assert!(outcome.allowed && limiter.fallback_active());
    }

    // Back: the first request Redis decides on the hot key finds the fallback's five already counted there,
    // whatever the carry's order.
    redis.resume();
    let back = eventually(Duration::from_secs(5), async || limiter.readiness().ready).await;
    assert!(back.is_some(), "{:?}", limiter.readiness());
    let outcome = limiter
        .check(&[LimitCheck {
            key: hot,
            limit: &limit,
        }])
        .await
        .expect("decided by redis");
    assert!(
        !outcome.allowed,
        "redis admitted on a key before counting what the fallback admitted there"
    );
    assert_eq!(redis.cli(&["ZCARD", hot]).as_deref(), Some("5"));
}

// === The fallback starts from what Redis last said ===

fn seeded_yaml(url: &str) -> String {
    let route = |name: &str, algorithm: &str| {
        format!(
            "  - name: {name}\n    match: {{ path_prefix: /{name} }}\n    respond: {{ status: 200, body: \"ok\" }}\n    \
             limits:\n      - {{ name: per-tenant, key: [header:x-tenant], {algorithm} }}\n"
        )
    };
    format!(
        "store:\n  backend: redis\n  url: {url}\n  timeout: 100ms\n  on_error: local\nroutes:\n{}{}{}",
        route("log", "algorithm: sliding_log, limit: 50, period: 1h"),
        route("window", "algorithm: fixed_window, limit: 50, period: 20000d"),
        route("bucket", "algorithm: gcra, rate: 50/1h, burst: 50"),
    )
}

async fn status_of(gateway: &TestGateway, path: &str) -> u16 {
    client()
        .get(gateway.url(path))
        .header("x-tenant", "t")
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

#[tokio::test]
async fn through_an_outage_local_instances_admit_at_most_their_number_times_the_limit() {
    // Two instances, one Redis frozen once the key has 40 of its 50 taken: each fallback starts from what Redis
    // last said of it, not from empty. Every request of the test falls in one window (the fixed window's lasts
    // 20000 days, from 2024-10-04 to 2079-07-08), so the bound is on everything admitted.
    let redis = RedisServer::start();
    let yaml = seeded_yaml(&redis.url());
    let gateways = [start_gateway(&yaml).await, start_gateway(&yaml).await];
    let mut counted = Vec::new();
    for path in ["/log", "/window", "/bucket"] {
        // Redis admits 40 of the 50, from both instances, each of which hears how many are taken. (A key at its
        // limit is answered in-process by the over-limit cache, outage or not: the hole is a key below it.)
        let mut before = 0;
        for i in 0..40 {
            before += usize::from(status_of(&gateways[i % 2], path).await == 200);
        }
        assert_eq!(before, 40, "{path}: Redis admitted all");

        redis.pause();
        let mut during = 0;
        for i in 0..120 {
            during += usize::from(status_of(&gateways[i % 2], path).await == 200);
        }
        redis.resume();
        println!("{path}: {before} admitted before the outage, {during} through it");
        counted.push((path, before + during));
        // Redis answers again before the next algorithm's turn.
        let admin = serve_admin(&gateways[0], None).await;
        until_readyz(std::slice::from_ref(&admin), "ready", "").await;
        let admin = serve_admin(&gateways[1], None).await;
        until_readyz(std::slice::from_ref(&admin), "ready", "").await;
    }
    // Before, each fallback started from empty and admitted 50 more: 140 in the window.
    assert!(
        counted.iter().all(|&(_, admitted)| admitted <= 2 * 50),
        "admitted in one window, over 2 x 50: {counted:?}"
    );
}

#[tokio::test]
async fn the_fallback_starts_from_the_state_a_run_of_concurrent_requests_left() {
    // Concurrent requests of one client reach Redis as runs of identical requests in one script call, and Redis
    // reports each run once: the fallback must start from the state the run's last request left (40 of 50 taken),
    // not from an earlier one of it.
    let redis = RedisServer::start();
    let gateway = start_gateway(&seeded_yaml(&redis.url())).await;
    for path in ["/window", "/bucket"] {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..40 {
            let url = gateway.url(path);
            tasks.spawn(async move {
                let answer = client().get(url).header("x-tenant", "t").send().await;
                answer.expect("request").status().as_u16()
            });
        }
        let statuses = tasks.join_all().await;
        assert!(
            statuses.iter().all(|&status| status == 200),
            "{path}: {statuses:?}"
        );

        redis.pause();
        let mut during = 0;
        for _ in 0..30 {
            during += usize::from(status_of(&gateway, path).await == 200);
        }
        redis.resume();
        assert_eq!(
            during, 10,
            "{path}: the fallback admitted the 10 Redis had left"
        );
        let admin = serve_admin(&gateway, None).await;
        until_readyz(std::slice::from_ref(&admin), "ready", "").await;
    }
}
