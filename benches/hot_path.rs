//! Criterion benches of the per-request hot path: route match, key build, the in-process store's decision per
//! algorithm, the whole limiter call, and the rate-limit headers; each beside a naive baseline where one makes
//! sense.
//!
//! Run with `cargo bench --bench hot_path` (about two minutes); `cargo bench --bench hot_path -- memory_store`
//! runs one group.

use std::collections::HashMap;
use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use http::{HeaderMap, HeaderValue, Method, StatusCode};

use tollgate::admission::LimitSettings;
use tollgate::admission::{Checked, LimitRequest, LimitSet};
use tollgate::key::{store_key, ClientIpResolver, KeyPart, KeySpec, MissingKey, RequestFacts};
use tollgate::limiter::store::{LimitCheck, MemoryStore};
use tollgate::limiter::{
    Algorithm, Backend, LeakyMode, Limit, ManualClock, OnError, Rate, RateLimiter, SystemClock,
};
use tollgate::routing::RouteMatch;
use tollgate::routing::{normalize_path, CanonicalRequest, Matcher, RequestTarget};

/// A fixed instant (2025-01-01T00:00:00Z) so that every run sees the same window alignment.
const NOW_MS: i64 = 1_735_689_600_000;
/// Distinct client keys in the "many keys" benches: well beyond any CPU cache line reuse.
const MANY_KEYS: usize = 100_000;

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
}

// === route matching ===

fn routes() -> Vec<Matcher> {
    let mut table: Vec<Matcher> = (0..9)
        .map(|i| {
            Matcher::new(&RouteMatch {
                path_prefix: Some(format!("/service-{i}")),
                methods: vec![Method::GET, Method::POST],
                ..RouteMatch::default()
            })
        })
        .collect();
    table.push(Matcher::new(&RouteMatch {
        path_prefix: Some("/api".into()),
        methods: vec![Method::GET, Method::POST, Method::PUT, Method::DELETE],
        host: Some("*.example.com".into()),
        ..RouteMatch::default()
    }));
    table
}

fn route_match(c: &mut Criterion) {
    let table = routes();
    let mut group = c.benchmark_group("route_match");
    let first = RequestTarget {
        method: &Method::GET,
        host: Some("api.example.com"),
        path: "/service-0/users/42",
    };
    group.bench_function("first_of_10", |b| {
        b.iter(|| table.iter().position(|m| m.matches(black_box(&first))))
    });
    let last = RequestTarget {
        method: &Method::GET,
        host: Some("api.example.com"),
        path: "/api/v1/users/42",
    };
    group.bench_function("tenth_of_10_with_host", |b| {
        b.iter(|| table.iter().position(|m| m.matches(black_box(&last))))
    });
    // The naive baseline: raw string prefixes, no segment, method or host check.
    let prefixes: Vec<String> = (0..9)
        .map(|i| format!("/service-{i}"))
        .chain(["/api".to_owned()])
        .collect();
    group.bench_function("baseline_starts_with_tenth", |b| {
        b.iter(|| {
            prefixes
                .iter()
                .position(|p| black_box(last.path).starts_with(p.as_str()))
        })
    });
    group.bench_function("normalize_path_clean", |b| {
        b.iter(|| normalize_path(black_box("/api/v1/users/42")).map(|p| p.len()))
    });
    group.bench_function("normalize_path_dot_segments", |b| {
        b.iter(|| normalize_path(black_box("/api/v1/../v2//users/./42")).map(|p| p.len()))
    });
    // The whole canonical reading of a plain request (method, path, one Host), against the baseline of looking
    // at the path and the Host field as they are.
    let uri: http::Uri = "/api/v1/users/42?page=2".parse().expect("uri");
    let mut headers = HeaderMap::new();
    headers.insert(
        http::header::HOST,
        HeaderValue::from_static("api.example.com:8080"),
    );
    headers.insert(http::header::ACCEPT, HeaderValue::from_static("*/*"));
    group.bench_function("canonical_request_plain", |b| {
        b.iter(|| {
            CanonicalRequest::new(
                black_box(&Method::GET),
                http::Version::HTTP_11,
                black_box(&uri),
                black_box(&headers),
            )
            .map(|c| c.path.len())
        })
    });
    group.bench_function("baseline_path_and_host_as_sent", |b| {
        b.iter(|| {
            let host = black_box(&headers)
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned);
            black_box(&uri).path().len() + host.map_or(0, |h| h.len())
        })
    });
    let encoded: http::Uri = "http://API.Example.com./%61pi/v1/%2e%2e/users/42"
        .parse()
        .expect("uri");
    group.bench_function("canonical_request_absolute_and_encoded", |b| {
        b.iter(|| {
            CanonicalRequest::new(
                black_box(&Method::GET),
                http::Version::HTTP_11,
                black_box(&encoded),
                black_box(&headers),
            )
            .map(|c| c.path.len())
        })
    });
    group.finish();
}

// === keys ===

fn key_build(c: &mut Criterion) {
    let mut group = c.benchmark_group("key_build");
    let mut headers = HeaderMap::new();
    headers.insert("x-api-key", HeaderValue::from_static("k-1234567890abcdef"));
    headers.insert(
        "x-forwarded-for",
        HeaderValue::from_static("203.0.113.9, 10.0.0.7"),
    );
    let peer = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
    let client = IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9));
    let facts = RequestFacts {
        client_ip: client,
        ipv6_prefix: 64,
        route: "api",
        method: &Method::GET,
        path: "/api/v1/users/42",
        path_any_case: false,
        host: Some("api.example.com"),
        headers: &headers,
        query: Some("page=2&tenant=acme"),
        consumer: None,
        plan: None,
        client_cert: None,
    };

    let untrusted = ClientIpResolver::new(Vec::new());
    group.bench_function("client_ip_no_trusted_proxies", |b| {
        b.iter(|| untrusted.resolve(black_box(peer), black_box(&headers)))
    });
    let trusted = ClientIpResolver::new(vec![
        "10.0.0.0/8".parse().expect("cidr"),
        "192.168.0.0/16".parse().expect("cidr"),
    ]);
    group.bench_function("client_ip_through_xff", |b| {
        b.iter(|| trusted.resolve(black_box(peer), black_box(&headers)))
    });

    let ip = KeySpec::new(vec![KeyPart::Ip], MissingKey::Ip);
    group.bench_function("ip_value_and_store_key", |b| {
        b.iter(|| {
            let value = ip
                .value(black_box(&facts))
                .ok()
                .flatten()
                .unwrap_or_default();
            store_key("tollgate:", "api", "per-ip", &value)
        })
    });
    // The naive baseline: one format! of the address, no escaping check.
    group.bench_function("baseline_format_ip_key", |b| {
        b.iter(|| format!("tollgate:api:per-ip:{{{}}}", black_box(client)))
    });
    let composite = KeySpec::new(
        vec![
            KeyPart::Header("x-api-key".parse().expect("header name")),
            KeyPart::Query("tenant".into()),
            KeyPart::Method,
        ],
        MissingKey::Ip,
    );
    group.bench_function("header_query_method_store_key", |b| {
        b.iter(|| {
            let value = composite
                .value(black_box(&facts))
                .ok()
                .flatten()
                .unwrap_or_default();
            store_key("tollgate:", "api", "per-key", &value)
        })
    });
    let long = "x".repeat(200);
    group.bench_function("store_key_digest_of_long_value", |b| {
        b.iter(|| store_key("tollgate:", "api", "per-key", black_box(&long)))
    });
    // What identifying an API-key consumer adds to a request above all: the key's SHA-256 (docs/configuration.md, "Consumers and plans"). On
    // hardware with SHA extensions, sha2 uses them; under valgrind (bench/gateway_cost.py) it cannot.
    let issued = format!("tg_{}", "5a".repeat(32));
    group.bench_function("api_key_digest_issued_key", |b| {
        b.iter(|| tollgate::consumers::api_key_digest(black_box(&issued)))
    });
    group.finish();
}

// === in-process store ===

fn algorithms() -> Vec<(&'static str, Algorithm)> {
    let rate = |count, period_ms| Rate::new(count, period_ms).expect("rate");
    // Large enough that nothing is ever denied: the bench measures the admitting path, which writes state.
    vec![
        (
            "fixed_window",
            Algorithm::FixedWindow {
                limit: 1_000_000_000,
                period_ms: 1_000,
            },
        ),
        (
            "sliding_window",
            Algorithm::SlidingWindow {
                limit: 1_000_000_000,
                period_ms: 1_000,
            },
        ),
        (
            "sliding_log",
            Algorithm::SlidingLog {
                limit: 100,
                period_ms: 1_000,
            },
        ),
        (
            "token_bucket",
            Algorithm::TokenBucket {
                rate: rate(1_000_000_000, 1_000),
                burst: 1_000_000_000,
            },
        ),
        (
            "gcra",
            Algorithm::Gcra {
                rate: rate(1_000_000, 1_000),
                burst: 1_000_000,
            },
        ),
        (
            "leaky_bucket",
            Algorithm::LeakyBucket {
                rate: rate(1_000_000_000, 1_000),
                burst: 1_000_000_000,
                mode: LeakyMode::Reject,
            },
        ),
    ]
}

fn store() -> MemoryStore {
    MemoryStore::new(1_000_000, Arc::new(ManualClock::new(NOW_MS)))
}

fn memory_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_store");
    for (name, algorithm) in algorithms() {
        let limit = Limit::new(name, algorithm, 1).expect("limit");
        let store = store();
        let checks = [LimitCheck {
            key: "tollgate:api:l:{203.0.113.9}",
            limit: &limit,
        }];
        // sliding_log keeps one entry per admission: a moving clock keeps its log at `limit` entries instead of
        // denying after the first 100 calls; the others see time pass the same way.
        let mut now = NOW_MS;
        group.bench_function(format!("{name}_one_key"), |b| {
            b.iter(|| {
                now += 10;
                store.check_at(now, black_box(&checks)).allowed
            })
        });
    }

    // The naive baseline: a fixed-window counter in one Mutex<HashMap>, no expiry, no bound, no decision detail.
    let naive: Mutex<HashMap<String, (i64, u64)>> = Mutex::new(HashMap::new());
    group.bench_function("baseline_mutex_hashmap_fixed_window_one_key", |b| {
        b.iter(|| naive_fixed_window(&naive, black_box("tollgate:api:l:{203.0.113.9}"), NOW_MS))
    });

    let keys: Vec<String> = (0..MANY_KEYS)
        .map(|i| {
            format!(
                "tollgate:api:l:{{10.{}.{}.{}}}",
                i >> 16,
                (i >> 8) & 255,
                i & 255
            )
        })
        .collect();
    let (_, gcra) = algorithms()
        .into_iter()
        .find(|(n, _)| *n == "gcra")
        .expect("gcra");
    let limit = Limit::new("cell", gcra, 1).expect("limit");
    let many = store();
    let mut i = 0;
    group.bench_function("gcra_100k_keys", |b| {
        b.iter(|| {
            i = (i + 1) % MANY_KEYS;
            let checks = [LimitCheck {
                key: &keys[i],
                limit: &limit,
            }];
            many.check_at(NOW_MS, black_box(&checks)).allowed
        })
    });
    let naive_many: Mutex<HashMap<String, (i64, u64)>> = Mutex::new(HashMap::new());
    let mut j = 0;
    group.bench_function("baseline_mutex_hashmap_fixed_window_100k_keys", |b| {
        b.iter(|| {
            j = (j + 1) % MANY_KEYS;
            naive_fixed_window(&naive_many, &keys[j], NOW_MS)
        })
    });

    // The three limits of bench/configs/memory-pass.yaml, checked together as one request does.
    let route: Vec<Limit> = algorithms()
        .into_iter()
        .filter(|(n, _)| matches!(*n, "sliding_window" | "token_bucket" | "gcra"))
        .map(|(n, a)| Limit::new(n, a, 1).expect("limit"))
        .collect();
    let route_keys: Vec<String> = route
        .iter()
        .map(|l| format!("tollgate:api:{}:{{203.0.113.9}}", l.name()))
        .collect();
    let checks: Vec<LimitCheck<'_>> = route
        .iter()
        .zip(&route_keys)
        .map(|(limit, key)| LimitCheck { key, limit })
        .collect();
    let three = store();
    let mut now = NOW_MS;
    group.bench_function("three_limits_one_request", |b| {
        b.iter(|| {
            now += 1;
            three.check_at(now, black_box(&checks)).allowed
        })
    });
    group.finish();
}

fn naive_fixed_window(map: &Mutex<HashMap<String, (i64, u64)>>, key: &str, now_ms: i64) -> bool {
    let window = now_ms - now_ms % 1_000;
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    let entry = match map.get_mut(key) {
        Some(entry) => entry,
        None => map.entry(key.to_owned()).or_insert((window, 0)),
    };
    if entry.0 != window {
        *entry = (window, 0);
    }
    entry.1 += 1;
    entry.1 <= 1_000_000_000
}

// === the limiter call and the headers ===

fn limit_set() -> LimitSet {
    let settings = algorithms()
        .into_iter()
        .filter(|(n, _)| matches!(*n, "sliding_window" | "token_bucket" | "gcra"))
        .map(|(n, a)| {
            LimitSettings::new(
                Limit::new(n, a, 1).expect("limit"),
                KeySpec::new(vec![KeyPart::Ip], MissingKey::Ip),
            )
        })
        .collect();
    LimitSet::new("api", "tollgate:", settings, StatusCode::TOO_MANY_REQUESTS)
}

fn memory_limiter() -> RateLimiter {
    RateLimiter::new(
        Backend::Memory,
        Duration::from_millis(25),
        OnError::Local,
        1_000_000,
        Arc::new(SystemClock),
    )
}

fn enforcement(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let set = limit_set();
    let limiter = memory_limiter();
    let headers = HeaderMap::new();
    let facts = RequestFacts {
        client_ip: IpAddr::V4(Ipv4Addr::new(203, 0, 113, 9)),
        ipv6_prefix: 64,
        route: "api",
        method: &Method::GET,
        path: "/api/v1/users/42",
        path_any_case: false,
        host: Some("api.example.com"),
        headers: &headers,
        query: None,
        consumer: None,
        plan: None,
        client_cert: None,
    };
    let mut group = c.benchmark_group("enforcement");
    let mut check = |name: &str| {
        group.bench_function(name, |b| {
            b.iter(|| {
                runtime
                    .block_on(set.check(&limiter, LimitRequest::of(black_box(&facts))))
                    .map(|v| v.outcome.allowed)
            })
        });
    };
    // First without a metrics recorder (the `metrics` macros' no-op), then as in the gateway, with the Prometheus
    // recorder installed: the difference is what the decision counters cost per request.
    check("limit_set_check_memory_three_limits_no_recorder");
    let _ = tollgate::telemetry::prometheus();
    check("limit_set_check_memory_three_limits_prometheus");
    let checked: Checked = runtime
        .block_on(set.check(&limiter, LimitRequest::of(&facts)))
        .expect("memory limiter always decides");
    group.bench_function("decorate_three_limits", |b| {
        b.iter_batched_ref(
            HeaderMap::new,
            |response| set.decorate(response, black_box(&checked)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = quick();
    targets = route_match, key_build, memory_store, enforcement
}
criterion_main!(benches);
