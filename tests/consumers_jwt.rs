//! JWT consumers through the gateway: tokens signed by keys of a JWKS served on 127.0.0.1 name their
//! consumer and plan; a plan's limits hold across two gateways on one Redis and on the in-process store alike; each
//! kind of bad token is 401 before any limit is asked; a runtime plan goes ahead of the token's claim.

mod common;

use std::time::Duration;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::{json, Value};

use common::http_client::client;
use common::jwt::{
    ec_key, jwks, merged, now, rsa_key, sign, sign_as, JwksServer, SigningKey, RSA_PUBLIC_PEM,
};
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::{gateways_sharing, store_yaml, TestGateway};

const ISSUER: &str = "https://auth.example.test";

/// Gateways sharing one store (two on one Redis, or one in memory) identifying callers by JWT.
struct Setup {
    gateways: Vec<TestGateway>,
    /// The P-256 key served in the JWKS (generated per setup).
    ec: SigningKey,
    _jwks: JwksServer,
    _upstream: Upstream,
    _redis: Option<RedisServer>,
}

async fn setup(redis: bool) -> Setup {
    let upstream = Upstream::start().await;
    let (rsa, ec) = (rsa_key("rsa-1"), ec_key("ec-1"));
    let jwks = JwksServer::start(jwks(&[&rsa, &ec])).await;
    let redis = redis.then(RedisServer::start);
    let store = store_yaml(redis.as_ref());
    let yaml = format!(
        r#"listen: 127.0.0.1:0
store:
{store}upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - jwt:
        algorithms: [RS256, ES256]
        jwks_url: http://{jwks}/.well-known/jwks.json
        issuer: {ISSUER}
        audiences: [api]
        leeway: 5s
        consumer_claim: sub
        plan_claim: tier
  anonymous: reject
  forward: {{ consumer: X-Consumer-Id, plan: X-Consumer-Plan }}
  plans:
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
  - name: b
    match: {{ path_prefix: /b }}
    upstream: backend
"#,
        upstream = upstream.url(),
        jwks = jwks.addr,
    );
    let gateways = gateways_sharing(&yaml, redis.as_ref()).await;
    let setup = Setup {
        gateways,
        ec,
        _jwks: jwks,
        _upstream: upstream,
        _redis: redis,
    };
    // The JWKS is fetched in the background: wait until every gateway verifies a good token.
    let probe = sign(&rsa_key("rsa-1"), &claims("probe", "free", json!({})));
    for i in 0..setup.gateways.len() {
        let ready = common::eventually(Duration::from_secs(5), async || {
            setup.get(i, "/a/probe", &probe).await.0 == 200
        })
        .await;
        assert!(ready.is_some(), "gateway {i} never fetched the JWKS");
    }
    setup
}

impl Setup {
    /// GET `path` through gateway `i` with `token`: the status and the response's JSON body (or `null`).
    async fn get(&self, i: usize, path: &str, token: &str) -> (u16, Value, Option<String>) {
        let response = client()
            .get(self.gateways[i].url(path))
            .header("authorization", format!("Bearer {token}"))
            .send()
            .await
            .expect("send");
        let status = response.status().as_u16();
        let challenge = response
            .headers()
            .get("www-authenticate")
            .map(|v| v.to_str().expect("text").to_owned());
        let body = response.bytes().await.expect("body");
        (
            status,
            serde_json::from_slice(&body).unwrap_or(Value::Null),
            challenge,
        )
    }

    /// `count` requests with `token`, alternating gateways and routes; their statuses.
    async fn statuses(&self, token: &str, count: usize) -> Vec<u16> {
        let mut statuses = Vec::new();
        for i in 0..count {
            let path = if i % 2 == 0 { "/a/x" } else { "/b/y" };
            statuses.push(self.get(i % self.gateways.len(), path, token).await.0);
        }
        statuses
    }
}

/// Claims accepted by the setup's identifier for consumer `sub` on plan `tier`, with `extra` merged over them
/// (`null` removes a claim).
fn claims(sub: &str, tier: &str, extra: Value) -> Value {
    let base = json!({"sub": sub, "tier": tier, "iss": ISSUER, "aud": "api", "exp": now() + 600});
    merged(base, extra)
}

#[tokio::test]
async fn a_tokens_plan_claim_sets_its_limits_across_routes_and_gateways() {
    for redis in [true, false] {
        let setup = setup(redis).await;
        let store = if redis { "redis" } else { "memory" };
        let pro = sign(&rsa_key("rsa-1"), &claims("acme", "pro", json!({})));
        assert_eq!(
            setup.statuses(&pro, 7).await,
            [200, 200, 200, 200, 200, 200, 429],
            "RS256, pro, {store}"
        );
        let free = sign(&setup.ec, &claims("bob", "free", json!({})));
        assert_eq!(
            setup.statuses(&free, 4).await,
            [200, 200, 200, 429],
            "ES256, free, {store}"
        );
        // Another token of the same consumer draws on the same state.
        let again = sign(
            &rsa_key("rsa-1"),
            &claims("bob", "free", json!({"exp": now() + 900})),
        );
        assert_eq!(setup.statuses(&again, 1).await, [429], "{store}");
    }
}

#[tokio::test]
async fn tokens_that_do_not_verify_are_401_and_consume_nothing() {
    let setup = setup(false).await;
    let rsa = rsa_key("rsa-1");
    let encode = |value: &Value| URL_SAFE_NO_PAD.encode(value.to_string());
    let unsigned = format!(
        "{}.{}.",
        encode(&json!({"alg": "none", "typ": "JWT"})),
        encode(&claims("acme", "pro", json!({})))
    );
    let confused = sign_as(
        Algorithm::HS256,
        Some("rsa-1"),
        &EncodingKey::from_secret(RSA_PUBLIC_PEM.as_bytes()),
        &claims("acme", "pro", json!({})),
    );
    let cases = [
        (
            sign(&rsa, &claims("acme", "pro", json!({"exp": now() - 60}))),
            "expired",
        ),
        (
            sign(&rsa, &claims("acme", "pro", json!({"aud": "other"}))),
            "wrong_audience",
        ),
        (
            sign(
                &rsa,
                &claims("acme", "pro", json!({"iss": "https://evil.test"})),
            ),
            "wrong_issuer",
        ),
        (unsigned, "algorithm_not_allowed"),
        (confused, "algorithm_not_allowed"),
        ("not.a.token".to_owned(), "malformed"),
    ];
    for (token, reason) in cases {
        let (status, body, challenge) = setup.get(0, "/a/x", &token).await;
        assert_eq!(status, 401, "{reason}");
        assert_eq!(body, json!({"error": "unauthorized", "reason": reason}));
        assert_eq!(
            challenge.as_deref(),
            Some(
                format!(
                    "Bearer realm=\"tollgate\", error=\"invalid_token\", error_description=\"{reason}\""
                )
                .as_str()
            )
        );
    }
    // Two Authorization lines: which one a proxy in front read is a guess, as for an API key sent twice.
    let good = sign(&rsa, &claims("acme", "pro", json!({})));
    let mut twice = reqwest::Request::new(
        reqwest::Method::GET,
        setup.gateways[0].url("/a/x").parse().expect("url"),
    );
    for _ in 0..2 {
        let value = format!("Bearer {good}").parse().expect("value");
        twice.headers_mut().append("authorization", value);
    }
    assert_eq!(client().execute(twice).await.expect("send").status(), 400);
    // No credential at all, with `anonymous: reject`.
    let bare = client()
        .get(setup.gateways[0].url("/a/x"))
        .send()
        .await
        .expect("send");
    assert_eq!(bare.status(), 401);
    assert_eq!(
        bare.headers()["www-authenticate"],
        "Bearer realm=\"tollgate\""
    );
    // None of it consumed acme's pro budget (6; the probe's consumer is another one).
    assert_eq!(
        setup.statuses(&good, 7).await,
        [200, 200, 200, 200, 200, 200, 429]
    );
}

#[tokio::test]
async fn the_runtime_plan_goes_ahead_of_the_tokens_claim() {
    let setup = setup(false).await;
    let consumers = setup.gateways[0].gateway.consumers().expect("consumers");
    let record = serde_json::from_value(json!({"plan": "pro"})).expect("record");
    // A token's consumer is addressed with its identifier's prefix: the issuer's, by default.
    consumers
        .directory()
        .put("auth.example.test:bob", record)
        .await
        .expect("put");
    let token = sign(&rsa_key("rsa-1"), &claims("bob", "free", json!({})));
    let (_, body, _) = setup.get(0, "/a/x", &token).await;
    assert_eq!(body["headers"]["x-consumer-plan"], "pro", "{body}");
    assert_eq!(body["headers"]["x-consumer-id"], "auth.example.test:bob");
    assert_eq!(
        setup.statuses(&token, 6).await,
        [200, 200, 200, 200, 200, 429]
    );
}

/// A gateway on the in-process store whose first identifier verifies RS256 tokens of `rsa_key("rsa-1")` from a
/// JWKS file in `dir` (its block ending with `jwt_lines`), then `rest`: the other identifiers, the rest of
/// `consumers:`, and the routes, whose upstream `backend` is `upstream`.
async fn with_jwks_file(
    upstream: &Upstream,
    dir: &tempfile::TempDir,
    jwt_lines: &str,
    rest: &str,
) -> TestGateway {
    let jwks_path = dir.path().join("jwks.json");
    std::fs::write(&jwks_path, jwks(&[&rsa_key("rsa-1")])).expect("write jwks");
    let yaml = format!(
        r#"listen: 127.0.0.1:0
store: {{ backend: memory }}
upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - jwt:
        algorithms: [RS256]
        jwks_file: {jwks}
        issuer: {ISSUER}
        audiences: [api]
{jwt_lines}{rest}"#,
        upstream = upstream.url(),
        jwks = jwks_path.display(),
    );
    common::start_gateway(&yaml).await
}

#[tokio::test]
async fn another_authorization_scheme_is_no_credential_for_a_jwt_identifier() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let rest = r#"    - api_key: { header: x-api-key }
  keys:
    - { key: key-of-bob, consumer: bob, plan: free }
  anonymous: { plan: free }
  forward: { consumer: X-Consumer-Id, plan: X-Consumer-Plan }
  plans:
    free:
      limits:
        - { name: hourly, key: consumer, algorithm: sliding_log, limit: 100, period: 1h }
routes:
  - name: open
    match: { path_prefix: /open }
    upstream: backend
    consumers: optional
  - name: closed
    match: { path_prefix: /closed }
    upstream: backend
    consumers: required
"#;
    let gateway = with_jwks_file(&upstream, &dir, "", rest).await;
    let get = async |path: &str, authorization: &str, key: Option<&str>| {
        let mut request = client()
            .get(gateway.url(path))
            .header("authorization", authorization);
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let body = response.bytes().await.expect("body");
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        (status, body)
    };
    let consumer = |body: &Value| body["headers"]["x-consumer-id"].as_str().map(str::to_owned);

    // Basic on an optional route: anonymous, and the upstream gets its Authorization as sent.
    let (status, body) = get("/open/x", "Basic dXNlcjpwYXNz", None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(consumer(&body), None);
    assert_eq!(body["headers"]["authorization"], "Basic dXNlcjpwYXNz");
    // Another scheme leaves the next identifier to name the caller.
    let (status, body) = get("/open/x", "Digest username=\"u\"", Some("key-of-bob")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        consumer(&body).as_deref(),
        Some("bob"),
        "an API-key consumer"
    );
    // Where a credential is required, another scheme is none: 401 credential_required, not `malformed`.
    let (status, body) = get("/closed/x", "Basic dXNlcjpwYXNz", None).await;
    assert_eq!(
        (status, &body["reason"]),
        (401, &json!("credential_required"))
    );
    // A bearer token that is not a JWT is still malformed.
    let (status, body) = get("/open/x", "Bearer not.a.token", None).await;
    assert_eq!((status, &body["reason"]), (401, &json!("malformed")));
}

/// One consumer, one credential source: a token whose `sub` is `zed` is the consumer `auth.example.test:zed`
/// (its issuer's namespace), never the API-key consumer `zed`: it spends none of that quota and is not blocked with
/// it, in both stores; `consumer_prefix: ""` joins them on purpose.
#[tokio::test]
async fn a_tokens_consumer_is_not_the_api_key_consumer_of_the_same_name() {
    let rsa = rsa_key("rsa-1");
    let jwks = JwksServer::start(jwks(&[&rsa])).await;
    let upstream = Upstream::start().await;
    let token = sign(&rsa, &claims("zed", "free", json!({})));
    for (redis, prefix) in [(true, None), (false, None), (false, Some(""))] {
        let server = redis.then(RedisServer::start);
        let written = prefix.map_or(String::new(), |p| {
            format!("\n        consumer_prefix: \"{p}\"")
        });
        let yaml = format!(
            r#"listen: 127.0.0.1:0
store:
{store}upstreams:
  backend:
    targets: ["{upstream}"]
consumers:
  identify:
    - api_key: {{ header: x-api-key }}
    - jwt:
        algorithms: [RS256]
        jwks_url: http://{jwks}/.well-known/jwks.json
        issuer: {ISSUER}
        audiences: [api]
        plan_claim: tier{written}
  keys:
    - {{ key: key-of-zed, consumer: zed, plan: free }}
  forward: {{ consumer: X-Consumer-Id }}
  plans:
    free:
      limits:
        - {{ name: hourly, key: consumer, algorithm: sliding_log, limit: 3, period: 1h }}
routes:
  - name: a
    match: {{ path_prefix: /a }}
    upstream: backend
"#,
            store = store_yaml(server.as_ref()),
            upstream = upstream.url(),
            jwks = jwks.addr,
        );
        let gateways = gateways_sharing(&yaml, server.as_ref()).await;
        let case = format!("redis: {redis}, consumer_prefix: {prefix:?}");
        let probe = sign(&rsa, &claims("probe", "free", json!({})));
        let send = async |i: usize, key: Option<&str>| {
            let request = client().get(gateways[i % gateways.len()].url("/a/x"));
            let request = match key {
                None => request.header("x-api-key", "key-of-zed"),
                Some(token) => request.bearer_auth(token),
            };
            let response = request.send().await.expect("send");
            let status = response.status().as_u16();
            let body = response.bytes().await.expect("body");
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            (
                status,
                body["headers"]["x-consumer-id"].as_str().map(str::to_owned),
            )
        };
        let ready = common::eventually(Duration::from_secs(5), async || {
            let mut all = true;
            for i in 0..gateways.len() {
                all &= send(i, Some(&probe)).await.0 == 200;
            }
            all
        })
        .await;
        assert!(ready.is_some(), "the JWKS was never fetched: {case}");
        // The token's consumer takes one request, then the API-key consumer `zed` spends its whole quota (3, less
        // the token's request when they are one consumer).
        let first = send(0, Some(&token)).await;
        let mut keyed = Vec::new();
        for i in 0..4 {
            keyed.push(send(i, None).await);
        }
        let zed = (200, Some("zed".to_owned()));
        let refused = (429, None);
        match prefix {
            None => {
                let apart = (200, Some("auth.example.test:zed".to_owned()));
                assert_eq!(first, apart, "{case}");
                assert_eq!(keyed, [zed.clone(), zed.clone(), zed, refused], "{case}");
                assert_eq!(send(1, Some(&token)).await, apart, "{case}");
                // Blocking the API-key consumer blocks no token.
                let record = serde_json::from_value(json!({"blocked": true})).expect("record");
                let consumers = gateways[0].gateway.consumers().expect("consumers");
                consumers.directory().put("zed", record).await.expect("put");
                assert_eq!(send(0, None).await.0, 403, "{case}");
                assert_eq!(send(0, Some(&token)).await, apart, "{case}");
            }
            // Joined on purpose: the token's request spent one of the three.
            Some(_) => {
                assert_eq!(first, zed, "{case}");
                assert_eq!(
                    keyed,
                    [zed.clone(), zed, refused.clone(), refused],
                    "{case}"
                );
            }
        }
    }
}

/// `hide_credentials: true` in a `jwt:` block: the token that named the caller is not sent upstream (the upstream
/// learns the caller from `forward:`), while an `Authorization` of another scheme, which named nobody, goes as sent.
#[tokio::test]
async fn a_hidden_token_never_reaches_the_upstream() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let rest = r#"  forward: { consumer: X-Consumer-Id }
routes:
  - name: open
    match: { path_prefix: /open }
    upstream: backend
    consumers: optional
"#;
    let gateway = with_jwks_file(&upstream, &dir, "        hide_credentials: true\n", rest).await;
    let rsa = rsa_key("rsa-1");
    let echoed = async |authorization: &str| {
        let response = client()
            .get(gateway.url("/open/x"))
            .header("authorization", authorization)
            .send()
            .await
            .expect("send");
        assert_eq!(response.status(), 200);
        let body = response.bytes().await.expect("body");
        serde_json::from_slice::<Value>(&body).expect("an echo")["headers"].clone()
    };
    let token = sign(&rsa, &claims("ann", "free", json!({})));
    let headers = echoed(&format!("Bearer {token}")).await;
    assert_eq!(
        headers["x-consumer-id"],
        format!("{}:ann", &ISSUER[8..]),
        "{headers}"
    );
    assert_eq!(
        headers.get("authorization"),
        None,
        "the token reached the upstream: {headers}"
    );
    let headers = echoed("Basic dXNlcjpwYXNz").await;
    assert_eq!(headers.get("x-consumer-id"), None, "{headers}");
    assert_eq!(headers["authorization"], "Basic dXNlcjpwYXNz");
}
