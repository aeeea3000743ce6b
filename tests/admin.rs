//! The admin API: reading a limit's state without consuming, resetting it, and the bearer token that guards both.

mod common;

use common::config_builder::ConfigBuilder;
use common::http_client::{client, json_answer};
use common::redis::RedisServer;
use common::{eventually, serve_admin, start_gateway};
use serde_json::Value;

const TOKEN: &str = "s3cret-admin-token";

/// A route `/demo` answering 200 itself, 3 a minute per client address, on `redis` or in memory.
fn yaml(redis: Option<&RedisServer>) -> String {
    ConfigBuilder::new()
        .store(redis)
        .route("demo", "/demo")
        .limit(
            "per-ip",
            "ip",
            "algorithm: sliding_log, limit: 3, period: 1m",
        )
        .build()
}

/// `GET /demo` on `gateway`'s status.
async fn demo_status(client: &reqwest::Client, gateway: &common::TestGateway) -> u16 {
    let response = client.get(gateway.url("/demo")).send().await;
    response.expect("request").status().as_u16()
}

#[tokio::test]
async fn a_reset_through_one_instance_reaches_the_others() {
    // Two gateways on one Redis. The second learns the key is over its limit and answers it in-process from then
    // on (the over-limit cache, until the retry time a minute away); a reset through the first's admin API must
    // reach it too, or the client stays refused there after the reset.
    let redis = RedisServer::start();
    let first = start_gateway(&yaml(Some(&redis))).await;
    let second = start_gateway(&yaml(Some(&redis))).await;
    let admin = serve_admin(&first, Some(TOKEN)).await;
    let client = client();
    // Each instance subscribes to resets in the background as it starts, and then forgets the denials it learned
    // before (a reset may have gone unheard meanwhile): the denial is learned once both listen.
    let listening = eventually(std::time::Duration::from_secs(5), async || {
        redis
            .cli(&["PUBSUB", "NUMSUB", "tollgate:resets"])
            .is_some_and(|answer| answer.ends_with('2'))
    })
    .await;
    assert!(listening.is_some(), "the instances do not both listen");
    let statuses = [
        demo_status(&client, &second).await,
        demo_status(&client, &second).await,
        demo_status(&client, &second).await,
        demo_status(&client, &second).await,
    ];
    assert_eq!(statuses, [200, 200, 200, 429]);
    // Redis's count is moved aside behind the gateways' backs (nothing is announced) for one request: had it
    // reached Redis, it would be admitted, so its refusal is the second instance's own answer. (Counting Redis's
    // script calls instead proves nothing: every instance asks Redis each second whether it still answers, with the
    // same script.) A denial forgotten as the subscription was made is learned again first: Redis refuses the key.
    let count = "tollgate:demo:per-ip:{127.0.0.1}";
    let aside = "tollgate:demo:per-ip:{127.0.0.1}:aside";
    let answered_itself = eventually(std::time::Duration::from_secs(5), async || {
        if demo_status(&client, &second).await != 429 {
            return false;
        }
        assert_eq!(redis.cli(&["RENAME", count, aside]).as_deref(), Some("OK"));
        let status = demo_status(&client, &second).await;
        assert_eq!(redis.cli(&["RENAME", aside, count]).as_deref(), Some("OK"));
        status == 429
    })
    .await;
    assert!(
        answered_itself.is_some(),
        "the second instance does not answer the denied key itself"
    );

    let limit_url = format!("{admin}/limits/demo/per-ip?key=127.0.0.1");
    let (status, body) = json_answer(client.delete(&limit_url).bearer_auth(TOKEN)).await;
    assert_eq!(
        (status, &body["existed"]),
        (200, &Value::Bool(true)),
        "{body}"
    );
    // The announcement travels through Redis's publish/subscribe: allow it a moment.
    let mut status = 0;
    eventually(std::time::Duration::from_secs(5), async || {
        status = demo_status(&client, &second).await;
        status == 200
    })
    .await;
    assert_eq!(
        status, 200,
        "the second instance still refuses the reset key"
    );
}

#[tokio::test]
async fn a_listener_cut_off_from_redis_is_told_it_may_have_missed_resets() {
    use std::time::Duration;
    use tollgate::limiter::store::{RedisStore, ResetNotice};

    let redis = RedisServer::start();
    let store = RedisStore::connect(&redis.url(), 1, Duration::from_secs(1)).expect("redis url");
    assert!(store.wait_connected(Duration::from_secs(10)).await);
    let (notices, mut heard) = tokio::sync::mpsc::unbounded_channel();
    store
        .on_reset(move |notice| {
            let owned = match notice {
                ResetNotice::Key(key) => Some(key.to_owned()),
                ResetNotice::MaybeMissed => None,
            };
            notices.send(owned).is_ok()
        })
        .expect("listening");
    // Resets are heard once the subscription is made: retry one until it is.
    assert!(
        reset_until_heard(&store, &mut heard, "tollgate:probe").await,
        "no reset heard"
    );
    // The notices of the probe's other tries may still be on their way. A marker's reset, published after all of
    // them, is heard after them: once it is, nothing of this phase is left to be heard.
    store.reset("tollgate:marker").await.expect("reset");
    loop {
        let notice = tokio::time::timeout(Duration::from_secs(5), heard.recv())
            .await
            .expect("the marker heard within 5 s")
            .expect("the listener runs");
        match notice.as_deref() {
            Some("tollgate:marker") => break,
            other => assert!(
                matches!(other, Some("tollgate:probe") | None),
                "{other:?} before the marker"
            ),
        }
    }

    // Redis drops the subscriber's connection (as a network cut would): it comes back, says what it may have
    // missed, and hears resets again.
    assert_eq!(
        redis.cli(&["CLIENT", "KILL", "TYPE", "pubsub"]).as_deref(),
        Some("1")
    );
    let notice = tokio::time::timeout(Duration::from_secs(5), heard.recv()).await;
    assert_eq!(
        notice
            .expect("a notice within 5 s")
            .expect("the listener runs"),
        None,
        "MaybeMissed after the reconnection"
    );
    assert!(
        reset_until_heard(&store, &mut heard, "tollgate:after").await,
        "resets are heard again after the reconnection"
    );
}

/// Resets `key` through `store`, waiting up to 100 ms each time for the listener feeding `heard` to hear it (a
/// `MaybeMissed` notice, `None`, is passed over), for at most 5 s; false if it never does.
async fn reset_until_heard(
    store: &tollgate::limiter::store::RedisStore,
    heard: &mut tokio::sync::mpsc::UnboundedReceiver<Option<String>>,
    key: &str,
) -> bool {
    eventually(std::time::Duration::from_secs(5), async || {
        store.reset(key).await.expect("reset");
        let notice =
            tokio::time::timeout(std::time::Duration::from_millis(100), heard.recv()).await;
        match notice {
            Ok(Some(Some(heard_key))) => {
                assert_eq!(heard_key, key);
                true
            }
            _ => false,
        }
    })
    .await
    .is_some()
}

#[tokio::test]
async fn peek_reads_without_consuming_and_delete_resets() {
    for redis in [Some(RedisServer::start()), None] {
        let gateway = start_gateway(&yaml(redis.as_ref())).await;
        let admin = serve_admin(&gateway, Some(TOKEN)).await;
        let client = client();
        let limit_url = format!("{admin}/limits/demo/per-ip?key=127.0.0.1");
        for _ in 0..2 {
            client.get(gateway.url("/demo")).send().await.unwrap();
        }
        for _ in 0..3 {
            let (status, body) = json_answer(client.get(&limit_url).bearer_auth(TOKEN)).await;
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["remaining"], 1, "peeking consumes nothing: {body}");
            assert_eq!(body["capacity"], 3);
            assert_eq!(body["would_admit"], true);
            assert_eq!(body["algorithm"], "sliding_log");
            assert_eq!(body["store_key"], "tollgate:demo:per-ip:{127.0.0.1}");
        }
        client.get(gateway.url("/demo")).send().await.unwrap();
        assert_eq!(
            client
                .get(gateway.url("/demo"))
                .send()
                .await
                .unwrap()
                .status(),
            429
        );
        let (_, body) = json_answer(client.get(&limit_url).bearer_auth(TOKEN)).await;
        assert_eq!(body["would_admit"], false);
        assert!(body["retry_after_ms"].as_u64().unwrap() > 50_000, "{body}");

        let (status, body) = json_answer(client.delete(&limit_url).bearer_auth(TOKEN)).await;
        assert_eq!(status, 200);
        assert_eq!(body["existed"], true);
        assert_eq!(
            client
                .get(gateway.url("/demo"))
                .send()
                .await
                .unwrap()
                .status(),
            200,
            "reset: admitted again"
        );
        if let Some(redis) = &redis {
            assert_eq!(
                redis
                    .cli(&["ZCARD", "tollgate:demo:per-ip:{127.0.0.1}"])
                    .as_deref(),
                Some("1")
            );
        }
    }
}

#[tokio::test]
async fn limits_api_requires_the_token_when_one_is_set() {
    let gateway = start_gateway(&yaml(None)).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let client = client();
    let url = format!("{admin}/limits/demo/per-ip?key=1.2.3.4");
    let response = client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    // The body docs/operations.md shows, and /consumers needs the token too.
    let body = response.text().await.unwrap();
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/operations.md"))
        .unwrap();
    assert!(
        docs.contains(&format!("`401 {body}`")),
        "{body} is not the documented body"
    );
    let consumers = client
        .get(format!("{admin}/consumers/acme"))
        .send()
        .await
        .unwrap();
    assert_eq!(consumers.status(), 401);
    assert_eq!(client.delete(&url).send().await.unwrap().status(), 401);
    assert_eq!(
        client
            .get(&url)
            .bearer_auth("wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    assert_eq!(
        client
            .get(&url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // Probes and scrapers need no token.
    assert_eq!(
        client
            .get(format!("{admin}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        client
            .get(format!("{admin}/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn unknown_routes_limits_and_missing_keys_are_named() {
    let gateway = start_gateway(&yaml(None)).await;
    let admin = serve_admin(&gateway, None).await;
    let client = client();
    let (status, body) = json_answer(client.get(format!("{admin}/limits/nope/per-ip?key=x"))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_route"))
    );
    let (status, body) = json_answer(client.get(format!("{admin}/limits/demo/nope?key=x"))).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_limit"))
    );
    let (status, body) = json_answer(client.get(format!("{admin}/limits/demo/per-ip"))).await;
    assert_eq!((status, body["error"].as_str()), (400, Some("missing_key")));
}

#[tokio::test]
async fn peek_at_an_ipv6_address_reports_the_network_it_is_counted_under() {
    let yaml = format!("client_ip:\n  trusted_proxies: [127.0.0.1]\n{}", yaml(None));
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let client = client();
    for n in 1..=2 {
        let response = client
            .get(gateway.url("/demo"))
            .header("x-forwarded-for", format!("2001:db8:1:2::{n}"))
            .send()
            .await
            .expect("request");
        assert_eq!(response.status(), 200);
    }
    // Another address of the same /64: the state of the network, two requests in.
    let url = format!("{admin}/limits/demo/per-ip?key=2001:db8:1:2::99");
    let (status, body) = json_answer(client.get(&url).bearer_auth(TOKEN)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["key"], "2001:db8:1:2::99");
    assert_eq!(body["counted_key"], "2001:db8:1:2::/64");
    assert_eq!(
        body["store_key"],
        "tollgate:demo:per-ip:{2001:db8:1:2::/64}"
    );
    assert_eq!(body["remaining"], 1, "{body}");
    let (_, body) = json_answer(
        client
            .get(format!("{admin}/limits/demo/per-ip?key=::1"))
            .bearer_auth(TOKEN),
    )
    .await;
    assert_eq!(body["counted_key"], "::/64", "{body}");
    // A reset through an address forgets its network.
    let (status, body) = json_answer(client.delete(&url).bearer_auth(TOKEN)).await;
    assert_eq!(
        (status, &body["existed"]),
        (200, &Value::Bool(true)),
        "{body}"
    );
    let (_, body) = json_answer(client.get(&url).bearer_auth(TOKEN)).await;
    assert_eq!(body["remaining"], 3, "{body}");
}

/// The admin API reads keys as requests write them (docs/operations.md): a header value that reads as an address
/// after a `\`, the address alone for a request without the header (an IPv6 one by its network), and a `|` inside a
/// part of a composite key escaped.
#[tokio::test]
async fn peek_reads_marked_and_escaped_key_values_as_requests_write_them() {
    let yaml = ConfigBuilder::new()
        .route("demo", "/demo")
        .limit(
            "per-key",
            "[header:x-api-key]",
            "algorithm: sliding_log, limit: 3, period: 1m",
        )
        .limit(
            "per-pair",
            "[header:x-api-key, \"query:t\"]",
            "algorithm: sliding_log, limit: 3, period: 1m",
        )
        .build();
    let yaml = format!("client_ip:\n  trusted_proxies: [127.0.0.1]\n{yaml}");
    let gateway = start_gateway(&yaml).await;
    let admin = serve_admin(&gateway, Some(TOKEN)).await;
    let client = client();
    let send = async |key: Option<&str>, from: &str, query: &str| {
        let mut request = client
            .get(gateway.url(&format!("/demo?t={query}")))
            .header("x-forwarded-for", from);
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        request.send().await.expect("request").status().as_u16()
    };
    assert_eq!(
        send(Some("203.0.113.7"), "198.51.100.9", "a%7Cb").await,
        200
    );
    assert_eq!(send(None, "2001:db8:1:2::5", "x").await, 200);
    assert_eq!(send(None, "2001:db8:1:2::6", "x").await, 200);
    let peek = async |limit: &str, key: &str| {
        let url = format!("{admin}/limits/demo/{limit}?key={key}");
        let (status, body) = json_answer(client.get(url).bearer_auth(TOKEN)).await;
        assert_eq!(status, 200, "{body}");
        body
    };
    let marked = peek("per-key", "%5C203.0.113.7").await;
    assert_eq!(marked["store_key"], "tollgate:demo:per-key:{\\203.0.113.7}");
    assert_eq!(marked["remaining"], 2, "{marked}");
    // The address itself is the key of a client without the header, counted by its network.
    let by_address = peek("per-key", "2001:db8:1:2::99").await;
    assert_eq!(
        by_address["counted_key"], "2001:db8:1:2::/64",
        "{by_address}"
    );
    assert_eq!(by_address["remaining"], 1, "{by_address}");
    assert_eq!(peek("per-key", "203.0.113.7").await["remaining"], 3);
    // In a key of several parts, an address among them needs no mark: the `|` tells it from a client's own key.
    let pair = peek("per-pair", "203.0.113.7%7Ca%5C%7Cb").await;
    assert_eq!(pair["remaining"], 2, "{pair}");
    assert_eq!(pair["counted_key"], "203.0.113.7|a\\|b", "{pair}");
}
