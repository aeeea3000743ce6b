//! Hostile key values: digested before they reach Redis (credentials too), repeated key fields, IPv6 clients per
//! /64, bytes that are not UTF-8, a flood of distinct clients within `max_keys`.

use std::sync::Arc;

use crate::common;
use crate::common::http_client::client;
use crate::common::redis::RedisServer;
use crate::common::start_gateway;
use crate::common::upstream::Upstream;
use crate::{inner_yaml, send, yaml};
use tollgate::limiter::store::{LimitCheck, MemoryStore};
use tollgate::limiter::{Algorithm, Limit, ManualClock};

#[tokio::test]
async fn hostile_key_values_are_digested_in_redis() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let extra = format!(
        "store:\n  backend: redis\n  url: {}\n  timeout: 500ms\n  on_error: deny\n",
        redis.url()
    );
    let routes = yaml(&upstream.url(), &extra).replace("key: ip", "key: [header:x-api-key]");
    let gateway = start_gateway(&routes).await;
    let client = client();
    let long = "k".repeat(10_000);
    for value in ["{slot}", "a}b{c", long.as_str(), "tab\there"] {
        let response = client
            .get(gateway.url("/api"))
            .header("x-api-key", value)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{value:.20}");
    }
    // The route's keys (the store's lost-state marker, `tollgate:epoch`, is not one of them).
    let keys = redis.cli(&["KEYS", "tollgate:api:*"]).unwrap();
    let keys: Vec<&str> = keys.lines().collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    for key in keys {
        assert!(key.len() < 100, "{key}");
        let tag = key.split_once('{').unwrap().1;
        let tag = tag.strip_suffix('}').unwrap();
        assert_eq!(tag.len(), 64, "{key}");
        assert!(tag.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
    }
}

/// SHA-256 of `text`, in hex.
fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

#[tokio::test]
async fn keys_made_from_credentials_are_digested_before_they_reach_the_store() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = format!(
        r#"store:
  backend: redis
  url: {redis}
  timeout: 500ms
  on_error: deny
upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
  anonymous: {{ plan: anonymous }}
  plans:
    anonymous:
      limits: [{{ name: by-key, key: [header:x-api-key], algorithm: sliding_log, limit: 100, period: 1h }}]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    consumers: off
    limits:
      - {{ name: by-auth, key: [header:authorization], missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
      - {{ name: by-cookie, key: [ip, header:cookie], missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
      - {{ name: by-api-key, key: [header:x-api-key], missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
      - {{ name: by-tenant, key: [header:x-tenant], secret: true, missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
      - {{ name: by-plain, key: [header:x-plain], missing: skip, algorithm: sliding_log, limit: 100, period: 1h }}
"#,
        redis = redis.url(),
        upstream = upstream.url()
    );
    let gateway = start_gateway(&yaml).await;
    let admin = common::serve_admin(&gateway, None).await;
    let client = client();
    let secrets = [
        ("authorization", "Bearer short-token"),
        ("cookie", "session=abc"),
        ("x-api-key", "live-key-1"),
        ("x-tenant", "tenant-secret"),
    ];
    let mut request = client.get(gateway.url("/api")).header("x-plain", "visible");
    for (name, value) in secrets {
        request = request.header(name, value);
    }
    assert_eq!(request.send().await.expect("request").status(), 200);

    let keys = redis.cli(&["KEYS", "*"]).expect("KEYS");
    for (_, value) in secrets {
        assert!(!keys.contains(value), "{value:?} in a store key:\n{keys}");
    }
    // Not a secret: as it was sent.
    assert!(keys.contains("tollgate:api:by-plain:{visible}"), "{keys}");
    for (limit, value) in [
        ("by-auth", "Bearer short-token".to_owned()),
        ("by-cookie", "127.0.0.1|session=abc".to_owned()),
        ("by-api-key", "live-key-1".to_owned()),
        ("by-tenant", "tenant-secret".to_owned()),
    ] {
        let key = format!("tollgate:api:{limit}:{{{}}}", sha256_hex(&value));
        assert!(keys.contains(&key), "{key} in\n{keys}");
        // The admin API takes the value as written and finds its digest.
        let url = format!("{admin}/limits/api/{limit}?key={}", urlencode(&value));
        let body: serde_json::Value = serde_json::from_str(
            &client
                .get(&url)
                .send()
                .await
                .expect("peek")
                .text()
                .await
                .expect("body"),
        )
        .expect("JSON");
        assert_eq!(body["store_key"], key.as_str(), "{body}");
        assert_eq!(body["remaining"], 99, "{body}");
    }
    // The plan's limit keyed by the consumers' key header too, though the route does not identify callers.
    assert!(!keys.contains("consumer:by-key:{live-key-1}"), "{keys}");
}

fn urlencode(text: &str) -> String {
    form_urlencoded::byte_serialize(text.as_bytes()).collect()
}

#[test]
fn a_hundred_thousand_clients_stay_within_max_keys() {
    let clock = Arc::new(ManualClock::new(1_700_000_000_000));
    let store = MemoryStore::new(10_000, clock);
    let limit = Limit::new(
        "per-ip",
        Algorithm::SlidingLog {
            limit: 10,
            period_ms: 3_600_000,
        },
        1,
    )
    .unwrap();
    for i in 0..100_000u32 {
        let ip = std::net::Ipv4Addr::from(0x0a00_0000 + i);
        let key = format!("tollgate:api:per-ip:{{{ip}}}");
        let outcome = store.check(&[LimitCheck {
            key: &key,
            limit: &limit,
        }]);
        assert!(outcome.allowed);
    }
    let held = store.len();
    assert!(held <= 10_048, "{held} keys held for max_keys 10000");
}

#[tokio::test]
async fn a_key_header_or_parameter_sent_twice_is_refused() {
    let upstream = Upstream::start().await;
    let yaml = inner_yaml(&upstream.url()).replace(
        "key: [header:x-api-key]",
        "key: [header:x-api-key, \"query:tenant\"]",
    );
    let gateway = start_gateway(&yaml).await;
    for _ in 0..3 {
        let request =
            "GET /keyed?tenant=t HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n";
        assert_eq!(send(gateway.addr, request).await.0, 200);
    }
    for request in [
        "GET /keyed?tenant=t HTTP/1.1\r\nHost: a\r\nX-Api-Key: other\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n",
        "GET /keyed?tenant=t HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\nx-api-key: k1\r\nConnection: close\r\n\r\n",
        "GET /keyed?tenant=x&tenant=t HTTP/1.1\r\nHost: a\r\nX-Api-Key: k1\r\nConnection: close\r\n\r\n",
    ] {
        let (status, body) = send(gateway.addr, request).await;
        assert_eq!(status, 400, "{request:?}: {body}");
        assert!(body.contains("\"ambiguous_key\""), "{body}");
    }
    assert_eq!(upstream.hits(), 3);
}

/// A client cannot spend another's budget by writing it: a key header that reads as an address is not the key an
/// address without the header is given (`missing: ip`), and a `|` inside one part of a composite key does not move
/// the join (`a|b` + `c` is not `a` + `b|c`).
#[tokio::test]
async fn a_key_value_cannot_be_written_as_another_clients_key() {
    let upstream = Upstream::start().await;
    // Before the catch-all route, which would take it.
    let yaml = inner_yaml(&upstream.url()).replace(
        "  - name: catch-all",
        r#"  - name: composite
    match: { path_prefix: /composite }
    upstream: backend
    limits: [{ name: per-pair, key: [header:x-api-key, "query:tenant"], algorithm: sliding_log, limit: 3, period: 1m }]
  - name: catch-all"#,
    );
    let gateway = start_gateway(&yaml).await;
    let request = |path: &str, from: &str, key: Option<&str>| {
        let key = key.map_or(String::new(), |key| format!("X-Api-Key: {key}\r\n"));
        format!("GET {path} HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: {from}\r\n{key}Connection: close\r\n\r\n")
    };
    // From 198.51.100.9, the victims' keys as values: 203.0.113.7's address, 2001:db8:1:2::/64's network.
    for victim in ["203.0.113.7", "2001:db8:1:2::/64"] {
        for expected in [200, 200, 200, 429] {
            let status = send(
                gateway.addr,
                &request("/keyed", "198.51.100.9", Some(victim)),
            )
            .await
            .0;
            assert_eq!(status, expected, "{victim}: the written value's own budget");
        }
    }
    // The victims, without the header, keyed by their address: untouched.
    for victim in ["203.0.113.7", "2001:db8:1:2::9"] {
        let status = send(gateway.addr, &request("/keyed", victim, None)).await.0;
        assert_eq!(status, 200, "{victim}'s budget was spent by a header");
    }
    for expected in [200, 200, 200, 429] {
        let status = send(
            gateway.addr,
            &request("/composite?tenant=c", "198.51.100.9", Some("a|b")),
        )
        .await
        .0;
        assert_eq!(status, expected);
    }
    let status = send(
        gateway.addr,
        &request("/composite?tenant=b%7Cc", "203.0.113.7", Some("a")),
    )
    .await
    .0;
    assert_eq!(status, 200, "a + b|c was counted as a|b + c");
}

#[tokio::test]
async fn ipv6_clients_share_a_limit_per_slash_64() {
    let upstream = Upstream::start().await;
    let gateway = start_gateway(&inner_yaml(&upstream.url())).await;
    let mut statuses = Vec::new();
    for n in 1..=6 {
        let request = format!(
            "GET /api HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 2001:db8:1:2::{n:x}\r\nConnection: close\r\n\r\n"
        );
        statuses.push(send(gateway.addr, &request).await.0);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    // Another /64 has a limit of its own.
    let request = "GET /api HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 2001:db8:1:3::1\r\nConnection: close\r\n\r\n";
    assert_eq!(send(gateway.addr, request).await.0, 200);
}

/// Key values and API keys that are not UTF-8 are keyed by their bytes: `z\xff`, `z\xfe` and `z\xfd` are three
/// buckets (a lossy reading made them one, `z\u{FFFD}`), and neither is the bucket of the text `z\u{FFFD}` itself.
#[tokio::test]
async fn bytes_that_are_not_utf8_are_keys_of_their_own() {
    use sha2::{Digest, Sha256};
    let digest: String = Sha256::digest(b"z\xff")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let upstream = Upstream::start().await;
    for redis in [true, false] {
        let server = redis.then(RedisServer::start);
        let yaml = format!(
            r#"store:
{store}upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
    - api_key: {{ query: api_key }}
  keys:
    - {{ key: "sha256:{digest}", consumer: zff }}
  forward: {{ consumer: X-Consumer-Id }}
routes:
  - name: header
    match: {{ path_prefix: /header }}
    upstream: backend
    limits: [{{ name: per-tenant, key: [header:x-tenant], algorithm: sliding_log, limit: 1, period: 1h }}]
  - name: query
    match: {{ path_prefix: /query }}
    upstream: backend
    limits: [{{ name: per-tenant, key: [query:tenant], algorithm: sliding_log, limit: 1, period: 1h }}]
  - name: keys
    match: {{ path_prefix: /keys }}
    upstream: backend
    consumers: required
"#,
            store = common::store_yaml(server.as_ref()),
            upstream = upstream.url(),
        );
        let gateways = common::gateways_sharing(&yaml, server.as_ref()).await;
        let store = if redis { "redis" } else { "memory" };
        let http = client();
        let mut sent = 0;
        let mut send = async |path: &str, header: Option<(&str, &[u8])>| {
            let gateway = &gateways[sent % gateways.len()];
            sent += 1;
            let mut request = http.get(gateway.url(path));
            if let Some((name, value)) = header {
                let value = reqwest::header::HeaderValue::from_bytes(value).expect("value");
                request = request.header(name, value);
            }
            let response = request.send().await.expect("send");
            let status = response.status().as_u16();
            let body = response.bytes().await.expect("body");
            let body: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            (
                status,
                body["headers"]["x-consumer-id"].as_str().map(str::to_owned),
            )
        };
        let values: [&[u8]; 4] = [b"z\xff", b"z\xfe", b"z\xfd", "z\u{FFFD}".as_bytes()];
        for round in [200, 429] {
            for value in values {
                let (status, _) = send("/header", Some(("x-tenant", value))).await;
                assert_eq!(status, round, "x-tenant: {value:?}, {store}");
            }
            for query in ["z%FF", "z%FE", "z%FD", "z%EF%BF%BD"] {
                let (status, _) = send(&format!("/query?tenant={query}"), None).await;
                assert_eq!(status, round, "?tenant={query}, {store}");
            }
        }
        // The key whose digest the config lists is its bytes, in a header or a parameter; its neighbours are not.
        let zff = (200, Some("zff".to_owned()));
        assert_eq!(
            send("/keys", Some(("x-api-key", b"z\xff"))).await,
            zff,
            "{store}"
        );
        assert_eq!(send("/keys?api_key=z%FF", None).await, zff, "{store}");
        for value in [&b"z\xfe"[..], "z\u{FFFD}".as_bytes()] {
            let (status, _) = send("/keys", Some(("x-api-key", value))).await;
            assert_eq!(status, 401, "x-api-key: {value:?}, {store}");
        }
        for query in ["z%FE", "z%EF%BF%BD"] {
            let (status, _) = send(&format!("/keys?api_key={query}"), None).await;
            assert_eq!(status, 401, "?api_key={query}, {store}");
        }
    }
}
