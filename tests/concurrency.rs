//! Concurrency limits (`algorithm: concurrency`): at most `max` requests of one key in flight, counted at a real
//! upstream that holds requests until the test lets them go; a slot comes back on every way a request ends; checked
//! all-or-nothing with the route's rate limits.

mod common;

use std::time::Duration;

use common::binary::Tollgate;
use common::config_builder::ConfigBuilder;
use common::http_client::{client, json_answer};
use common::in_flight::InFlightUpstream;
use common::redis::RedisServer;
use common::{eventually, gateways_sharing, serve_admin, store_yaml, ReservedPort, TestGateway};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

const SOON: Duration = Duration::from_secs(5);

/// A gateway config in front of `upstream`: route `api` (everything) with `limits`, route `gone` (`/gone`) to an
/// address that refuses connections, limited to one in flight.
fn yaml(store: &str, upstream: &InFlightUpstream, gone: &ReservedPort, limits: &str) -> String {
    ConfigBuilder::new()
        .store_yaml(store)
        .upstream_with("app", &upstream.url(), "timeout: 1s")
        .upstream("gone", &format!("http://{}", gone.addr()))
        .route("gone", "/gone")
        .to("gone")
        .limit("one", "ip", "algorithm: concurrency, max: 1")
        .route("api", "/")
        .to("app")
        .limits_yaml(limits)
        .build()
}

/// One `concurrency` limit per client address.
fn in_flight(max: u64) -> String {
    format!("      - {{ name: in-flight, key: ip, algorithm: concurrency, max: {max} }}\n")
}

async fn status(url: String) -> u16 {
    client()
        .get(url)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Whether a quick request through `gateway` is admitted within a few seconds (slots released off the client's
/// path may take a moment).
async fn admitted_again(gateway: &TestGateway) -> bool {
    eventually(SOON, async || status(gateway.url("/quick")).await == 200)
        .await
        .is_some()
}

/// Sends `request` and returns once the upstream holds it (its slot taken): its status, once the upstream lets go.
async fn holding(
    upstream: &InFlightUpstream,
    request: impl std::future::Future<Output = u16> + Send + 'static,
) -> tokio::task::JoinHandle<u16> {
    let request = tokio::spawn(request);
    let held = eventually(SOON, async || upstream.in_flight() == 1).await;
    assert!(held.is_some(), "the upstream does not hold the request");
    request
}

/// Starts `n` requests to `/hold` spread over `gateways`, each answered with its status.
fn hold(gateways: &[TestGateway], n: usize) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|i| tokio::spawn(status(gateways[i % gateways.len()].url("/hold"))))
        .collect()
}

async fn exactly_max_admitted_and_in_flight(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let gateways = gateways_sharing(
        &yaml(&store_yaml(redis), &upstream, &gone, &in_flight(3)),
        redis,
    )
    .await;
    let requests = hold(&gateways, 40);
    // All but the admitted are refused without waiting for them.
    let refused = eventually(SOON, async || {
        requests.iter().filter(|r| r.is_finished()).count() == 37
    })
    .await;
    assert!(refused.is_some(), "37 of 40 answered at once");
    // The admitted reach the upstream on connections of their own, a moment later.
    let arrived = eventually(SOON, async || upstream.arrived() == 3).await;
    assert!(arrived.is_some(), "{} admitted", upstream.arrived());
    let answer = client()
        .get(gateways[0].url("/quick"))
        .send()
        .await
        .expect("answer");
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "1");
    let body: serde_json::Value =
        serde_json::from_slice(&answer.bytes().await.expect("body")).expect("json");
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["limit"], "in-flight");
    upstream.release(3);
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.expect("request"));
    }
    assert_eq!(common::count(&statuses, 200), 3, "{statuses:?}");
    assert_eq!(common::count(&statuses, 429), 37, "{statuses:?}");
    assert_eq!(upstream.most_in_flight(), 3);
    assert!(
        admitted_again(&gateways[0]).await,
        "slots back once answered"
    );
}

crate::each_store!(
    exactly_max_are_admitted_when_requests_arrive_together,
    exactly_max_admitted_and_in_flight
);

/// Three hundred requests from 60 clients at once, each held a moment at the upstream, never more than `max` there
/// at once.
async fn never_more_than_max_at_the_upstream(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let gateways = gateways_sharing(
        &yaml(&store_yaml(redis), &upstream, &gone, &in_flight(4)),
        redis,
    )
    .await;
    let clients: Vec<_> = (0..60)
        .map(|i| {
            let url = gateways[i % gateways.len()].url("/hold");
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..5 {
                    statuses.push(status(url.clone()).await);
                }
                statuses
            })
        })
        .collect();
    // Lets the admitted go one at a time while the others keep coming.
    while !clients.iter().all(|c| c.is_finished()) {
        if upstream.in_flight() > 0 {
            upstream.release(1);
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let mut statuses = Vec::new();
    for client in clients {
        statuses.extend(client.await.expect("client"));
    }
    let admitted = common::count(&statuses, 200);
    assert_eq!(
        admitted + common::count(&statuses, 429),
        300,
        "{statuses:?}"
    );
    assert!(admitted >= 4, "{admitted} admitted");
    assert_eq!(upstream.arrived(), admitted);
    assert!(
        upstream.most_in_flight() <= 4,
        "{} in flight",
        upstream.most_in_flight()
    );
}

crate::each_store!(
    never_more_than_max_reach_the_upstream_at_once,
    never_more_than_max_at_the_upstream
);

async fn released_on_every_ending(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let gateways = gateways_sharing(
        &yaml(&store_yaml(redis), &upstream, &gone, &in_flight(1)),
        redis,
    )
    .await;
    let gateway = &gateways[0];

    // Completion.
    assert_eq!(status(gateway.url("/quick")).await, 200);
    assert!(admitted_again(gateway).await, "after a complete answer");

    // The client goes away while the upstream holds its request.
    let request = holding(&upstream, status(gateway.url("/hold"))).await;
    assert_eq!(status(gateway.url("/quick")).await, 429, "the slot is held");
    request.abort();
    assert!(admitted_again(gateway).await, "after the client went away");

    // The upstream does not answer within its timeout.
    assert_eq!(status(gateway.url("/hold")).await, 504);
    assert!(admitted_again(gateway).await, "after an upstream timeout");

    // The upstream cannot be reached: the second request finds the slot free and fails the same way.
    assert_eq!(status(gateway.url("/gone")).await, 502);
    let again = eventually(SOON, async || status(gateway.url("/gone")).await == 502).await;
    assert!(again.is_some(), "after an unreachable upstream");

    // A stream holds its slot until it ends.
    let mut stream = client()
        .get(gateway.url("/stream"))
        .send()
        .await
        .expect("stream");
    assert_eq!(stream.status(), 200);
    let first = stream.chunk().await.expect("chunk").expect("first");
    assert_eq!(&first[..], b"first\n");
    assert_eq!(
        status(gateway.url("/quick")).await,
        429,
        "held while streaming"
    );
    let admin = serve_admin(gateway, None).await;
    let (_, seen) =
        json_answer(client().get(format!("{admin}/limits/api/in-flight?key=127.0.0.1"))).await;
    assert_eq!(seen["held"], 1, "{seen}");
    let holders: u64 = seen["holders"]
        .as_object()
        .map_or(0, |h| h.values().filter_map(|n| n.as_u64()).sum());
    assert_eq!(holders, 1, "this instance holds it: {seen}");
    upstream.release(1);
    while stream.chunk().await.expect("chunk").is_some() {}
    assert!(admitted_again(gateway).await, "after the stream ended");

    // A WebSocket holds its slot until it closes.
    let url = format!("ws://{}/ws", gateway.addr);
    let (mut socket, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("upgrade");
    socket.send(Message::text("ping")).await.expect("send");
    let echo = socket.next().await.expect("echo").expect("message");
    assert_eq!(echo, Message::text("ping"));
    assert_eq!(
        status(gateway.url("/quick")).await,
        429,
        "held while the tunnel is open"
    );
    socket.close(None).await.expect("close");
    while socket.next().await.is_some() {}
    drop(socket);
    assert!(admitted_again(gateway).await, "after the WebSocket closed");
}

crate::each_store!(
    a_slot_comes_back_however_its_request_ends,
    released_on_every_ending
);

/// A rate limit per `x-user` (one in a window of 20000 days, which no test outlives) beside one slot per address: a
/// request refused by either takes nothing from the other.
async fn all_or_nothing_with_rate_limits(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let limits = format!(
        "{}      - {{ name: per-user, key: \"header:x-user\", algorithm: fixed_window, limit: 1, period: 20000d }}\n",
        in_flight(1)
    );
    let gateways =
        gateways_sharing(&yaml(&store_yaml(redis), &upstream, &gone, &limits), redis).await;
    let gateway = &gateways[0];
    let send = |user: &'static str, path: &'static str| {
        let url = gateway.url(path);
        async move {
            client()
                .get(url)
                .header("x-user", user)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    // Refused for want of a slot: user b's window is untouched.
    let held = holding(&upstream, send("a", "/hold")).await;
    assert_eq!(send("b", "/quick").await, 429);
    upstream.release(1);
    assert_eq!(held.await.expect("held"), 200);
    let b = eventually(SOON, async || send("b", "/quick").await == 200).await;
    assert!(
        b.is_some(),
        "user b's request consumed nothing when refused"
    );
    // Refused by user a's rate: no slot taken, so user c is admitted.
    assert_eq!(send("a", "/quick").await, 429);
    assert_eq!(send("c", "/quick").await, 200);
}

crate::each_store!(
    a_request_refused_by_one_limit_takes_nothing_from_the_other,
    all_or_nothing_with_rate_limits
);

/// One slot with a lease of a second, on `redis`, in front of `upstream`.
fn leased_yaml(redis: &RedisServer, upstream: &InFlightUpstream, gone: &ReservedPort) -> String {
    yaml(
        &store_yaml(Some(redis)),
        upstream,
        gone,
        "      - { name: in-flight, key: route, algorithm: concurrency, max: 1, lease: 1s }\n",
    )
    .replace("timeout: 1s", "timeout: 30s")
}

#[tokio::test]
async fn on_redis_a_killed_gateway_s_slots_come_back_within_its_lease() {
    let redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let yaml = leased_yaml(&redis, &upstream, &gone);
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, format!("admin:\n  listen: 127.0.0.1:0\n{yaml}")).expect("config");
    let doomed = Tollgate::run(&config);
    let survivor = common::start_gateway(&yaml).await;
    let held = holding(&upstream, status(doomed.url("/hold"))).await;
    assert_eq!(
        status(survivor.url("/quick")).await,
        429,
        "the slot is held"
    );
    // The admin API says who holds it: the doomed instance, as its own admin API names itself.
    let path = "/limits/api/in-flight?key=api";
    let admin = serve_admin(&survivor, None).await;
    let (_, seen) = json_answer(client().get(format!("{admin}{path}"))).await;
    let (_, own) = json_answer(client().get(doomed.admin_url(path))).await;
    assert_eq!(seen["held"], 1, "{seen}");
    assert_eq!(seen["remaining"], 0, "{seen}");
    let holder = own["instance"].as_str().expect("instance").to_owned();
    assert_ne!(seen["instance"], own["instance"]);
    assert_eq!(seen["holders"], serde_json::json!({ holder: 1 }), "{seen}");
    // SIGKILL: the process releases nothing and renews nothing.
    drop(doomed);
    let _ = held.await;
    let back = eventually(Duration::from_secs(4), async || {
        status(survivor.url("/quick")).await == 200
    })
    .await;
    assert!(back.is_some(), "the slot came back once its lease ended");
}

#[tokio::test]
async fn on_redis_a_request_longer_than_its_lease_keeps_its_slot() {
    let redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let yaml = leased_yaml(&redis, &upstream, &gone);
    let gateways = gateways_sharing(&yaml, Some(&redis)).await;
    let held = holding(&upstream, status(gateways[0].url("/hold"))).await;
    // Three leases long: renewed all along, never free to another instance.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        assert_eq!(status(gateways[1].url("/quick")).await, 429, "still held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    upstream.release(1);
    assert_eq!(held.await.expect("held"), 200);
    assert!(admitted_again(&gateways[1]).await, "released at its end");
}

// === the queue ===

/// One slot per address whose full key makes requests wait (`queue:` with `max_wait` and `max_waiting`), with a
/// lease of `lease` (a waiter also asks again every third of it).
fn queued(max: u64, lease: &str, max_wait: &str, max_waiting: u64) -> String {
    format!(
        "      - {{ name: in-flight, key: ip, algorithm: concurrency, max: {max}, lease: {lease}, \
         queue: {{ max_wait: {max_wait}, max_waiting: {max_waiting} }} }}\n"
    )
}

/// Gateways in front of `upstream` with `limits`, on `redis` or in memory, whose upstream answers within 30 s.
async fn queue_gateways(
    redis: Option<&RedisServer>,
    upstream: &InFlightUpstream,
    gone: &ReservedPort,
    limits: &str,
) -> Vec<TestGateway> {
    let yaml =
        yaml(&store_yaml(redis), upstream, gone, limits).replace("timeout: 1s", "timeout: 30s");
    gateways_sharing(&yaml, redis).await
}

/// How many requests wait on `gateway` for a slot of the client 127.0.0.1, as its admin API says.
async fn waiting(admin: &str) -> u64 {
    let (_, seen) =
        json_answer(client().get(format!("{admin}/limits/api/in-flight?key=127.0.0.1"))).await;
    seen["waiting"].as_u64().unwrap_or(u64::MAX)
}

/// Waits until `n` requests wait on the gateway whose admin API is `admin`.
async fn until_waiting(admin: &str, n: u64) {
    let seen = eventually(SOON, async || waiting(admin).await == n).await;
    assert!(seen.is_some(), "{} waiting, not {n}", waiting(admin).await);
}

async fn waiters_are_admitted_in_arrival_order(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let gateways = queue_gateways(redis, &upstream, &gone, &queued(1, "30s", "10s", 100)).await;
    let gateway = &gateways[0];
    let admin = serve_admin(gateway, None).await;
    let first = holding(&upstream, status(gateway.url("/hold"))).await;
    let mut waiters = Vec::new();
    for i in 1..=3 {
        waiters.push(tokio::spawn(status(gateway.url(&format!("/w{i}/hold")))));
        until_waiting(&admin, i).await;
    }
    // One at a time: each release lets the next in line reach the upstream, and only it.
    for arrived in 2..=4 {
        upstream.release(1);
        let seen = eventually(SOON, async || upstream.arrived() == arrived).await;
        assert!(seen.is_some(), "{:?}", upstream.arrivals());
    }
    upstream.release(1);
    assert_eq!(first.await.expect("first"), 200);
    for waiter in waiters {
        assert_eq!(waiter.await.expect("waiter"), 200);
    }
    assert_eq!(
        upstream.arrivals(),
        ["/hold", "/w1/hold", "/w2/hold", "/w3/hold"]
    );
    assert_eq!(upstream.most_in_flight(), 1);
    assert_eq!(waiting(&admin).await, 0);
}

crate::each_store!(
    waiting_requests_are_admitted_in_the_order_they_arrived,
    waiters_are_admitted_in_arrival_order
);

async fn refused_once_max_wait_passes(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let gateways = queue_gateways(redis, &upstream, &gone, &queued(1, "300ms", "700ms", 100)).await;
    let gateway = &gateways[0];
    let held = holding(&upstream, status(gateway.url("/hold"))).await;
    let asked = std::time::Instant::now();
    let answer = client()
        .get(gateway.url("/quick"))
        .send()
        .await
        .expect("answer");
    assert!(
        asked.elapsed() >= Duration::from_millis(700),
        "answered after {:?}, before max_wait",
        asked.elapsed()
    );
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "1");
    let body: serde_json::Value =
        serde_json::from_slice(&answer.bytes().await.expect("body")).expect("json");
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["limit"], "in-flight");
    assert_eq!(
        upstream.arrived(),
        1,
        "the refused request never reached it"
    );
    upstream.release(1);
    assert_eq!(held.await.expect("held"), 200);
    assert!(admitted_again(gateway).await);
}

crate::each_store!(
    a_waiting_request_is_refused_with_retry_after_once_max_wait_passes,
    refused_once_max_wait_passes
);

async fn one_past_max_waiting_is_refused_at_once(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    // Waiting could last longer than the test's client waits (10 s): an answer at all is an answer at once.
    let gateways = queue_gateways(redis, &upstream, &gone, &queued(1, "30s", "60s", 2)).await;
    let gateway = &gateways[0];
    let admin = serve_admin(gateway, None).await;
    let held = holding(&upstream, status(gateway.url("/hold"))).await;
    let first = tokio::spawn(status(gateway.url("/w1/hold")));
    until_waiting(&admin, 1).await;
    let second = tokio::spawn(status(gateway.url("/w2/hold")));
    until_waiting(&admin, 2).await;
    let answer = client()
        .get(gateway.url("/quick"))
        .send()
        .await
        .expect("answer");
    assert_eq!(answer.status(), 429);
    assert_eq!(answer.headers()["retry-after"], "1");
    assert!(
        !first.is_finished() && !second.is_finished(),
        "both still wait"
    );
    assert_eq!(waiting(&admin).await, 2);
    upstream.release(3);
    for request in [held, first, second] {
        assert_eq!(request.await.expect("request"), 200);
    }
    assert_eq!(upstream.most_in_flight(), 1);
}

crate::each_store!(
    one_request_past_max_waiting_is_refused_at_once,
    one_past_max_waiting_is_refused_at_once
);

async fn a_waiter_whose_client_left_takes_no_slot(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let gateways = queue_gateways(redis, &upstream, &gone, &queued(1, "30s", "60s", 100)).await;
    let gateway = &gateways[0];
    let admin = serve_admin(gateway, None).await;
    let held = holding(&upstream, status(gateway.url("/hold"))).await;
    // First in line, then gone: its client gives up while it waits.
    let left = client()
        .get(gateway.url("/left/hold"))
        .timeout(Duration::from_millis(500))
        .send()
        .await;
    assert!(left.is_err(), "the first waiter was answered: {left:?}");
    let second = tokio::spawn(status(gateway.url("/second/hold")));
    // The one that left is out of the line; the second is first.
    until_waiting(&admin, 1).await;
    upstream.release(2);
    assert_eq!(held.await.expect("held"), 200);
    assert_eq!(second.await.expect("second"), 200);
    assert_eq!(upstream.arrivals(), ["/hold", "/second/hold"]);
    assert!(admitted_again(gateway).await, "no slot left taken");
}

crate::each_store!(
    a_waiting_request_whose_client_left_takes_no_slot,
    a_waiter_whose_client_left_takes_no_slot
);

/// Sixty requests at once from one client, over two gateways on Redis, each held a moment at the upstream: all
/// wait their turn and are admitted, never more than `max` at the upstream at once.
async fn queued_requests_never_exceed_max(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let gateways = queue_gateways(redis, &upstream, &gone, &queued(3, "3s", "30s", 100)).await;
    let requests: Vec<_> = (0..60)
        .map(|i| tokio::spawn(status(gateways[i % gateways.len()].url("/hold"))))
        .collect();
    while !requests.iter().all(|r| r.is_finished()) {
        if upstream.in_flight() > 0 {
            upstream.release(1);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut statuses = Vec::new();
    for request in requests {
        statuses.push(request.await.expect("request"));
    }
    assert_eq!(common::count(&statuses, 200), 60, "{statuses:?}");
    assert_eq!(upstream.arrived(), 60);
    assert!(
        upstream.most_in_flight() <= 3,
        "{} in flight",
        upstream.most_in_flight()
    );
}

crate::each_store!(
    queued_requests_never_put_more_than_max_at_the_upstream,
    queued_requests_never_exceed_max
);

#[tokio::test]
async fn on_redis_a_release_on_one_gateway_wakes_a_request_waiting_on_another() {
    let redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    // A waiter asks again of itself every 30 s (a third of the lease): within this test's 10 s, only the release
    // announced through Redis can wake it.
    let gateways = queue_gateways(
        Some(&redis),
        &upstream,
        &gone,
        &queued(1, "90s", "60s", 100),
    )
    .await;
    let (a, b) = (&gateways[0], &gateways[1]);
    let admin_b = serve_admin(b, None).await;
    let held = holding(&upstream, status(a.url("/hold"))).await;
    let waiter = tokio::spawn(status(b.url("/waiter/hold")));
    until_waiting(&admin_b, 1).await;
    upstream.release(1);
    assert_eq!(held.await.expect("held"), 200);
    let woken = eventually(Duration::from_secs(10), async || upstream.arrived() == 2).await;
    assert!(
        woken.is_some(),
        "the waiter on the other gateway was not woken"
    );
    upstream.release(1);
    assert_eq!(waiter.await.expect("waiter"), 200);
    assert_eq!(upstream.arrivals(), ["/hold", "/waiter/hold"]);
}

/// A rate limit per `x-user` (two in a window of 20000 days) beside a slot with a queue: a request that waits, asking
/// again many times, is counted by the rate limit once, when admitted.
async fn waiting_takes_nothing_from_rate_limits(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let limits = format!(
        "{}      - {{ name: per-user, key: \"header:x-user\", algorithm: fixed_window, limit: 2, period: 20000d }}\n",
        queued(1, "300ms", "10s", 100)
    );
    let gateways = queue_gateways(redis, &upstream, &gone, &limits).await;
    let gateway = &gateways[0];
    let admin = serve_admin(gateway, None).await;
    let send = |user: &'static str, path: &'static str| {
        let url = gateway.url(path);
        async move {
            client()
                .get(url)
                .header("x-user", user)
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    let held = holding(&upstream, send("a", "/hold")).await;
    let waiter = tokio::spawn(send("b", "/hold"));
    until_waiting(&admin, 1).await;
    // Long enough for the waiter to ask again several times (every 100 ms, a third of its lease).
    tokio::time::sleep(Duration::from_secs(1)).await;
    upstream.release(2);
    assert_eq!(held.await.expect("held"), 200);
    assert_eq!(waiter.await.expect("waiter"), 200);
    // User b spent one of two: one more is admitted, then none.
    assert_eq!(send("b", "/quick").await, 200, "the waiting took nothing");
    assert_eq!(send("b", "/quick").await, 429);
}

crate::each_store!(
    a_waiting_request_takes_nothing_from_rate_limits_until_admitted,
    waiting_takes_nothing_from_rate_limits
);

#[tokio::test]
async fn on_redis_waiting_requests_are_woken_across_gateways_again_after_redis_restarts() {
    let mut redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    // As above: a waiter would ask again of itself only after 30 s.
    let gateways = queue_gateways(
        Some(&redis),
        &upstream,
        &gone,
        &queued(1, "90s", "60s", 100),
    )
    .await;
    let (a, b) = (&gateways[0], &gateways[1]);
    let admin_b = serve_admin(b, None).await;
    redis.restart();
    // Both subscribers are back on the channel (fred subscribes again on reconnection), and both gateways decide on
    // Redis again.
    let subscribed = eventually(Duration::from_secs(10), async || {
        redis
            .cli(&["PUBSUB", "NUMSUB", "tollgate:slots"])
            .is_some_and(|answer| answer.ends_with('2'))
    })
    .await;
    assert!(
        subscribed.is_some(),
        "{:?}",
        redis.cli(&["PUBSUB", "NUMSUB", "tollgate:slots"])
    );
    for gateway in [a, b] {
        assert!(admitted_again(gateway).await, "deciding again");
    }
    let held = holding(&upstream, status(a.url("/hold"))).await;
    let waiter = tokio::spawn(status(b.url("/waiter/hold")));
    until_waiting(&admin_b, 1).await;
    upstream.release(1);
    assert_eq!(held.await.expect("held"), 200);
    let woken = eventually(Duration::from_secs(10), async || {
        upstream.arrivals().len() == 2
    })
    .await;
    assert!(
        woken.is_some(),
        "the waiter was not woken: {:?}",
        upstream.arrivals()
    );
    upstream.release(1);
    assert_eq!(waiter.await.expect("waiter"), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_cluster_keys_in_two_slots_each_admit_exactly_max_and_wake_their_waiters() {
    let cluster = common::cluster::RedisCluster::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    // Two tenants whose keys live on different nodes (`--cluster create` gives each a third of the slots).
    let node_of = |tenant: &str| {
        let key = format!("tollgate:api:in-flight:{{{tenant}}}");
        fred::util::redis_keyslot(key.as_bytes()) / 5461
    };
    let tenants: Vec<String> = (0..100).map(|i| format!("t{i}")).collect();
    let first = tenants
        .iter()
        .find(|t| node_of(t) == 0)
        .expect("a tenant on node 0");
    let second = tenants
        .iter()
        .find(|t| node_of(t) == 2)
        .expect("a tenant on node 2");
    let store = format!(
        "  backend: redis\n  url: {}\n  timeout: 2s\n  on_error: deny\n",
        cluster.url()
    );
    let limits =
        "      - { name: in-flight, key: \"header:x-tenant\", algorithm: concurrency, max: 2, \
                  lease: 90s, queue: { max_wait: 60s, max_waiting: 100 } }\n";
    let yaml = yaml(&store, &upstream, &gone, limits).replace("timeout: 1s", "timeout: 30s");
    let gateways = [
        common::start_gateway(&yaml).await,
        common::start_gateway(&yaml).await,
    ];
    let send = |gateway: &TestGateway, tenant: &str| {
        let request = client()
            .get(gateway.url(&format!("/{tenant}/hold")))
            .header("x-tenant", tenant);
        tokio::spawn(async move { request.send().await.map_or(0, |r| r.status().as_u16()) })
    };
    // Three of each tenant at once over both gateways: two of each reach the upstream, one of each waits.
    let mut requests = Vec::new();
    for i in 0..3 {
        for tenant in [first, second] {
            requests.push(send(&gateways[i % 2], tenant));
        }
    }
    let arrived = eventually(SOON, async || upstream.arrived() == 4).await;
    assert!(arrived.is_some(), "{:?}", upstream.arrivals());
    let of = |tenant: &str| {
        let path = format!("/{tenant}/hold");
        upstream.arrivals().iter().filter(|p| **p == path).count()
    };
    assert_eq!((of(first), of(second)), (2, 2), "{:?}", upstream.arrivals());
    // Neither waiter is admitted while its key is full.
    let still = eventually(Duration::from_millis(500), async || upstream.arrived() > 4).await;
    assert!(still.is_none(), "{:?}", upstream.arrivals());
    // One held request ends: its tenant's waiter is woken through the cluster's pub/sub, not by its timer (30 s).
    upstream.release(1);
    let woken = eventually(Duration::from_secs(10), async || upstream.arrived() == 5).await;
    assert!(
        woken.is_some(),
        "no waiter woken: {:?}",
        upstream.arrivals()
    );
    // Every request held ends (the other tenant's among them): its waiter is woken too.
    upstream.release(4);
    let woken = eventually(Duration::from_secs(10), async || upstream.arrived() == 6).await;
    assert!(
        woken.is_some(),
        "the other waiter not woken: {:?}",
        upstream.arrivals()
    );
    upstream.release(1);
    for request in requests {
        assert_eq!(request.await.expect("request"), 200);
    }
    assert_eq!((of(first), of(second)), (3, 3));
}

#[tokio::test]
async fn a_request_that_waited_is_timed_and_counted_once_whatever_it_asked() {
    tollgate::telemetry::prometheus().expect("recorder");
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    // A route of its own: the series are this process's, shared with the other tests.
    let yaml = yaml(
        &store_yaml(None),
        &upstream,
        &gone,
        &queued(1, "300ms", "600ms", 100),
    )
    .replace("name: api", "name: timed");
    let gateway = common::start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let held = holding(&upstream, status(gateway.url("/hold"))).await;
    // Asks every 100 ms (a third of its lease) for 600 ms, then is refused.
    assert_eq!(status(gateway.url("/quick")).await, 429);
    let waiter = tokio::spawn(status(gateway.url("/waiter/hold")));
    let waiting = eventually(SOON, async || {
        let (_, seen) =
            json_answer(client().get(format!("{admin}/limits/timed/in-flight?key=127.0.0.1")))
                .await;
        seen["waiting"] == 1
    })
    .await;
    assert!(waiting.is_some());
    upstream.release(2);
    assert_eq!(held.await.expect("held"), 200);
    assert_eq!(waiter.await.expect("waiter"), 200);
    let text = common::http_client::metrics_text(&admin).await;
    let value = |series: &str| {
        text.lines()
            .find(|line| line.starts_with(series))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    assert_eq!(
        value(r#"tollgate_queue_wait_seconds_count{route="timed",limit="in-flight"}"#),
        Some(2.0),
        "{text}"
    );
    let decisions = |decision: &str| {
        value(&format!(
            r#"tollgate_decisions_total{{route="timed",limit="in-flight",decision="{decision}"}}"#
        ))
    };
    assert_eq!(decisions("denied"), Some(1.0), "{text}");
    assert_eq!(decisions("allowed"), Some(2.0), "{text}");
}

#[tokio::test]
async fn on_redis_slots_taken_without_redis_count_in_redis_once_it_answers_until_they_end() {
    let mut redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let store = store_yaml(Some(&redis)).replace("on_error: deny", "on_error: local");
    let limits =
        "      - { name: in-flight, key: ip, algorithm: concurrency, max: 1, lease: 2s }\n";
    let yaml = yaml(&store, &upstream, &gone, limits).replace("timeout: 1s", "timeout: 30s");
    let gateways = gateways_sharing(&yaml, Some(&redis)).await;
    let (a, b) = (&gateways[0], &gateways[1]);
    let key = "tollgate:api:in-flight:{127.0.0.1}";
    // Redis is away: the first gateway's fallback gives a request the slot, which Redis knows nothing of.
    redis.kill();
    let held = holding(&upstream, status(a.url("/hold"))).await;
    // Back, empty: the slot is added to Redis's count, and the other gateway finds the key full.
    redis.restart();
    let counted = eventually(SOON, async || {
        redis.cli(&["ZCARD", key]).as_deref() == Some("1")
    })
    .await;
    assert!(counted.is_some(), "the slot is never counted in redis");
    assert_eq!(
        status(b.url("/quick")).await,
        429,
        "the other gateway finds the key full"
    );
    // Renewed as any lease is, for longer than a lease.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        assert_eq!(status(b.url("/quick")).await, 429, "still held");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Released in Redis when it ends: well before its lease (renewed at most 2/3 s ago) could end it.
    upstream.release(1);
    assert_eq!(held.await.expect("held"), 200);
    let released = eventually(Duration::from_millis(1_000), async || {
        redis.cli(&["ZCARD", key]).as_deref() == Some("0")
    })
    .await;
    assert!(
        released.is_some(),
        "{:?}",
        redis.cli(&["ZRANGE", key, "0", "-1", "WITHSCORES"])
    );
    assert!(admitted_again(b).await);
}

/// A plan's slot with a queue, shared by two routes, beside one route's own rate limit per consumer: a request on one
/// route waits for the slot a request on the other holds, and the rate limit counts it once, when admitted.
async fn a_plans_queue_spans_routes(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let yaml = format!(
        "listen: 127.0.0.1:0\nstore:\n{}upstreams:\n  app: {{ targets: [\"{}\"], timeout: 30s }}\n\
         consumers:\n  identify:\n    - api_key: {{ header: x-api-key }}\n  keys:\n    \
         - {{ key: acme-key, consumer: acme, plan: pro }}\n  anonymous: reject\n  plans:\n    pro:\n      limits:\n        \
         - {{ name: in-flight, key: consumer, algorithm: concurrency, max: 1, lease: 300ms, \
         queue: {{ max_wait: 10s }} }}\nroutes:\n  - name: reports\n    match: {{ path_prefix: /reports }}\n    \
         upstream: app\n    consumers: required\n  - name: chat\n    match: {{ path_prefix: /chat }}\n    \
         upstream: app\n    consumers: required\n    limits:\n      \
         - {{ name: hourly, key: consumer, algorithm: fixed_window, limit: 2, period: 20000d }}\n",
        store_yaml(redis),
        upstream.url()
    );
    let gateways = gateways_sharing(&yaml, redis).await;
    let gateway = &gateways[0];
    let send = |path: &'static str| {
        let request = client()
            .get(gateway.url(path))
            .header("x-api-key", "acme-key");
        async move { request.send().await.map_or(0, |r| r.status().as_u16()) }
    };
    let held = holding(&upstream, send("/reports/hold")).await;
    let waiter = tokio::spawn(send("/chat/hold"));
    // The plan's key, the same from every route.
    let queues = gateway.gateway.limiter().slot_queues();
    let waiting = eventually(SOON, async || {
        queues.waiting("tollgate:consumer:in-flight:{acme}") == 1
    })
    .await;
    assert!(
        waiting.is_some(),
        "the chat request does not wait for the plan's slot"
    );
    // Asking again every 100 ms meanwhile.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(upstream.arrived(), 1);
    upstream.release(2);
    assert_eq!(held.await.expect("held"), 200);
    assert_eq!(waiter.await.expect("waiter"), 200);
    assert_eq!(upstream.arrivals(), ["/reports/hold", "/chat/hold"]);
    // The chat route's hourly limit counted the waiting request once: one more is admitted, then none.
    assert_eq!(send("/chat/quick").await, 200, "waiting took nothing");
    assert_eq!(send("/chat/quick").await, 429);
}

crate::each_store!(
    a_plans_queued_slot_is_waited_for_across_routes_and_rates_count_once,
    a_plans_queue_spans_routes
);

/// Redis goes away while a request waits: its next ask (a third of its lease later) is decided by `on_error`.
async fn redis_gone_while_waiting(on_error: &str) -> (u16, usize) {
    let mut redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let store =
        store_yaml(Some(&redis)).replace("on_error: deny", &format!("on_error: {on_error}"));
    let yaml = yaml(&store, &upstream, &gone, &queued(1, "300ms", "10s", 100))
        .replace("timeout: 1s", "timeout: 30s");
    let gateway = common::start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let held = holding(&upstream, status(gateway.url("/hold"))).await;
    let waiter = tokio::spawn(status(gateway.url("/waiter/hold")));
    until_waiting(&admin, 1).await;
    redis.kill();
    if on_error == "local" {
        // The fallback counts the slot the request admitted through Redis holds: the waiter waits for its end.
        let early = eventually(Duration::from_secs(1), async || upstream.arrived() == 2).await;
        assert_eq!(early, None, "the fallback gave the slot a request holds");
        upstream.release(1);
    }
    let answered = eventually(SOON, async || {
        waiter.is_finished() || upstream.arrived() == 2
    })
    .await;
    assert!(answered.is_some(), "the waiter waits on");
    upstream.release(2);
    let _ = held.await;
    (waiter.await.expect("waiter"), upstream.arrived())
}

#[tokio::test]
async fn on_redis_a_waiting_request_is_refused_with_503_when_redis_goes_away_under_on_error_deny() {
    assert_eq!(redis_gone_while_waiting("deny").await, (503, 1));
}

#[tokio::test]
async fn on_redis_a_waiting_request_is_decided_in_process_when_redis_goes_away_under_on_error_local(
) {
    // Once the request admitted through Redis ends, this instance's own count of the key is empty: the waiter is
    // admitted.
    assert_eq!(redis_gone_while_waiting("local").await, (200, 2));
}

#[tokio::test]
async fn on_redis_a_user_denied_the_slots_channel_still_releases_and_its_waiter_finds_the_slot() {
    let redis = RedisServer::start_with_password("admin");
    // The resets' channel only: the release script's announcement is refused.
    assert_eq!(
        redis
            .cli(&[
                "ACL",
                "SETUSER",
                "tollgate",
                "on",
                ">secret",
                "~tollgate:*",
                "&tollgate:resets",
                "+@all"
            ])
            .as_deref(),
        Some("OK")
    );
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let store = format!(
        "  backend: redis\n  url: redis://tollgate:secret@127.0.0.1:{}\n  timeout: 500ms\n  on_error: deny\n",
        redis.port
    );
    // Asks again of itself every second; the lease would free a slot only 3 s after its last renewal.
    let yaml = yaml(&store, &upstream, &gone, &queued(1, "3s", "10s", 100))
        .replace("timeout: 1s", "timeout: 30s");
    let gateway = common::start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let key = "tollgate:api:in-flight:{127.0.0.1}";
    // Resets are still heard: the channel refused is not asked for with them.
    let hearing = eventually(SOON, async || {
        redis
            .cli(&["PUBSUB", "NUMSUB", "tollgate:resets"])
            .is_some_and(|answer| answer.ends_with('1'))
    })
    .await;
    assert!(hearing.is_some(), "not subscribed to resets");
    let held = holding(&upstream, status(gateway.url("/hold"))).await;
    let waiter = tokio::spawn(status(gateway.url("/waiter/hold")));
    until_waiting(&admin, 1).await;
    upstream.release(1);
    assert_eq!(held.await.expect("held"), 200);
    let admitted = eventually(SOON, async || upstream.arrived() == 2).await;
    assert!(admitted.is_some(), "the waiter never got the slot");
    upstream.release(1);
    assert_eq!(waiter.await.expect("waiter"), 200);
    // Released by its script, not left to its lease.
    let released = eventually(Duration::from_millis(1_000), async || {
        redis.cli(&["ZCARD", key]).as_deref() == Some("0")
    })
    .await;
    assert!(
        released.is_some(),
        "{:?}",
        redis.cli(&["ZRANGE", key, "0", "-1"])
    );
}

// === what Redis goes through ===

/// Two `tollgate` processes sharing `redis` in front of `upstream`, 4 slots per address with a lease of `lease`, a
/// store deciding by `on_error`; their config's directory is kept as long as they run.
fn pair_of_binaries(
    redis: &RedisServer,
    upstream: &InFlightUpstream,
    gone: &ReservedPort,
    lease: &str,
) -> (tempfile::TempDir, Tollgate, Tollgate) {
    pair_on(&store_yaml(Some(redis)), upstream, gone, lease)
}

/// [`pair_of_binaries`] on the store `store` says (a Redis Cluster).
fn pair_on(
    store: &str,
    upstream: &InFlightUpstream,
    gone: &ReservedPort,
    lease: &str,
) -> (tempfile::TempDir, Tollgate, Tollgate) {
    let limits = format!(
        "      - {{ name: in-flight, key: ip, algorithm: concurrency, max: 4, lease: {lease} }}\n"
    );
    let yaml = yaml(store, upstream, gone, &limits).replace("timeout: 1s", "timeout: 60s");
    let dir = tempfile::tempdir().expect("temporary directory");
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, format!("admin:\n  listen: 127.0.0.1:0\n{yaml}")).expect("config");
    let (a, b) = (Tollgate::run(&config), Tollgate::run(&config));
    (dir, a, b)
}

/// Sends `n` requests to `url` and returns once the upstream holds all `n` (their slots taken).
async fn hold_n(
    upstream: &InFlightUpstream,
    url: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<u16>> {
    let requests: Vec<_> = (0..n)
        .map(|_| tokio::spawn(status(url.to_owned())))
        .collect();
    let held = eventually(SOON, async || upstream.in_flight() == n).await;
    assert!(
        held.is_some(),
        "the upstream holds {}",
        upstream.in_flight()
    );
    requests
}

/// Asks for a slot through `url` every 20 ms for `during`: how many were admitted.
async fn admitted_during(url: &str, during: Duration) -> usize {
    let until = std::time::Instant::now() + during;
    let mut admitted = 0;
    while std::time::Instant::now() < until {
        admitted += usize::from(status(url.to_owned()).await == 200);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admitted
}
/// After a lost state: holder `a` said it once (one WARN, `tollgate_store_resets_total 1`), and once its 4 held
/// requests end, `b` is admitted again.
async fn lost_state_said_once_then_slots_come_back(
    a: &Tollgate,
    b: &Tollgate,
    upstream: &InFlightUpstream,
    held: Vec<tokio::task::JoinHandle<u16>>,
) {
    let said = a
        .log()
        .lines()
        .filter(|line| line.contains("WARN") && line.contains("redis lost state"))
        .count();
    assert_eq!(said, 1, "{}", a.log());
    let metrics = common::http_client::metrics_text(&a.admin_url("")).await;
    assert!(
        metrics.contains("tollgate_store_resets_total 1"),
        "{metrics}"
    );
    upstream.release(4);
    for request in held {
        assert_eq!(request.await.expect("held"), 200);
    }
    let back = eventually(SOON, async || status(b.url("/quick")).await == 200).await;
    assert!(
        back.is_some(),
        "the slots come back once their requests end"
    );
}

/// A holds 4 slots of 4 when `outage` happens to Redis; B asks for a slot all along, and for 4 s after: none is given
/// twice (never more than 4 at the upstream), the loss is said once and counted on A, and A's slots stay held until
/// its requests end.
async fn no_slot_given_twice(lease: &str, outage: impl AsyncFnOnce(&mut RedisServer)) {
    let mut redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let (_dir, a, b) = pair_of_binaries(&redis, &upstream, &gone, lease);
    let held = hold_n(&upstream, &a.url("/hold"), 4).await;
    assert_eq!(status(b.url("/quick")).await, 429, "every slot is held");
    let asking = {
        let url = b.url("/quick");
        tokio::spawn(async move { admitted_during(&url, Duration::from_secs(4)).await })
    };
    outage(&mut redis).await;
    let asked_after = admitted_during(&b.url("/quick"), Duration::from_secs(4)).await;
    let asked_along = asking.await.expect("asking");
    assert_eq!(
        (asked_along, asked_after, upstream.most_in_flight()),
        (0, 0, 4),
        "slots given again while their requests still ran"
    );
    lost_state_said_once_then_slots_come_back(&a, &b, &upstream, held).await;
}

#[tokio::test]
async fn on_redis_no_slot_is_given_twice_after_redis_restarts_empty() {
    no_slot_given_twice("30s", async |redis: &mut RedisServer| redis.restart()).await;
}

#[tokio::test]
async fn on_redis_no_slot_is_given_twice_after_redis_refused_every_write_for_longer_than_a_lease() {
    // Out of memory for 5 s: renewals refused, and every lease (1 s) ends in Redis meanwhile.
    no_slot_given_twice("1s", async |redis: &mut RedisServer| {
        assert_eq!(
            redis.cli(&["CONFIG", "SET", "maxmemory", "1"]).as_deref(),
            Some("OK")
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            redis.cli(&["CONFIG", "SET", "maxmemory", "0"]).as_deref(),
            Some("OK")
        );
    })
    .await;
}

#[tokio::test]
async fn on_redis_cluster_no_slot_is_given_twice_after_the_node_holding_the_key_is_flushed() {
    let cluster = common::cluster::RedisCluster::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let store = format!(
        "  backend: redis\n  url: {}\n  timeout: 500ms\n  on_error: deny\n",
        cluster.url()
    );
    let (_dir, a, b) = pair_on(&store, &upstream, &gone, "30s");
    let held = hold_n(&upstream, &a.url("/hold"), 4).await;
    assert_eq!(status(b.url("/quick")).await, 429, "every slot is held");
    let key = "tollgate:api:in-flight:{127.0.0.1}";
    let per_node = cluster.keys_per_node("tollgate:*");
    let owner = per_node
        .iter()
        .position(|keys| keys.iter().any(|k| k == key))
        .expect("a node holds the key");
    // The key's hash slot has its marker beside it, on the same node.
    let slot = fred::util::redis_keyslot(key.as_bytes());
    let marker = per_node[owner]
        .iter()
        .find(|k| k.ends_with("epoch") && fred::util::redis_keyslot(k.as_bytes()) == slot);
    assert!(
        marker.is_some(),
        "no marker in the key's slot: {per_node:?}"
    );
    assert_eq!(cluster.cli(owner, &["FLUSHALL"]).as_deref(), Some("OK"));
    let asked = admitted_during(&b.url("/quick"), Duration::from_secs(4)).await;
    assert_eq!(
        (asked, upstream.most_in_flight()),
        (0, 4),
        "slots given again while their requests still ran"
    );
    lost_state_said_once_then_slots_come_back(&a, &b, &upstream, held).await;
}

#[tokio::test]
async fn on_redis_a_crashed_sole_holder_s_lease_is_counted_as_expired() {
    let redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let (_dir, doomed, survivor) = pair_of_binaries(&redis, &upstream, &gone, "1s");
    let held = hold_n(&upstream, &doomed.url("/hold"), 4).await;
    // SIGKILL: the process releases nothing and renews nothing; its leases end a second later.
    drop(doomed);
    for request in held {
        let _ = request.await;
    }
    let back = eventually(SOON, async || status(survivor.url("/quick")).await == 200).await;
    assert!(
        back.is_some(),
        "the slots came back once their leases ended"
    );
    // The four leases were taken a few milliseconds apart and end as far apart: the call that found the first
    // ones ended may have come before the last did, and the next call frees (and counts) the rest.
    let mut metrics = String::new();
    let counted = eventually(SOON, async || {
        status(survivor.url("/quick")).await;
        metrics = common::http_client::metrics_text(&survivor.admin_url("")).await;
        metrics.contains("tollgate_leases_expired_total 4")
    })
    .await;
    assert!(counted.is_some(), "{metrics}");
}

#[tokio::test]
async fn on_redis_the_fallback_counts_the_slots_this_instance_holds_through_redis() {
    let redis = RedisServer::start();
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let store = store_yaml(Some(&redis)).replace("on_error: deny", "on_error: local");
    let yaml = yaml(&store, &upstream, &gone, &queued(4, "3s", "20s", 100))
        .replace("timeout: 1s", "timeout: 60s");
    let gateway = common::start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, None).await;
    let held = hold_n(&upstream, &gateway.url("/hold"), 4).await;
    let queued: Vec<_> = (0..4)
        .map(|_| tokio::spawn(status(gateway.url("/queued/hold"))))
        .collect();
    until_waiting(&admin, 4).await;
    // Black-holed: every call times out, and the waiters ask the fallback (every second: a third of the lease).
    redis.pause();
    let admitted = eventually(Duration::from_secs(3), async || upstream.in_flight() > 4).await;
    assert_eq!(
        (admitted, upstream.most_in_flight()),
        (None, 4),
        "the fallback gave slots that requests admitted through redis hold"
    );
    // One of them ends: one waiter takes its slot.
    upstream.release(1);
    let next = eventually(SOON, async || upstream.arrived() == 5).await;
    assert!(
        next.is_some(),
        "a waiter takes the slot freed: {}",
        upstream.arrived()
    );
    assert_eq!(upstream.most_in_flight(), 4);
    redis.resume();
    upstream.release(7);
    for request in held.into_iter().chain(queued) {
        let _ = request.await;
    }
}

// === a reload that lowers max ===

/// The config of a `tollgate` process in front of `upstream` whose route `api` allows `max` requests per address in
/// flight, the others waiting up to 30 s for a slot; on `redis` or in memory.
fn reloadable(
    redis: Option<&RedisServer>,
    upstream: &InFlightUpstream,
    gone: &ReservedPort,
    max: u64,
) -> String {
    let yaml = yaml(
        &store_yaml(redis),
        upstream,
        gone,
        &queued(max, "30s", "30s", 100),
    )
    .replace("timeout: 1s", "timeout: 60s");
    format!("admin:\n  listen: 127.0.0.1:0\n{yaml}")
}

/// What `GET /limits` says of the client 127.0.0.1's slots on the process whose admin API is `admin`.
async fn slots_seen(admin: &str) -> serde_json::Value {
    json_answer(client().get(format!("{admin}/limits/api/in-flight?key=127.0.0.1")))
        .await
        .1
}

/// 4 requests in flight of a `max: 4`, 2 waiting; a SIGHUP lowers `max` to 2: `GET /limits` shows the 4 held, and
/// the waiting requests go only while fewer than 2 are in flight.
async fn a_lowered_max_is_shown_and_applies_to_waiting_requests(redis: Option<&RedisServer>) {
    let upstream = InFlightUpstream::start().await;
    let gone = ReservedPort::new();
    let dir = tempfile::tempdir().expect("temporary directory");
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, reloadable(redis, &upstream, &gone, 4)).expect("config");
    let gateway = Tollgate::run(&path);
    let admin = gateway.admin_url("");
    let held = hold_n(&upstream, &gateway.url("/hold"), 4).await;
    let waiting: Vec<_> = (1..=2)
        .map(|i| tokio::spawn(status(gateway.url(&format!("/w{i}/hold")))))
        .collect();
    until_waiting(&admin, 2).await;
    std::fs::write(&path, reloadable(redis, &upstream, &gone, 2)).expect("config");
    let signalled = std::process::Command::new("kill")
        .args(["-HUP", &gateway.pid().to_string()])
        .status()
        .expect("kill");
    assert!(signalled.success());
    let reloaded = eventually(SOON, async || slots_seen(&admin).await["capacity"] == 2).await;
    assert!(reloaded.is_some(), "{}", gateway.log());
    let seen = slots_seen(&admin).await;
    assert_eq!(
        (&seen["held"], &seen["remaining"], &seen["waiting"]),
        (
            &serde_json::json!(4),
            &serde_json::json!(0),
            &serde_json::json!(2)
        ),
        "{seen}"
    );
    // One ends: 3 in flight, still more than the new max, so neither waiting request goes.
    upstream.release(1);
    let admitted = eventually(Duration::from_secs(2), async || upstream.arrived() > 4).await;
    assert_eq!(
        (admitted, upstream.in_flight()),
        (None, 3),
        "a waiting request was admitted past the lowered max"
    );
    // Two more end: 1 in flight, so one waiting request goes and the other waits (2 is the new max).
    upstream.release(2);
    let next = eventually(SOON, async || upstream.arrived() == 5).await;
    assert!(
        next.is_some(),
        "the first waiting request goes once 1 is in flight"
    );
    let more = eventually(Duration::from_secs(1), async || upstream.arrived() > 5).await;
    assert_eq!(
        (more, upstream.in_flight()),
        (None, 2),
        "{:?}",
        upstream.arrivals()
    );
    upstream.release(3);
    for request in held.into_iter().chain(waiting) {
        assert_eq!(request.await.expect("request"), 200);
    }
}

crate::each_store!(
    a_lowered_max_is_shown_and_applies_to_requests_already_waiting,
    a_lowered_max_is_shown_and_applies_to_waiting_requests
);
