//! `GET /top` on the running binary: each limit's heaviest keys over the last minute and five, admitted and denied
//! apart, the flooding key first among light ones on both stores; denials counted always, admissions once someone
//! looks; a plan's limits under their plan's name, and `/stats`'s consumers nearest them; a credential shown only as
//! its digest; and the API's refusals (401, 404, 400).

mod common;

use common::binary::Tollgate;
use common::http_client::{client, json_answer};
use common::redis::RedisServer;
use serde_json::Value;

const TOKEN: &str = "top-test-token-0123456789";

/// The gateway on `redis` (or in memory): route `api` limits 5 requests an hour per `x-user` and 1,000 per
/// address, `tokens` one per `Authorization` (a credential), and `plans` its callers by their plan, `pro`: 2 an
/// hour per consumer.
fn start_on(dir: &tempfile::TempDir, redis: Option<&RedisServer>) -> Tollgate {
    let path = dir.path().join("gateway.yaml");
    let store = common::store_yaml(redis);
    let yaml = format!(
        r#"listen: 127.0.0.1:0
admin: {{ listen: 127.0.0.1:0, token: {TOKEN} }}
store:
{store}consumers:
  identify:
    - api_key: {{ header: x-api-key }}
  keys:
    - {{ key: pro-key-1, consumer: acme, plan: pro }}
  plans:
    pro:
      limits:
        - {{ name: hourly, key: consumer, algorithm: fixed_window, limit: 2, period: 1h }}
routes:
  - name: plans
    match: {{ path_prefix: /plans }}
    respond: {{ status: 200, body: "ok" }}
    consumers: required
  - name: api
    consumers: "off"
    match: {{ path_prefix: /api }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per_user, key: "header:x-user", missing: skip, algorithm: fixed_window, limit: 5, period: 1h }}
      - {{ name: per_ip, key: ip, algorithm: fixed_window, limit: 1000, period: 1h }}
  - name: tokens
    consumers: "off"
    match: {{ path_prefix: /tokens }}
    respond: {{ status: 200, body: "ok" }}
    limits:
      - {{ name: per_token, key: "header:authorization", algorithm: fixed_window, limit: 1, period: 1h }}
"#
    );
    std::fs::write(&path, yaml).expect("write config");
    Tollgate::run(&path)
}

async fn admin_get(tollgate: &Tollgate, path: &str) -> (u16, Value) {
    json_answer(
        client()
            .get(tollgate.admin_url(path))
            .header("authorization", format!("Bearer {TOKEN}")),
    )
    .await
}

async fn top(tollgate: &Tollgate, query: &str) -> Value {
    let (status, body) = admin_get(tollgate, &format!("/top?{query}")).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn send(tollgate: &Tollgate, path: &str, header: (&str, &str), requests: usize) {
    for _ in 0..requests {
        client()
            .get(tollgate.url(path))
            .header(header.0, header.1)
            .send()
            .await
            .expect("request");
    }
}

/// The keys of `window` (`one_minute` or `five_minutes`) as (key, admitted, denied, error).
fn keys(top: &Value, window: &str) -> Vec<(String, u64, u64, u64)> {
    let number = |entry: &Value, field: &str| entry[field].as_u64().expect("a count");
    top[window]["keys"]
        .as_array()
        .unwrap_or_else(|| panic!("no {window} keys in {top}"))
        .iter()
        .map(|entry| {
            let key = entry["key"].as_str().expect("a key").to_owned();
            let counts = |f| number(entry, f);
            (key, counts("admitted"), counts("denied"), counts("error"))
        })
        .collect()
}

async fn the_flooding_key_is_first_with_admitted_and_denied_apart(redis: Option<&RedisServer>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start_on(&dir, redis);
    // No one has looked yet: only denials are counted.
    send(&tollgate, "/api", ("x-user", "flooder"), 30).await;
    send(&tollgate, "/api", ("x-user", "light-0"), 2).await;
    let first = top(&tollgate, "route=api&limit=per_user").await;
    assert_eq!(keys(&first, "one_minute"), [("flooder".into(), 0, 25, 0)]);
    // Reading /top is a look: admissions count from then on.
    assert!(
        first["admissions_counted_since_ms"].as_i64().is_some(),
        "{first}"
    );

    // Someone looks: admissions count too, from now on.
    send(&tollgate, "/api", ("x-user", "flooder"), 10).await;
    for light in ["light-1", "light-2", "light-3"] {
        send(&tollgate, "/api", ("x-user", light), 2).await;
    }
    let seen = top(&tollgate, "route=api&limit=per_user&n=3").await;
    for window in ["one_minute", "five_minutes"] {
        let keys = keys(&seen, window);
        assert_eq!(keys.len(), 3, "{seen}");
        assert_eq!(keys[0], ("flooder".into(), 0, 35, 0), "{seen}");
        assert_eq!((keys[1].1, keys[1].2), (2, 0), "{seen}");
    }
    assert_eq!(seen["one_minute"]["events"], 41, "{seen}");
    assert_eq!(seen["counters"], 64);
    assert_eq!(seen["digests"], false);
    // The address limit counts the admitted requests since the look (a request per_user denied took nothing from
    // it, and is not counted on it).
    let per_ip = top(&tollgate, "route=api&limit=per_ip").await;
    assert_eq!(
        keys(&per_ip, "one_minute"),
        [("127.0.0.1".into(), 6, 0, 0)],
        "{per_ip}"
    );

    // The dashboard's `/stats` carries the few heaviest of each limit.
    let (status, stats) = admin_get(&tollgate, "/stats").await;
    assert_eq!(status, 200);
    let listed = stats["top"]
        .as_array()
        .and_then(|all| all.iter().find(|t| t["limit"] == "per_user"))
        .unwrap_or_else(|| panic!("no per_user in {stats}"));
    assert_eq!(keys(listed, "one_minute")[0].0, "flooder");
    assert!(keys(listed, "one_minute").len() <= 5);
}

crate::each_store!(
    the_flooding_key_is_first,
    the_flooding_key_is_first_with_admitted_and_denied_apart
);

#[tokio::test]
async fn a_plan_s_limit_keeps_its_top_keys_per_route_under_its_plan_s_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start_on(&dir, None);
    top(&tollgate, "route=plans&limit=pro.hourly").await;
    send(&tollgate, "/plans", ("x-api-key", "pro-key-1"), 4).await;
    let seen = top(&tollgate, "route=plans&limit=pro.hourly").await;
    assert_eq!(
        keys(&seen, "one_minute"),
        [("acme".into(), 2, 2, 0)],
        "{seen}"
    );
    assert!(!seen.to_string().contains("pro-key-1"), "{seen}");

    // The dashboard's consumers nearest their plan's limits: acme, at its limit.
    let (status, stats) = admin_get(&tollgate, "/stats").await;
    assert_eq!(status, 200);
    let nearest = &stats["consumers"]["nearest"];
    assert_eq!(nearest.as_array().map(Vec::len), Some(1), "{stats}");
    let acme = &nearest[0];
    assert_eq!(
        (&acme["route"], &acme["limit"], &acme["key"]),
        (&"plans".into(), &"pro.hourly".into(), &"acme".into()),
        "{acme}"
    );
    assert_eq!(
        (acme["used"].as_u64(), acme["capacity"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(acme["share"], 1.0);
    assert!(!stats.to_string().contains("pro-key-1"), "{stats}");
}

#[tokio::test]
async fn a_credential_is_shown_only_as_the_digest_the_store_keys_it_by() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start_on(&dir, None);
    let secret = "Bearer s3cret-api-credential-0123";
    top(&tollgate, "route=tokens&limit=per_token").await;
    send(&tollgate, "/tokens", ("authorization", secret), 3).await;
    let seen = top(&tollgate, "route=tokens&limit=per_token").await;
    let (status, stats) = admin_get(&tollgate, "/stats").await;
    assert_eq!(status, 200);
    for shown in [seen.to_string(), stats.to_string()] {
        assert!(!shown.contains("s3cret-api-credential"), "{shown}");
    }
    assert_eq!(seen["digests"], true);
    // The digest is what the admin API's `/limits` says the key is counted under.
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("key", secret)
        .finish();
    let (status, limits) = admin_get(&tollgate, &format!("/limits/tokens/per_token?{query}")).await;
    assert_eq!(status, 200, "{limits}");
    let counted = limits["counted_key"].as_str().expect("counted key");
    assert_eq!(counted.len(), 64);
    assert_eq!(keys(&seen, "one_minute"), [(counted.to_owned(), 1, 2, 0)]);
}

#[tokio::test]
async fn top_refuses_without_the_token_an_unknown_route_or_limit_and_a_bad_n() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start_on(&dir, None);
    let (status, _) =
        json_answer(client().get(tollgate.admin_url("/top?route=api&limit=per_ip"))).await;
    assert_eq!(status, 401);
    let (status, body) = admin_get(&tollgate, "/top?route=nope&limit=per_ip").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_route")),
        "{body}"
    );
    assert!(
        body["detail"].as_str().is_some_and(|d| d.contains("nope")),
        "{body}"
    );
    let (status, body) = admin_get(&tollgate, "/top?route=api&limit=nope").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("unknown_limit")),
        "{body}"
    );
    // The message names the limits there are.
    assert!(
        body["detail"]
            .as_str()
            .is_some_and(|d| d.contains("per_user, per_ip")),
        "{body}"
    );
    for n in ["0", "65", "abc", "-1", ""] {
        let (status, body) =
            admin_get(&tollgate, &format!("/top?route=api&limit=per_ip&n={n}")).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some("bad_n")),
            "n={n}: {body}"
        );
    }
    let (status, body) = admin_get(&tollgate, "/top?limit=per_ip").await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("missing_parameter")),
        "{body}"
    );
    top(&tollgate, "route=api&limit=per_ip&n=64").await;
}

/// A reload keeps each limit's top keys when its route, name and key stay (as it keeps the counts they show), and a
/// plan's consumers nearest it; a limit whose key changed starts afresh.
#[tokio::test]
async fn a_reload_keeps_the_top_keys_of_the_limits_it_keeps() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tollgate = start_on(&dir, None);
    top(&tollgate, "route=api&limit=per_user").await;
    send(&tollgate, "/api", ("x-user", "flooder"), 7).await;
    send(&tollgate, "/tokens", ("authorization", "Bearer t-1"), 1).await;
    send(&tollgate, "/plans", ("x-api-key", "pro-key-1"), 3).await;

    // per_user's limit raised, per_token keyed otherwise, a route added: the new config is running once it answers.
    let path = dir.path().join("gateway.yaml");
    let yaml = std::fs::read_to_string(&path).expect("config");
    let yaml = yaml
        .replace("missing: skip, algorithm: fixed_window, limit: 5", "missing: skip, algorithm: fixed_window, limit: 6")
        .replace("key: \"header:authorization\"", "key: \"header:x-token\"")
        + "  - name: extra\n    consumers: \"off\"\n    match: { path_prefix: /extra }\n    respond: { status: 204 }\n";
    std::fs::write(&path, yaml).expect("write config");
    let reloaded = common::eventually(std::time::Duration::from_secs(10), async || {
        let response = client().get(tollgate.url("/extra")).send().await;
        response.is_ok_and(|r| r.status() == 204)
    })
    .await;
    assert!(reloaded.is_some(), "never reloaded:\n{}", tollgate.log());

    let kept = top(&tollgate, "route=api&limit=per_user").await;
    assert_eq!(
        keys(&kept, "one_minute"),
        [("flooder".into(), 5, 2, 0)],
        "{kept}"
    );
    let plan = top(&tollgate, "route=plans&limit=pro.hourly").await;
    assert_eq!(
        keys(&plan, "one_minute"),
        [("acme".into(), 2, 1, 0)],
        "{plan}"
    );
    let (_, stats) = admin_get(&tollgate, "/stats").await;
    assert_eq!(stats["consumers"]["nearest"][0]["key"], "acme", "{stats}");
    let rekeyed = top(&tollgate, "route=tokens&limit=per_token").await;
    assert_eq!(keys(&rekeyed, "one_minute"), [], "{rekeyed}");
}
