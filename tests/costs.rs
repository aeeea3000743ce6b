//! Limits that count answers, not requests (`counts: { status: [...] }`): failed logins. A request reserves before
//! it is forwarded and gets its place back once its answer's status is not one the limit counts; the limit holds
//! across two gateways on one Redis and in memory, for every algorithm, under concurrent attempts.

mod common;

use std::time::Duration;

use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::http_client::client;
use common::redis::RedisServer;
use common::{eventually, gateways_sharing, serve_admin, store_yaml, TestGateway};
use tokio::net::TcpListener;

/// Every algorithm, written to admit 3 in the window (or burst) and refill slowly. The windows of the window
/// algorithms are 20000 days long (2024-10-04 to 2079-07-08 on Redis's clock): none ends during a test.
const ALGORITHMS: [&str; 6] = [
    "{ algorithm: sliding_window, limit: 3, period: 20000d }",
    "{ algorithm: sliding_log, limit: 3, period: 1h }",
    "{ algorithm: fixed_window, limit: 3, period: 20000d }",
    "{ algorithm: token_bucket, rate: 3/1h, burst: 3 }",
    "{ algorithm: gcra, rate: 3/1h, burst: 3 }",
    "{ algorithm: leaky_bucket, rate: 3/1h, burst: 3 }",
];

/// A login upstream on a free port: `POST /login` is 200 with `x-password: right`, else 401; `/login/slow` answers
/// the same after 3 s.
async fn login_upstream() -> String {
    async fn login(headers: HeaderMap) -> StatusCode {
        if headers.get("x-password").is_some_and(|p| p == "right") {
            StatusCode::OK
        } else {
            StatusCode::UNAUTHORIZED
        }
    }
    async fn slow(headers: HeaderMap) -> StatusCode {
        tokio::time::sleep(Duration::from_secs(3)).await;
        login(headers).await
    }
    let app = Router::new()
        .route("/login", post(login))
        .route("/login/slow", post(slow));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{address}")
}

/// The gateway config: `/login` to `upstream`, limited by `limit` counting 401 and 403 per client address.
fn yaml(store: &str, upstream: &str, limit: &str) -> String {
    let limit = limit.replacen(
        '{',
        "{ name: failed, key: ip, counts: { status: [401, 403] },",
        1,
    );
    format!(
        "listen: 127.0.0.1:0\nstore:\n{store}upstreams:\n  login: {{ targets: [\"{upstream}\"] }}\n\
         routes:\n  - name: login\n    match: {{ path_prefix: /login }}\n    upstream: login\n    limits:\n      - {limit}\n"
    )
}

async fn attempt(gateway: &TestGateway, path: &str, password: &str) -> u16 {
    client()
        .post(gateway.url(path))
        .header("x-password", password)
        .send()
        .await
        .expect("send")
        .status()
        .as_u16()
}

/// What the admin API says is left of the `failed` limit for 127.0.0.1.
async fn remaining(admin: &str) -> u64 {
    let text = client()
        .get(format!("{admin}/limits/login/failed?key=127.0.0.1"))
        .send()
        .await
        .expect("admin")
        .text()
        .await
        .expect("text");
    let state: serde_json::Value = serde_json::from_str(&text).expect("json");
    state["remaining"].as_u64().expect("remaining")
}

#[tokio::test]
async fn only_failed_logins_count_and_the_limit_holds_across_instances() {
    let upstream = login_upstream().await;
    for algorithm in ALGORITHMS {
        for redis in [Some(RedisServer::start()), None] {
            let store = store_yaml(redis.as_ref());
            let gateways =
                gateways_sharing(&yaml(&store, &upstream, algorithm), redis.as_ref()).await;
            let admin = serve_admin(&gateways[0], None).await;
            let on = |i: usize| &gateways[i % gateways.len()];
            let case = format!(
                "{algorithm} on {}",
                if redis.is_some() { "redis" } else { "memory" }
            );

            // Successful logins never use the limit up: each gets its place back once its 200 is known.
            for i in 0..8 {
                assert_eq!(
                    attempt(on(i), "/login", "right").await,
                    200,
                    "{case}: success {i}"
                );
                let back = eventually(Duration::from_secs(5), async || {
                    remaining(&admin).await == 3
                })
                .await;
                assert!(back.is_some(), "{case}: success {i} was given back");
            }
            // Failed ones do, on every instance: three, then the address is refused, even with the right password.
            let statuses = [
                attempt(on(0), "/login", "wrong").await,
                attempt(on(1), "/login", "wrong").await,
                attempt(on(0), "/login", "wrong").await,
                attempt(on(1), "/login", "right").await,
                attempt(on(0), "/login", "wrong").await,
            ];
            assert_eq!(statuses, [401, 401, 401, 429, 429], "{case}");
            assert_eq!(remaining(&admin).await, 0, "{case}");
        }
    }
}

#[tokio::test]
async fn concurrent_failed_attempts_reach_the_upstream_only_as_often_as_the_limit_allows() {
    let upstream = login_upstream().await;
    let redis = RedisServer::start();
    let yaml = yaml(&store_yaml(Some(&redis)), &upstream, ALGORITHMS[0]);
    let gateways = gateways_sharing(&yaml, Some(&redis)).await;
    // Counted after the answer, 40 attempts at once would all pass; reserved before, only 3 can.
    let attempts = (0..40).map(|i| attempt(&gateways[i % 2], "/login", "wrong"));
    let statuses = futures_util::future::join_all(attempts).await;
    let unauthorized = statuses.iter().filter(|&&s| s == 401).count();
    let limited = statuses.iter().filter(|&&s| s == 429).count();
    assert_eq!((unauthorized, limited), (3, 37), "{statuses:?}");
}

#[tokio::test]
async fn an_attempt_whose_client_hangs_up_before_the_answer_stays_counted() {
    let upstream = login_upstream().await;
    for redis in [Some(RedisServer::start()), None] {
        let yaml = yaml(&store_yaml(redis.as_ref()), &upstream, ALGORITHMS[2]);
        let gateways = gateways_sharing(&yaml, redis.as_ref()).await;
        let admin = serve_admin(&gateways[0], None).await;
        // The upstream sees each attempt (its password is checked) while the client has already gone: giving
        // the place back would let a client that hangs up early try without limit. So even attempts the upstream
        // would have let in stay counted once their clients leave.
        for i in 0..3 {
            let sent = client()
                .post(gateways[i % gateways.len()].url("/login/slow"))
                .header("x-password", "right")
                .timeout(Duration::from_millis(300))
                .send()
                .await;
            assert!(sent.is_err(), "the client gave up before the answer");
        }
        // Past the moment the upstream would have answered 200 (and the places would have come back).
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(remaining(&admin).await, 0);
        assert_eq!(attempt(&gateways[0], "/login", "right").await, 429);
    }
}

#[tokio::test]
async fn an_upstream_that_never_answered_gives_the_place_back() {
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let upstream = format!("http://{}", closed.local_addr().expect("address"));
    drop(closed);
    let yaml = yaml(&store_yaml(None), &upstream, ALGORITHMS[2]);
    let gateways = gateways_sharing(&yaml, None).await;
    let admin = serve_admin(&gateways[0], None).await;
    for i in 0..6 {
        assert_eq!(
            attempt(&gateways[0], "/login", "wrong").await,
            502,
            "attempt {i}"
        );
        let back = eventually(Duration::from_secs(5), async || {
            remaining(&admin).await == 3
        })
        .await;
        assert!(back.is_some(), "attempt {i} was given back");
    }
}

#[test]
fn a_count_that_is_not_one_is_refused_with_its_place() {
    let text = "upstreams:\n  a: { targets: [\"http://127.0.0.1:1\"] }\nroutes:\n  - name: login\n    match: { path: /login }\n    upstream: a\n    limits:\n      - { name: failed, key: ip, algorithm: fixed_window, limit: 3, period: 1h, counts: { status: [401, 601, \"4xy\"] } }\n      - { name: other, key: ip, algorithm: fixed_window, limit: 3, period: 1h, counts: tokens }\n";
    let error = tollgate::config::parse(text, std::path::Path::new("costs.yaml"))
        .expect_err("refused")
        .to_string();
    for expected in [
        "costs.yaml:8:",
        "routes[0].limits[0].counts.status[1]",
        "\"601\" is not an HTTP status",
        "routes[0].limits[0].counts.status[2]",
        "routes[0].limits[1].counts",
        "unknown count \"tokens\"",
    ] {
        assert!(error.contains(expected), "{expected:?} in {error}");
    }
    assert!(!error.contains("status[0]"), "401 is a status: {error}");
}
