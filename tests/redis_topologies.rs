//! The Redis store on every deployment it supports: Cluster (keys in several slots), Sentinel (with a failover
//! under traffic), password and ACL authentication, and TLS.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::binary::Tollgate;
use common::cluster::RedisCluster;
use common::config_builder::ConfigBuilder;
use common::http_client::client;
use common::pki::TestCa;
use common::redis::RedisServer;
use common::sentinel::RedisSentinel;
use common::{
    count, eventually, start_gateway, start_gateway_without_waiting, ReservedPort, TestGateway,
};
use fred::util::redis_keyslot;
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tollgate::limiter::store::{LimitCheck, MemoryStore, RedisStore, RedisTopology};
use tollgate::limiter::{Algorithm, LeakyMode, Limit, ManualClock, Rate};

/// A gateway config with one direct-response route `/spread` and `limits` (YAML list items, indented by 6).
fn gateway_yaml(store: &str, limits: &str) -> String {
    ConfigBuilder::new()
        .store_yaml(store)
        .route("spread", "/spread")
        .respond(200, "ok")
        .limits_yaml(limits)
        .build()
}

/// Three limits keyed by client address, tenant header and route: on Redis Cluster their keys hash to three
/// different slots (checked by the tests), owned by three different nodes.
const THREE_KEYS: &str = r#"      - name: per-ip
        key: ip
        algorithm: token_bucket
        rate: 5/1d
        burst: 5
      - name: per-tenant
        key: header:x-tenant
        missing: skip
        algorithm: sliding_log
        limit: 3
        period: 1h
      - name: per-route
        key: route
        algorithm: gcra
        rate: 10/1d
        burst: 10
"#;

/// Sends `n` GETs to `/spread`, one after another, with `x-tenant: tenant` when given; returns the statuses.
async fn send(gateway: &TestGateway, n: usize, tenant: Option<&str>) -> Vec<u16> {
    let client = client();
    let mut statuses = Vec::with_capacity(n);
    for _ in 0..n {
        let mut request = client.get(gateway.url("/spread"));
        if let Some(tenant) = tenant {
            request = request.header("x-tenant", tenant);
        }
        statuses.push(request.send().await.expect("request").status().as_u16());
    }
    statuses
}

/// Resets `tenant`'s `per-tenant` limit through `gateway`'s admin API; returns the status.
async fn reset_tenant(gateway: &TestGateway, tenant: &str) -> u16 {
    let admin = common::serve_admin(gateway, None).await;
    let reset = client()
        .delete(format!("{admin}/limits/spread/per-tenant?key={tenant}"))
        .send()
        .await;
    reset.expect("reset").status().as_u16()
}

// === Redis Cluster ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_limits_over_three_slots_admit_exactly_and_denials_consume_nothing() {
    let cluster = RedisCluster::start();
    let ip_key = "tollgate:spread:per-ip:{127.0.0.1}";
    let route_key = "tollgate:spread:per-route:{spread}";
    let tenant_keys = [
        "tollgate:spread:per-tenant:{alpha}",
        "tollgate:spread:per-tenant:{two}",
    ];
    let slots: Vec<u16> = [ip_key, route_key, tenant_keys[0], tenant_keys[1]]
        .iter()
        .map(|k| redis_keyslot(k.as_bytes()))
        .collect();
    assert!(
        slots[0] != slots[1]
            && slots[1] != slots[2]
            && slots[0] != slots[2]
            && slots[3] != slots[0],
        "the test keys must hash to different slots: {slots:?}"
    );

    let store = format!(
        "  backend: redis\n  url: {}\n  timeout: 2s\n  on_error: deny\n",
        cluster.url()
    );
    let gateway = start_gateway(&gateway_yaml(&store, THREE_KEYS)).await;

    // Tenant alpha: 3 admitted, then denied by per-tenant alone; the denials must take nothing from per-ip.
    let alpha = send(&gateway, 8, Some("alpha")).await;
    assert_eq!(alpha, [200, 200, 200, 429, 429, 429, 429, 429]);
    // Tenant two: per-ip has 2 of its 5 tokens left.
    let two = send(&gateway, 4, Some("two")).await;
    assert_eq!(two, [200, 200, 429, 429]);
    // Only per-route and per-ip apply now, and per-ip is empty.
    assert_eq!(send(&gateway, 2, None).await, [429, 429]);

    // Five admissions in all: per-route (burst 10) has 5 left, whatever the denials did.
    let per_node = cluster.keys_per_node("tollgate:*");
    let nodes_with_keys = per_node.iter().filter(|keys| !keys.is_empty()).count();
    assert_eq!(nodes_with_keys, 3, "keys per node: {per_node:?}");
    for key in [ip_key, route_key, tenant_keys[0], tenant_keys[1]] {
        assert_eq!(
            cluster.cli_cluster(&["EXISTS", key]).as_deref(),
            Some("1"),
            "{key} through redis-cli -c"
        );
    }
    assert_eq!(
        cluster.cli_cluster(&["ZCARD", tenant_keys[0]]).as_deref(),
        Some("3")
    );
    assert_eq!(
        cluster.cli_cluster(&["ZCARD", tenant_keys[1]]).as_deref(),
        Some("2")
    );
    let route = client()
        .get(gateway.url("/spread"))
        .header("x-tenant", "fresh")
        .send()
        .await
        .expect("request");
    assert_eq!(route.status(), 429, "per-ip is still empty");
    assert!(
        !gateway.gateway.limiter().fallback_active(),
        "every decision came from the cluster"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_reset_through_one_gateway_reaches_another() {
    // On a cluster, PUBLISH reaches the subscribers of every node, whichever node each gateway listens on.
    let cluster = RedisCluster::start();
    let store = format!(
        "  backend: redis\n  url: {}\n  timeout: 2s\n  on_error: deny\n",
        cluster.url()
    );
    let first = start_gateway(&gateway_yaml(&store, THREE_KEYS)).await;
    let second = start_gateway(&gateway_yaml(&store, THREE_KEYS)).await;
    // The second remembers tenant gamma as over its limit (for the next hour).
    assert_eq!(send(&second, 4, Some("gamma")).await, [200, 200, 200, 429]);
    assert_eq!(reset_tenant(&first, "gamma").await, 200);
    let mut statuses = Vec::new();
    eventually(Duration::from_secs(5), async || {
        statuses = send(&second, 1, Some("gamma")).await;
        statuses == [200]
    })
    .await;
    assert_eq!(
        statuses,
        [200],
        "the second gateway still refuses the reset tenant"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_store_checks_keys_in_three_slots_and_reloads_the_script_on_every_primary() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url(), 2, Duration::from_secs(1)).expect("connect");
    assert_eq!(store.topology(), RedisTopology::Cluster);
    assert!(store.wait_connected(Duration::from_secs(10)).await);

    // Hash tags chosen so that the three keys live on the three nodes (slot ranges of `--cluster create`).
    let keys = ["t:a:{alpha}", "t:b:{spread}", "t:c:{127.0.0.1}"];
    let mut slots: Vec<u16> = keys.iter().map(|k| redis_keyslot(k.as_bytes())).collect();
    slots.dedup();
    assert_eq!(slots.len(), 3, "three different slots");

    let one = Limit::new(
        "one",
        Algorithm::FixedWindow {
            limit: 1,
            period_ms: 3_600_000,
        },
        1,
    )
    .expect("valid");
    let three = Limit::new(
        "three",
        Algorithm::FixedWindow {
            limit: 3,
            period_ms: 3_600_000,
        },
        1,
    )
    .expect("valid");
    let log = Limit::new(
        "log",
        Algorithm::SlidingLog {
            limit: 3,
            period_ms: 60_000,
        },
        1,
    )
    .expect("valid");
    let all = [
        LimitCheck {
            key: keys[0],
            limit: &one,
        },
        LimitCheck {
            key: keys[1],
            limit: &three,
        },
        LimitCheck {
            key: keys[2],
            limit: &log,
        },
    ];
    // Aligned to the 1-minute window, in the past: the keys expire on their own within a minute.
    let now = 28_000_000 * 60_000;

    let first = store.check(&all, Some(now)).await.expect("first");
    assert!(first.allowed);
    let remaining: Vec<u64> = first.decisions.iter().map(|d| d.remaining).collect();
    assert_eq!(remaining, [0, 2, 2]);

    // Denied by `one`: the dry run spares the other two slots.
    let second = store.check(&all, Some(now + 1)).await.expect("second");
    assert!(!second.allowed);
    let allowed: Vec<bool> = second.decisions.iter().map(|d| d.allowed).collect();
    assert_eq!(allowed, [false, true, true]);
    let remaining: Vec<u64> = second.decisions.iter().map(|d| d.remaining).collect();
    assert_eq!(remaining, [0, 2, 2], "standing state, nothing consumed");

    // Redis forgets the script on every primary (as after a failover or a restart): reloaded where needed.
    for node in 0..3 {
        assert_eq!(
            cluster.cli(node, &["SCRIPT", "FLUSH"]).as_deref(),
            Some("OK")
        );
    }
    let third = store.check(&all[1..], Some(now + 2)).await.expect("third");
    assert!(third.allowed);
    let remaining: Vec<u64> = third.decisions.iter().map(|d| d.remaining).collect();
    assert_eq!(remaining, [1, 1], "the denied request consumed nothing");

    let per_node = cluster.keys_per_node("t:*");
    assert!(
        per_node.iter().all(|keys| keys.len() == 1),
        "one key on each node: {per_node:?}"
    );
}

/// Requests whose limits live in two hash slots, all at once: each passes the dry runs while the narrow limit has
/// room, then most commits on the narrow limit deny. What their commits took on the wide limit is given back
/// before they are answered: the wide limit, of every algorithm, counts exactly the admitted requests, as one
/// atomic call would. (Rates of one a day: nothing refills while the test runs.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_a_request_denied_by_one_slot_gives_back_what_another_slot_took() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url(), 4, Duration::from_secs(2)).expect("connect");
    assert!(store.wait_connected(Duration::from_secs(10)).await);
    let day = 86_400_000;
    let slow = Rate::new(1, day).expect("positive");
    let wide_algorithms = [
        Algorithm::SlidingLog {
            limit: 1_000,
            period_ms: day,
        },
        Algorithm::FixedWindow {
            limit: 1_000,
            period_ms: day,
        },
        Algorithm::SlidingWindow {
            limit: 1_000,
            period_ms: day,
        },
        Algorithm::TokenBucket {
            rate: slow,
            burst: 1_000,
        },
        Algorithm::Gcra {
            rate: slow,
            burst: 1_000,
        },
        Algorithm::LeakyBucket {
            rate: slow,
            burst: 1_000,
            mode: LeakyMode::Reject,
        },
    ];
    let narrow = Arc::new(
        Limit::new(
            "narrow",
            Algorithm::SlidingLog {
                limit: 5,
                period_ms: day,
            },
            1,
        )
        .expect("valid"),
    );
    for (i, algorithm) in wide_algorithms.into_iter().enumerate() {
        let wide = Arc::new(Limit::new("wide", algorithm, 1).expect("valid"));
        let wide_key: &'static str = format!("t:wide:{{w{i}}}").leak();
        let narrow_key: &'static str = format!("t:narrow:{{n{i}}}").leak();
        assert_ne!(
            redis_keyslot(wide_key.as_bytes()),
            redis_keyslot(narrow_key.as_bytes())
        );
        let admitted = Arc::new(AtomicUsize::new(0));
        for _round in 0..2 {
            let mut requests = tokio::task::JoinSet::new();
            for _ in 0..40 {
                let (store, wide, narrow, admitted) = (
                    store.clone(),
                    wide.clone(),
                    narrow.clone(),
                    admitted.clone(),
                );
                requests.spawn(async move {
                    let checks = [
                        LimitCheck {
                            key: wide_key,
                            limit: &wide,
                        },
                        LimitCheck {
                            key: narrow_key,
                            limit: &narrow,
                        },
                    ];
                    let outcome = store
                        .check(&checks, None)
                        .await
                        .expect("decided by the cluster");
                    if outcome.allowed {
                        admitted.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
            while let Some(result) = requests.join_next().await {
                result.expect("task");
            }
        }
        let name = algorithm.name();
        assert_eq!(admitted.load(Ordering::SeqCst), 5, "{name}");
        let state = store
            .peek(LimitCheck {
                key: wide_key,
                limit: &wide,
            })
            .await
            .expect("peeked");
        assert_eq!(
            state.remaining, 995,
            "{name}: the wide limit counts only the admitted requests"
        );
    }
}

/// Concurrent requests on a Cluster go out in batches split by hash slot: 20 requests for each of six tenants,
/// whose keys live in different slots, all at once; each tenant gets exactly its limit, every decision from Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_batches_concurrent_requests_by_slot_and_stays_exact() {
    let cluster = RedisCluster::start();
    let store = RedisStore::connect(&cluster.url(), 2, Duration::from_secs(2)).expect("connect");
    assert!(store.wait_connected(Duration::from_secs(10)).await);
    let limit = Arc::new(
        Limit::new(
            "per-tenant",
            Algorithm::FixedWindow {
                limit: 7,
                period_ms: 600_000,
            },
            1,
        )
        .expect("valid"),
    );
    let keys: Vec<String> = (0..6)
        .map(|t| format!("tollgate:batch:per-tenant:{{tenant-{t}}}"))
        .collect();
    let mut slots: Vec<u16> = keys.iter().map(|k| redis_keyslot(k.as_bytes())).collect();
    slots.sort_unstable();
    slots.dedup();
    assert!(slots.len() > 1, "the tenants must span several slots");

    let mut requests = tokio::task::JoinSet::new();
    for i in 0..120 {
        let (store, limit, key) = (store.clone(), limit.clone(), keys[i % 6].clone());
        requests.spawn(async move {
            let outcome = store
                .check(
                    &[LimitCheck {
                        key: &key,
                        limit: &limit,
                    }],
                    None,
                )
                .await
                .expect("decided by the cluster");
            (i % 6, outcome.allowed)
        });
    }
    let mut admitted = [0usize; 6];
    while let Some(result) = requests.join_next().await {
        let (tenant, allowed) = result.expect("task");
        admitted[tenant] += usize::from(allowed);
    }
    assert_eq!(admitted, [7; 6]);
    // Each stored counter holds exactly the admitted requests. A fixed_window counter is the algorithm's id as one
    // byte, then the window's start and its count as doubles (crates/limiter/src/scripts/check/2-state.lua).
    for key in &keys {
        let fields = cluster
            .cli_cluster(&[
                "EVAL",
                "return {struct.unpack('<Bdd', redis.call('GET', KEYS[1]))}",
                "1",
                key,
            ])
            .unwrap_or_default();
        let fields: Vec<&str> = fields.lines().collect();
        assert_eq!(fields.first(), Some(&"4"), "{key}: {fields:?}");
        assert_eq!(fields.get(2), Some(&"7"), "{key}: {fields:?}");
    }
}

/// Limits whose keys never get less than about 15 s to live during a case (periods of 1 or 2 minutes, at most 5
/// per period, at most 45 s of steps from a time aligned to both periods). Redis expires keys in real time while
/// the in-process store follows the explicit timestamps: a key living only a few milliseconds could vanish from
/// Redis between two steps at the same timestamp and make the comparison depend on the machine's speed.
fn slow_algorithm() -> impl Strategy<Value = Algorithm> {
    let period = prop_oneof![Just(60_000u64), Just(120_000)];
    let rate = (1u64..=5, period.clone())
        .prop_map(|(count, period_ms)| Rate::new(count, period_ms).expect("positive"));
    prop_oneof![
        (1u64..6, period.clone())
            .prop_map(|(limit, period_ms)| Algorithm::FixedWindow { limit, period_ms }),
        (1u64..6, period.clone())
            .prop_map(|(limit, period_ms)| Algorithm::SlidingWindow { limit, period_ms }),
        (1u64..6, period).prop_map(|(limit, period_ms)| Algorithm::SlidingLog { limit, period_ms }),
        (1u64..6, rate.clone()).prop_map(|(burst, rate)| Algorithm::Gcra { rate, burst }),
        (1u64..6, rate.clone()).prop_map(|(burst, rate)| Algorithm::TokenBucket { rate, burst }),
        (1u64..6, rate).prop_map(|(burst, rate)| Algorithm::LeakyBucket {
            rate,
            burst,
            mode: LeakyMode::Reject
        }),
    ]
}

/// Across slots (a dry run, then the commits) the cluster decides exactly as one atomic call would: as the
/// in-process store does, including "a denied request consumes nothing". A property test run by hand rather than
/// with `proptest!`, so that the cluster belongs to the test and is stopped when it ends.
#[test]
fn cluster_across_slots_decides_like_the_memory_store() {
    let cluster = RedisCluster::start();
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let store = runtime.block_on(async {
        let store =
            RedisStore::connect(&cluster.url(), 1, Duration::from_secs(1)).expect("connect");
        assert!(store.wait_connected(Duration::from_secs(10)).await);
        store
    });
    let steps = prop::collection::vec((prop_oneof![Just(0i64), 0i64..1_500], 1u64..3), 1..30);
    let case = AtomicUsize::new(0);
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let result = runner.run(
        &(slow_algorithm(), slow_algorithm(), steps),
        |(first, second, steps)| {
            let case = case.fetch_add(1, Ordering::SeqCst);
            let memory = MemoryStore::new(10_000, Arc::new(ManualClock::new(0)));
            let key_a = format!("p:a:{{a{case}}}");
            let key_b = format!("p:b:{{b{case}x}}");
            prop_assert_ne!(
                redis_keyslot(key_a.as_bytes()),
                redis_keyslot(key_b.as_bytes())
            );
            // A multiple of both periods: fixed windows start here and outlive the case.
            let mut now: i64 = 14_166_667 * 120_000;
            for (i, (delta, cost)) in steps.into_iter().enumerate() {
                now += delta;
                let a = Limit::new("a", first, cost.min(first.capacity())).expect("valid");
                let b = Limit::new("b", second, cost.min(second.capacity())).expect("valid");
                let checks = [
                    LimitCheck {
                        key: &key_a,
                        limit: &a,
                    },
                    LimitCheck {
                        key: &key_b,
                        limit: &b,
                    },
                ];
                let expected = memory.check_at(now, &checks);
                let actual = runtime
                    .block_on(store.check(&checks, Some(now)))
                    .expect("redis");
                prop_assert_eq!(&actual, &expected, "step {} at {} (cost {})", i, now, cost);
            }
            Ok(())
        },
    );
    if let Err(error) = result {
        panic!("{error}");
    }
}

// === Sentinel ===

/// Waits, at most `within`, until the gateway limits on `new_master`: a fresh key is admitted exactly 5 times and
/// its state is on that server. Returns how long it took.
async fn limits_on_the_new_master(
    gateway: &TestGateway,
    sentinel: &RedisSentinel,
    new_master: u16,
    within: Duration,
) -> Duration {
    let mut attempt = 0;
    let (mut statuses, mut on_new_master) = (Vec::new(), None);
    let took = eventually(within, async || {
        attempt += 1;
        let tenant = format!("after-{attempt}");
        statuses = send(gateway, 7, Some(&tenant)).await;
        let key = format!("tollgate:spread:per-tenant:{{{tenant}}}");
        on_new_master = sentinel.cli(new_master, &["ZCARD", &key]);
        statuses == [200, 200, 200, 200, 200, 429, 429] && on_new_master.as_deref() == Some("5")
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "limiting never moved to the new master: {statuses:?}, ZCARD there {on_new_master:?}"
        )
    });
    println!("limiting on the new master {took:?} after the failover");
    took
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_limits_and_keeps_limiting_on_the_new_master_after_a_failover() {
    let sentinel = Arc::new(RedisSentinel::start());
    let store = format!(
        "  backend: redis\n  url: \"{}\"\n  timeout: 1s\n  on_error: local\n",
        sentinel.url()
    );
    let limits = "      - name: per-tenant\n        key: header:x-tenant\n        algorithm: sliding_log\n        limit: 5\n        period: 1h\n";
    let gateway = Arc::new(start_gateway(&gateway_yaml(&store, limits)).await);

    let before = send(&gateway, 7, Some("before")).await;
    assert_eq!(before, [200, 200, 200, 200, 200, 429, 429]);
    let key = "tollgate:spread:per-tenant:{before}";
    assert_eq!(
        sentinel
            .cli(sentinel.master_port, &["ZCARD", key])
            .as_deref(),
        Some("5"),
        "counted on the master"
    );

    // Traffic throughout the failover: every answer must be a decision (200 or 429), never an error.
    let stop = Arc::new(AtomicBool::new(false));
    let traffic = tokio::spawn({
        let gateway = gateway.clone();
        let stop = stop.clone();
        async move {
            let client = client();
            let mut statuses = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let response = client
                    .get(gateway.url("/spread"))
                    .header("x-tenant", "traffic")
                    .send()
                    .await
                    .expect("request");
                statuses.push(response.status().as_u16());
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            statuses
        }
    });

    let new_master = tokio::task::spawn_blocking({
        let sentinel = sentinel.clone();
        move || sentinel.failover()
    })
    .await
    .expect("failover");
    assert_eq!(new_master, sentinel.replica_port);

    // Within a bounded time the gateway limits on the new master.
    limits_on_the_new_master(&gateway, &sentinel, new_master, Duration::from_secs(90)).await;

    stop.store(true, Ordering::Relaxed);
    let statuses = traffic.await.expect("traffic task");
    assert!(!statuses.is_empty());
    assert!(
        statuses.iter().all(|s| *s == 200 || *s == 429),
        "only decisions during the failover: {statuses:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_the_announced_primary_is_followed_even_while_the_old_one_still_takes_writes() {
    // The old master cannot be demoted: the sentinel's REPLICAOF and SLAVEOF are renamed away on it, so it stays
    // a writable master after the failover and refuses nothing. Only the sentinel's +switch-master announcement
    // can move the gateway to the promoted replica.
    let sentinel = Arc::new(RedisSentinel::start_with_master_args(&[
        "--rename-command",
        "REPLICAOF",
        "replicaof-renamed-away",
        "--rename-command",
        "SLAVEOF",
        "slaveof-renamed-away",
    ]));
    let store = format!(
        "  backend: redis\n  url: \"{}\"\n  timeout: 1s\n  on_error: local\n",
        sentinel.url()
    );
    let limits = "      - name: per-tenant\n        key: header:x-tenant\n        algorithm: sliding_log\n        limit: 5\n        period: 1h\n";
    let gateway = start_gateway(&gateway_yaml(&store, limits)).await;
    assert_eq!(
        send(&gateway, 6, Some("before")).await,
        [200, 200, 200, 200, 200, 429]
    );

    let new_master = tokio::task::spawn_blocking({
        let sentinel = sentinel.clone();
        move || sentinel.failover()
    })
    .await
    .expect("failover");
    limits_on_the_new_master(&gateway, &sentinel, new_master, Duration::from_secs(20)).await;
    assert!(
        sentinel
            .cli(sentinel.master_port, &["ROLE"])
            .is_some_and(|role| role.starts_with("master")),
        "the old master was to stay a master for this test"
    );
}

// === Authentication ===

/// One limit keyed by the tenant header: 3 per hour.
const PER_TENANT_3: &str = "      - name: per-tenant\n        key: header:x-tenant\n        algorithm: sliding_log\n        limit: 3\n        period: 1h\n";

/// A store section for `url` that makes any Redis error visible as 503.
fn deny_on_error(url: &str, timeout: &str) -> String {
    format!("  backend: redis\n  url: \"{url}\"\n  timeout: {timeout}\n  on_error: deny\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_protected_redis_limits_with_the_right_password() {
    let redis = RedisServer::start_with_password("pa:ss@word");
    // Reserved characters in the password are percent-encoded in the URL.
    let url = format!("redis://:pa%3Ass%40word@127.0.0.1:{}", redis.port);
    let gateway = start_gateway(&gateway_yaml(&deny_on_error(&url, "2s"), PER_TENANT_3)).await;
    assert_eq!(send(&gateway, 4, Some("t")).await, [200, 200, 200, 429]);
    assert_eq!(
        redis
            .cli(&["ZCARD", "tollgate:spread:per-tenant:{t}"])
            .as_deref(),
        Some("3")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_limits_within_its_key_pattern_and_is_refused_outside_it() {
    let redis = RedisServer::start_with_password("admin");
    for (user, pattern) in [("tollgate", "~tollgate:*"), ("elsewhere", "~other:*")] {
        assert_eq!(
            redis
                .cli(&["ACL", "SETUSER", user, "on", ">secret", pattern, "+@all"])
                .as_deref(),
            Some("OK")
        );
    }

    let url = format!("redis://tollgate:secret@127.0.0.1:{}", redis.port);
    let gateway = start_gateway(&gateway_yaml(&deny_on_error(&url, "2s"), PER_TENANT_3)).await;
    assert_eq!(send(&gateway, 4, Some("t")).await, [200, 200, 200, 429]);
    assert_eq!(
        redis
            .cli(&["ZCARD", "tollgate:spread:per-tenant:{t}"])
            .as_deref(),
        Some("3")
    );
    // The user has no pub/sub channel (Redis 7's default for a new user): the reset cannot be announced to other
    // instances, but it still happens, here and in Redis.
    assert_eq!(reset_tenant(&gateway, "t").await, 200);
    assert_eq!(
        redis
            .cli(&["EXISTS", "tollgate:spread:per-tenant:{t}"])
            .as_deref(),
        Some("0")
    );
    assert_eq!(send(&gateway, 1, Some("t")).await, [200]);

    // Logged in, but the keys are not this user's: every check fails (NOPERM), visibly.
    let url = format!("redis://elsewhere:secret@127.0.0.1:{}", redis.port);
    let gateway = start_gateway(&gateway_yaml(&deny_on_error(&url, "2s"), PER_TENANT_3)).await;
    assert_eq!(send(&gateway, 2, Some("t")).await, [503, 503]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_make_the_store_fail_fast_instead_of_hanging() {
    let redis = RedisServer::start_with_password("right");
    for url in [
        format!("redis://:wrong@127.0.0.1:{}", redis.port),
        format!("redis://nobody:right@127.0.0.1:{}", redis.port),
    ] {
        let store =
            RedisStore::connect(&url, 1, Duration::from_secs(1)).expect("the URL itself is valid");
        assert!(
            !store.wait_connected(Duration::from_secs(1)).await,
            "{url} must not connect"
        );
        let gateway = start_gateway_without_waiting(&gateway_yaml(
            &deny_on_error(&url, "300ms"),
            PER_TENANT_3,
        ))
        .await;
        let started = Instant::now();
        let statuses = send(&gateway, 5, Some("t")).await;
        assert_eq!(count(&statuses, 503), 5, "{url}: {statuses:?}");
        // Each request waits at most the store timeout; nothing queues behind a connection that never comes.
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{url}: {:?}",
            started.elapsed()
        );
    }
}

// === TLS ===

/// A CA and a server certificate for 127.0.0.1 signed by it, as PEM files in `dir`: `(ca, cert, key)`.
fn tls_files(dir: &Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
    let ca = TestCa::new(dir, name);
    let server = ca.issue("server", &["127.0.0.1"]);
    (ca.ca_file, server.cert_file, server.key_file)
}

/// Runs the `tollgate` binary on `config`, trusting the certificates in `ca_file` (rustls-native-certs reads
/// `SSL_CERT_FILE` instead of the system store); returns it once it listens, and its `/spread` URL.
fn run_tollgate(dir: &Path, name: &str, store: &str, ca_file: &Path) -> (Tollgate, String) {
    let yaml = format!(
        "admin:\n  listen: 127.0.0.1:0\n{}",
        gateway_yaml(store, PER_TENANT_3)
    );
    let config = dir.join(format!("{name}.yaml"));
    std::fs::write(&config, yaml).expect("write config");
    let mut command = Tollgate::command(&config);
    command
        .env("SSL_CERT_FILE", ca_file)
        .env_remove("SSL_CERT_DIR");
    let gateway = Tollgate::spawn(command);
    let url = gateway.url("/spread");
    (gateway, url)
}

async fn get_status(url: &str, tenant: &str) -> u16 {
    client()
        .get(url)
        .header("x-tenant", tenant)
        .send()
        .await
        .expect("request")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_limits_over_tls_trusting_only_the_configured_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca, cert, key) = tls_files(dir.path(), "server");
    let (other_ca, _, _) = tls_files(dir.path(), "other");
    // Reserved for the test's length, and bound by redis-server as well (see ReservedPort).
    let tls = ReservedPort::new();
    let tls_port = tls.port;
    // The plain port stays open for redis-cli; the gateway only ever gets the TLS port.
    let redis = RedisServer::start_with(
        &[
            "--tls-port",
            &tls_port.to_string(),
            "--tls-cert-file",
            &cert.to_string_lossy(),
            "--tls-key-file",
            &key.to_string_lossy(),
            "--tls-ca-cert-file",
            &ca.to_string_lossy(),
            "--tls-auth-clients",
            "no",
        ],
        &[],
    );
    let store = deny_on_error(&format!("rediss://127.0.0.1:{tls_port}"), "2s");

    let (_trusting, url) = run_tollgate(dir.path(), "trusting", &store, &ca);
    // Bounded wait for the first TLS connection (503 until then, with `on_error: deny`).
    let connected = eventually(Duration::from_secs(30), async || {
        get_status(&url, "probe").await == 200
    })
    .await;
    assert!(connected.is_some(), "no TLS connection to redis");
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(get_status(&url, "t").await);
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    assert_eq!(
        redis
            .cli(&["ZCARD", "tollgate:spread:per-tenant:{t}"])
            .as_deref(),
        Some("3")
    );

    // A gateway that trusts another CA refuses the server's certificate: it finds Redis unreachable at
    // start-up, logs why, and the store fails, visibly.
    let (distrusting, url) = run_tollgate(dir.path(), "distrusting", &store, &other_ca);
    let mut output = String::new();
    let logged = eventually(Duration::from_secs(30), async || {
        output = distrusting.log();
        output.contains("REDIS IS UNREACHABLE")
            && output.contains("redis failed")
            && output.contains("UnknownIssuer")
    })
    .await;
    assert!(logged.is_some(), "{output}");
    for _ in 0..3 {
        assert_eq!(get_status(&url, "u").await, 503);
    }
    assert_eq!(
        redis
            .cli(&["EXISTS", "tollgate:spread:per-tenant:{u}"])
            .as_deref(),
        Some("0")
    );
}

/// The id of the node at `port` and the ids and ports of the node owning `slot`, from `CLUSTER NODES`.
fn slot_owner(cluster: &RedisCluster, slot: u16) -> (usize, String) {
    let nodes = cluster
        .cli(0, &["CLUSTER", "NODES"])
        .expect("cluster nodes");
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let owns = fields.iter().skip(8).any(|range| {
            let (start, end) = range.split_once('-').unwrap_or((range, range));
            match (start.parse::<u16>(), end.parse::<u16>()) {
                (Ok(start), Ok(end)) => (start..=end).contains(&slot),
                _ => false,
            }
        });
        if owns {
            let port: u16 = fields[1]
                .split(['@', ':'])
                .nth(1)
                .and_then(|port| port.parse().ok())
                .expect("node port");
            let index = cluster
                .ports
                .iter()
                .position(|&p| p == port)
                .expect("a node of ours");
            return (index, fields[0].to_owned());
        }
    }
    panic!("no node owns slot {slot}:\n{nodes}");
}

fn node_id(cluster: &RedisCluster, index: usize) -> String {
    cluster.cli(index, &["CLUSTER", "MYID"]).expect("node id")
}

/// A fixed window no test outlives: it began at the epoch and ends some 140,000 years on, so that the counts a test
/// compares are never cut short by a window's end (an hour's window ends on the hour, mid-test now and then).
const ONE_WINDOW_MS: u64 = tollgate::limiter::MAX_SCALED;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_slot_migration_under_load_keeps_limits_shared_through_the_move() {
    use tollgate::limiter::{Backend, OnError, RateLimiter, SystemClock};
    let cluster = RedisCluster::start();
    let store =
        RedisStore::connect(&cluster.url(), 2, Duration::from_millis(200)).expect("connect");
    assert!(store.wait_connected(Duration::from_secs(10)).await);
    let limiter = Arc::new(RateLimiter::new(
        Backend::Redis(store),
        Duration::from_millis(200),
        OnError::Deny,
        1_000,
        Arc::new(SystemClock),
    ));
    let limit = Limit::new(
        "per-key",
        Algorithm::FixedWindow {
            limit: 1_000_000,
            period_ms: ONE_WINDOW_MS,
        },
        1,
    )
    .expect("valid");
    let key = "tollgate:migrate:per-key:{moving}";
    let slot = redis_keyslot(key.as_bytes());
    let (source, source_id) = slot_owner(&cluster, slot);
    let target = (source + 1) % 3;
    let target_id = node_id(&cluster, target);

    // Load: one call after another, each result timed.
    let (stop, calls) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    let load = {
        let (limiter, stop, limit) = (Arc::clone(&limiter), Arc::clone(&stop), limit.clone());
        let calls = Arc::clone(&calls);
        tokio::spawn(async move {
            let mut results = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let check = LimitCheck { key, limit: &limit };
                let ok = limiter.check(&[check]).await.is_ok_and(|o| o.allowed);
                results.push((Instant::now(), ok, limiter.fallback_active()));
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            results
        })
    };
    let run = |node: usize, args: Vec<String>| {
        let port = cluster.ports[node];
        async move {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                common::redis::redis_cli(port, &[], &args)
            })
            .await
            .expect("cli")
        }
    };
    let strings = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The three steps: both ends marked, the key moved, the slot handed over.
    let slot_text = slot.to_string();
    let importing = run(
        target,
        strings(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &source_id]),
    )
    .await;
    assert_eq!(importing.as_deref(), Some("OK"));
    let migrating = run(
        source,
        strings(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &target_id]),
    )
    .await;
    assert_eq!(migrating.as_deref(), Some("OK"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let target_port = cluster.ports[target].to_string();
    let migrated = run(
        source,
        strings(&[
            "MIGRATE",
            "127.0.0.1",
            &target_port,
            "",
            "0",
            "5000",
            "KEYS",
            key,
        ]),
    )
    .await;
    assert_eq!(migrated.as_deref(), Some("OK"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    for node in [target, source, (source + 2) % 3] {
        let handed = run(
            node,
            strings(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &target_id]),
        )
        .await;
        assert_eq!(handed.as_deref(), Some("OK"), "node {node}");
    }
    let moved = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The load runs on for a while, and for at least a few calls however slow the machine.
    let made = calls.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let ran_on = eventually(Duration::from_secs(10), async || {
        calls.load(Ordering::SeqCst) > made + 10
    })
    .await;
    assert!(ran_on.is_some(), "the load stalled after the move");
    stop.store(true, Ordering::Relaxed);
    let results = load.await.expect("load");

    // No call met the move: one on a key already moved while the slot migrated was sent where the key went
    // (ASK), and one after the hand-over to the slot's new owner (MOVED); the fallback never ran.
    let failed: Vec<Duration> = results
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(at, _, _)| at.saturating_duration_since(moved))
        .collect();
    assert!(
        results
            .iter()
            .filter(|(at, _, _)| *at > moved + Duration::from_millis(300))
            .count()
            > 10,
        "load ran on after the move"
    );
    assert!(
        failed.is_empty(),
        "{} calls failed, the last {:?} after the hand-over",
        failed.len(),
        failed.last()
    );
    assert!(results.iter().all(|(_, _, fallback)| !fallback));
    assert!(limiter.readiness().ready, "{:?}", limiter.readiness());
    // Every admitted call was counted by the cluster, on the node that owns the slot now.
    let admitted = results.iter().filter(|(_, ok, _)| *ok).count();
    let stored = cluster
        .cli(
            target,
            &[
                "EVAL",
                "return {struct.unpack('<Bdd', redis.call('GET', KEYS[1]))}",
                "1",
                key,
            ],
        )
        .unwrap_or_default();
    let count: Vec<&str> = stored.lines().collect();
    assert_eq!(
        count.get(2).copied(),
        Some(admitted.to_string().as_str()),
        "{stored}"
    );
}

/// A key whose hash tag is not `tag`'s but whose slot is: two clients on one slot, so that one's keys can be moved
/// before the other's.
fn another_key_in_the_slot_of(tag: &str, prefix: &str) -> String {
    format!("{prefix}{{{}}}", other_tags_in_the_slot_of(tag, 1)[0])
}

/// `n` hash tags, none `tag`, whose slot is `tag`'s.
fn other_tags_in_the_slot_of(tag: &str, n: usize) -> Vec<String> {
    let slot = redis_keyslot(tag.as_bytes());
    (0u32..)
        .map(|i| format!("other-{i}"))
        .filter(|other| redis_keyslot(other.as_bytes()) == slot)
        .take(n)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_checks_on_keys_already_migrated_are_decided_by_redis_while_the_slot_migrates() {
    use tollgate::limiter::{Backend, DecidedBy, OnError, RateLimiter, SystemClock};
    let cluster = RedisCluster::start();
    // Two instances sharing the cluster, each refusing (503) what Redis does not decide.
    let mut limiters = Vec::new();
    for _ in 0..2 {
        let store =
            RedisStore::connect(&cluster.url(), 2, Duration::from_millis(500)).expect("connect");
        assert!(store.wait_connected(Duration::from_secs(10)).await);
        limiters.push(Arc::new(RateLimiter::new(
            Backend::Redis(store),
            Duration::from_millis(500),
            OnError::Deny,
            1_000,
            Arc::new(SystemClock),
        )));
    }
    let limit = Limit::new(
        "l",
        Algorithm::FixedWindow {
            limit: 1_000_000,
            period_ms: ONE_WINDOW_MS,
        },
        1,
    )
    .expect("valid");
    // Four requests on one slot: one limit of a client whose keys move first, two limits of that client (a
    // script call on two keys), one limit of another client whose key moves last, and, once the first keys moved,
    // two limits of a client new each time (its keys exist nowhere: Redis refuses a call on both at the importing
    // node until the hand-over).
    let moved = "tollgate:mig:one:{moved}";
    let pair = ["tollgate:mig:p1:{moved}", "tollgate:mig:p2:{moved}"];
    let staying = another_key_in_the_slot_of("moved", "tollgate:mig:one:");
    let slot = redis_keyslot(moved.as_bytes());
    assert_eq!(redis_keyslot(staying.as_bytes()), slot);
    let (source, source_id) = slot_owner(&cluster, slot);
    let target = (source + 1) % 3;
    let target_id = node_id(&cluster, target);

    // Phases of the move, as the load sees them: 0 before the first MIGRATE, 1 while `moved`'s keys are on the
    // new node and `staying`'s on the old, 2 once all are, 3 once the slot is handed over.
    let phase = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // How many rounds of the load asked for a new client while `moved`'s keys alone had moved (phase 1).
    let new_while_moving = Arc::new(AtomicUsize::new(0));
    let mut loads = Vec::new();
    let mut new_clients = other_tags_in_the_slot_of("moved", 401).split_off(1);
    for limiter in &limiters {
        let mut new_clients = new_clients.split_off(new_clients.len() / 2);
        let (limiter, stop, phase, limit) = (
            Arc::clone(limiter),
            Arc::clone(&stop),
            Arc::clone(&phase),
            limit.clone(),
        );
        let new_while_moving = Arc::clone(&new_while_moving);
        let staying = staying.clone();
        loads.push(tokio::spawn(async move {
            // (phase, which request, decided by Redis and admitted, fallback flag)
            let mut results: Vec<(usize, usize, bool, bool)> = Vec::new();
            let mut used = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let at = phase.load(Ordering::SeqCst);
                let one = [LimitCheck {
                    key: moved,
                    limit: &limit,
                }];
                let two = pair.map(|key| LimitCheck { key, limit: &limit });
                let other = [LimitCheck {
                    key: &staying,
                    limit: &limit,
                }];
                let new_client = if at >= 1 { new_clients.pop() } else { None };
                let new_keys = new_client.as_ref().map(|tag| {
                    [
                        format!("tollgate:mig:n1:{{{tag}}}"),
                        format!("tollgate:mig:n2:{{{tag}}}"),
                    ]
                });
                let new_checks: Vec<LimitCheck<'_>> = new_keys
                    .iter()
                    .flatten()
                    .map(|key| LimitCheck { key, limit: &limit })
                    .collect();
                // Together, so that they share script calls.
                let decided = tokio::join!(
                    limiter.check_leased(&one, 0),
                    limiter.check_leased(&two, 0),
                    limiter.check_leased(&other, 0),
                    async {
                        if new_checks.is_empty() {
                            None
                        } else {
                            Some(limiter.check_leased(&new_checks, 0).await)
                        }
                    }
                );
                let new = decided.3.map(|decision| (3, decision));
                for (which, decision) in [(0, decided.0), (1, decided.1), (2, decided.2)]
                    .into_iter()
                    .chain(new)
                {
                    let by_redis = matches!(decision, Ok((o, DecidedBy::Store)) if o.allowed);
                    results.push((at, which, by_redis, limiter.fallback_active()));
                }
                if at == 1 && !new_checks.is_empty() {
                    new_while_moving.fetch_add(1, Ordering::SeqCst);
                }
                used.extend(new_keys.into_iter().flatten());
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (results, used)
        }));
    }
    let run = |node: usize, args: Vec<String>| {
        let port = cluster.ports[node];
        async move {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                common::redis::redis_cli(port, &[], &args)
            })
            .await
            .expect("cli")
        }
    };
    let strings = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let slot_text = slot.to_string();
    let target_port = cluster.ports[target].to_string();
    let migrate = |keys: &[&str]| {
        let mut args = strings(&[
            "MIGRATE",
            "127.0.0.1",
            &target_port,
            "",
            "0",
            "5000",
            "KEYS",
        ]);
        args.extend(keys.iter().map(|k| (*k).to_owned()));
        run(source, args)
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Step 1: both ends marked.
    let importing = run(
        target,
        strings(&["CLUSTER", "SETSLOT", &slot_text, "IMPORTING", &source_id]),
    )
    .await;
    assert_eq!(importing.as_deref(), Some("OK"));
    let migrating = run(
        source,
        strings(&["CLUSTER", "SETSLOT", &slot_text, "MIGRATING", &target_id]),
    )
    .await;
    assert_eq!(migrating.as_deref(), Some("OK"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Step 2: one client's keys moved, the other's not yet; then theirs too.
    assert_eq!(
        migrate(&[moved, pair[0], pair[1]]).await.as_deref(),
        Some("OK")
    );
    phase.store(1, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(600)).await;
    // A while, and enough rounds however slow the machine (each asks both of `moved`'s and a new client's keys).
    let enough = eventually(Duration::from_secs(10), async || {
        new_while_moving.load(Ordering::SeqCst) > 12
    })
    .await;
    assert!(enough.is_some(), "the load stalled while the slot migrated");
    phase.store(2, Ordering::SeqCst);
    assert_eq!(migrate(&[&staying]).await.as_deref(), Some("OK"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Step 3: the slot handed over.
    for node in [target, source, (source + 2) % 3] {
        let handed = run(
            node,
            strings(&["CLUSTER", "SETSLOT", &slot_text, "NODE", &target_id]),
        )
        .await;
        assert_eq!(handed.as_deref(), Some("OK"), "node {node}");
    }
    phase.store(3, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut results, mut new_keys) = (Vec::new(), Vec::new());
    for load in loads {
        let (load_results, used) = load.await.expect("load");
        results.extend(load_results);
        new_keys.extend(used);
    }

    // Redis decided every request, the moved keys' while the slot was still migrating, and no fallback ran.
    let moved_while_migrating = results
        .iter()
        .filter(|(phase, which, _, _)| *phase == 1 && *which < 2)
        .count();
    assert!(
        moved_while_migrating > 20,
        "{moved_while_migrating} checks on the moved keys"
    );
    let new_while_migrating = results
        .iter()
        .filter(|(phase, which, _, _)| *phase == 1 && *which == 3)
        .count();
    assert!(
        new_while_migrating > 10,
        "{new_while_migrating} checks of new clients"
    );
    let refused: Vec<_> = results
        .iter()
        .filter(|(_, _, by_redis, _)| !by_redis)
        .collect();
    assert!(
        refused.is_empty(),
        "{} of {} checks not decided by redis (phase, request): {:?}",
        refused.len(),
        results.len(),
        refused
            .iter()
            .map(|(p, w, _, _)| (p, w))
            .take(20)
            .collect::<Vec<_>>()
    );
    assert!(results.iter().all(|(_, _, _, fallback)| !fallback));
    for limiter in &limiters {
        assert!(limiter.readiness().ready, "{:?}", limiter.readiness());
    }
    // Each admission counted once, by the node that owns the slot now, across both instances.
    let stored = |key: &str| {
        cluster
            .cli(
                target,
                &[
                    "EVAL",
                    "return {struct.unpack('<Bdd', redis.call('GET', KEYS[1]))}",
                    "1",
                    key,
                ],
            )
            .unwrap_or_default()
            .lines()
            .nth(2)
            .map(str::to_owned)
    };
    let admitted = |which: usize| results.iter().filter(|(_, w, _, _)| *w == which).count();
    let expected = [
        (moved, admitted(0)),
        (pair[0], admitted(1)),
        (pair[1], admitted(1)),
        (staying.as_str(), admitted(2)),
    ];
    for (key, admitted) in expected {
        assert_eq!(stored(key), Some(admitted.to_string()), "{key}");
    }
    // Each new client's two limits counted its one request once.
    let script = "local n = {} for i, key in ipairs(KEYS) do local v = redis.call('GET', key) \
                  n[i] = v and select(3, struct.unpack('<Bdd', v)) or -1 end return n";
    let count = new_keys.len().to_string();
    let mut args = vec!["EVAL", script, &count];
    args.extend(new_keys.iter().map(String::as_str));
    let counts = cluster.cli(target, &args).unwrap_or_default();
    assert_eq!(counts.lines().count(), new_keys.len(), "{counts}");
    assert!(counts.lines().all(|count| count == "1"), "{counts}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_evictions_on_any_primary_are_counted_and_named_in_readyz() {
    let cluster = RedisCluster::start();
    // The second primary alone may evict: the health check must read every primary, not the one it reaches.
    for setting in [["maxmemory", "4mb"], ["maxmemory-policy", "allkeys-lru"]] {
        let set = cluster.cli(1, &["CONFIG", "SET", setting[0], setting[1]]);
        assert_eq!(set.as_deref(), Some("OK"));
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    let store = format!(
        "  backend: redis\n  url: {}\n  timeout: 500ms\nadmin:\n  listen: 127.0.0.1:0\n",
        cluster.url()
    );
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, gateway_yaml(&store, PER_TENANT_3)).expect("write config");
    let gateway = Tollgate::run(&config);
    let admin = gateway.admin_url("");
    let url = gateway.url("/spread");
    assert!(
        eventually(Duration::from_secs(10), async || get_status(&url, "t")
            .await
            == 200)
        .await
        .is_some()
    );
    // Where the primaries stand is read at connect; the flood comes after it.
    let ready = eventually(Duration::from_secs(10), async || {
        let body = common::http_client::readyz_text(&admin).await;
        body.contains("\"ready\"")
    })
    .await;
    assert!(ready.is_some(), "{}", gateway.log());
    assert_eq!(common::http_client::evicted_keys_counted(&admin).await, 0.0);

    // Keys without a hash tag sent to the second node: the third of them its slots own are written (the others
    // answer MOVED), 20 MB on a 4 MB limit. Where each primary stands is read at connect, in the background: on a
    // loaded machine that reading may come after a first flood, which is then where counting starts, and only a
    // later flood is news. Three floods at most.
    let port = cluster.ports[1];
    let mut last = String::new();
    let mut told = None;
    for round in 0..3 {
        let tag = format!("cluster{round}");
        tokio::task::spawn_blocking(move || common::redis::flood(port, 60_000, &tag))
            .await
            .expect("flood");
        told = eventually(Duration::from_secs(5), async || {
            last = common::http_client::readyz_text(&admin).await;
            last.contains("evicted")
                && common::http_client::evicted_keys_counted(&admin).await > 0.0
        })
        .await;
        if told.is_some() {
            break;
        }
    }
    assert!(told.is_some(), "{last}\n{}", gateway.log());
    assert_eq!(
        gateway.log().matches("redis is evicting keys").count(),
        1,
        "{}",
        gateway.log()
    );
}
