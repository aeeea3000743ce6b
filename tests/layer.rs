//! The tower layer in real axum and hyper servers on loopback: counts, refusals, keys, readiness, shared Redis.

mod common;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::Router;
use http::{Request, Response, StatusCode};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::{Layer, Service, ServiceExt};

use common::eventually;
use common::http_client::client;
use common::redis::RedisServer;
use tollgate::admission::LimitSettings;
use tollgate::config::{parse_rate, Config};
use tollgate::key::{Counts, KeyPart, KeySpec, MissingKey, StatusSet, TokenKind};
use tollgate::layer::{Builder, ClientIpHeader, LayerError, RateLimitLayer};
use tollgate::limiter::store::RedisStore;
use tollgate::limiter::{
    Algorithm, Backend, LeakyMode, Limit, ManualClock, OnError, Rate, RateLimiter,
};

/// Wall-clock milliseconds the manual clocks start at (an aligned minute, 2023-11-14).
const T0: i64 = 1_699_999_980_000;

/// An axum app with the layer in front of `GET /api/items`, served on 127.0.0.1 and a free port; stopped when
/// dropped.
struct App {
    addr: SocketAddr,
    /// How many requests reached the handler.
    calls: Arc<AtomicUsize>,
    server: JoinHandle<()>,
}

/// How the app is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Peer {
    /// With `into_make_service_with_connect_info::<SocketAddr>()`, as the docs ask.
    ConnectInfo,
    /// Plain `Router` service: no `ConnectInfo` extension.
    Missing,
}

/// The one helper that starts apps: the layer around a handler that counts its calls.
async fn serve(layer: RateLimitLayer, peer: Peer) -> App {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let handler = move || {
        counted.fetch_add(1, Ordering::SeqCst);
        async { ([("x-inner", "yes")], "items\n") }
    };
    let router = Router::new().route("/api/items", get(handler)).layer(layer);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let server = tokio::spawn(async move {
        let served = match peer {
            Peer::ConnectInfo => {
                axum::serve(
                    listener,
                    router.into_make_service_with_connect_info::<SocketAddr>(),
                )
                .await
            }
            Peer::Missing => axum::serve(listener, router).await,
        };
        served.expect("serve");
    });
    App {
        addr,
        calls,
        server,
    }
}

impl App {
    fn url(&self) -> String {
        format!("http://{}/api/items", self.addr)
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }

    /// Sends `n` GETs one after another with `headers`; returns the statuses.
    async fn hammer(&self, n: usize, headers: &[(&str, &str)]) -> Vec<u16> {
        let client = client();
        let mut statuses = Vec::with_capacity(n);
        for _ in 0..n {
            let mut request = client.get(self.url());
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            statuses.push(request.send().await.expect("request").status().as_u16());
        }
        statuses
    }
}

impl Drop for App {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// An in-process limiter on a clock that only moves when the test says, so counts are exact.
fn manual_limiter() -> (Arc<RateLimiter>, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(T0));
    let limiter = RateLimiter::new(
        Backend::Memory,
        Duration::from_millis(25),
        OnError::Local,
        10_000,
        clock.clone(),
    );
    (Arc::new(limiter), clock)
}

/// The builder the tests start from: the layer of scope `api` on `limiter`.
fn api_layer(limiter: Arc<RateLimiter>) -> Builder {
    RateLimitLayer::builder().limiter(limiter).scope("api")
}

/// The layer `configure` makes of [`api_layer`] on an in-process limiter with a manual clock, served with
/// `ConnectInfo`; and that clock.
async fn app_with(configure: impl FnOnce(Builder) -> Builder) -> (App, Arc<ManualClock>) {
    let (limiter, clock) = manual_limiter();
    let layer = configure(api_layer(limiter))
        .build()
        .expect("a valid layer");
    (serve(layer, Peer::ConnectInfo).await, clock)
}

/// `config`'s route `route` as a layer on `limiter`.
fn route_layer(config: &Config, route: &str, limiter: Arc<RateLimiter>) -> RateLimitLayer {
    RateLimitLayer::from_route(config, route)
        .expect("the route exists")
        .limiter(limiter)
        .build()
        .expect("a valid layer")
}

fn statuses(ok: usize, denied: usize) -> Vec<u16> {
    let mut expected = vec![200; ok];
    expected.extend(std::iter::repeat_n(429, denied));
    expected
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

fn sliding_window(limit: u64) -> Algorithm {
    Algorithm::SlidingWindow {
        limit,
        period_ms: 60_000,
    }
}

#[tokio::test]
async fn admits_exactly_the_burst_then_refills() {
    let (app, clock) = app_with(|layer| {
        layer.limit_by(
            "per-ip",
            ["ip"],
            Algorithm::TokenBucket {
                rate: parse_rate("5/s").unwrap(),
                burst: 10,
            },
        )
    })
    .await;

    assert_eq!(app.hammer(13, &[]).await, statuses(10, 3));
    assert_eq!(app.calls(), 10);
    // 400 ms at 5 per second refill exactly two tokens.
    clock.advance(400);
    assert_eq!(app.hammer(3, &[]).await, statuses(2, 1));
    assert_eq!(app.calls(), 12);
}

#[tokio::test]
async fn refusal_carries_the_json_body_and_rate_limit_headers() {
    let (app, _clock) = app_with(|layer| layer.limit_by("per-ip", ["ip"], sliding_window(2))).await;
    let client = client();

    let first = client.get(app.url()).send().await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(header(&first, "x-inner"), Some("yes"));
    assert_eq!(header(&first, "x-ratelimit-limit"), Some("2"));
    assert_eq!(header(&first, "x-ratelimit-remaining"), Some("1"));
    assert_eq!(
        header(&first, "ratelimit-policy"),
        Some("\"per-ip\";q=2;w=60")
    );
    assert_eq!(first.text().await.unwrap(), "items\n");
    assert_eq!(
        client.get(app.url()).send().await.unwrap().status(),
        StatusCode::OK
    );

    let denied = client.get(app.url()).send().await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "content-type"), Some("application/json"));
    assert_eq!(header(&denied, "x-inner"), None);
    assert_eq!(header(&denied, "x-ratelimit-limit"), Some("2"));
    assert_eq!(header(&denied, "x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        header(&denied, "ratelimit-policy"),
        Some("\"per-ip\";q=2;w=60")
    );
    let retry_after: u64 = header(&denied, "retry-after").unwrap().parse().unwrap();
    let reset = header(&denied, "x-ratelimit-reset").unwrap().to_owned();
    assert_eq!(
        header(&denied, "ratelimit"),
        Some(format!("\"per-ip\";r=0;t={reset}").as_str())
    );
    let body: serde_json::Value = serde_json::from_str(&denied.text().await.unwrap()).unwrap();
    assert_eq!(body["error"], "rate_limited");
    assert_eq!(body["route"], "api");
    assert_eq!(body["limit"], "per-ip");
    let retry_after_ms = body["retry_after_ms"].as_u64().unwrap();
    assert!(retry_after_ms > 0);
    assert_eq!(retry_after, retry_after_ms.div_ceil(1000).max(1));
    let fields: Vec<&str> = body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(fields, ["error", "route", "limit", "retry_after_ms"]);
}

#[tokio::test]
async fn denied_requests_never_reach_the_inner_service() {
    let (app, _clock) = app_with(|layer| layer.limit_by("per-ip", ["ip"], sliding_window(1))).await;

    assert_eq!(app.hammer(20, &[]).await, statuses(1, 19));
    assert_eq!(app.calls(), 1);
}

#[tokio::test]
async fn api_keys_have_budgets_of_their_own() {
    let (app, _clock) =
        app_with(|layer| layer.limit_by("per-key", ["header:x-api-key"], sliding_window(2))).await;

    assert_eq!(
        app.hammer(3, &[("x-api-key", "alpha")]).await,
        statuses(2, 1)
    );
    assert_eq!(
        app.hammer(3, &[("x-api-key", "beta")]).await,
        statuses(2, 1)
    );
    // Without the header the client address is the key (`missing: ip`): a third budget.
    assert_eq!(app.hammer(3, &[]).await, statuses(2, 1));
    assert_eq!(
        app.hammer(1, &[("x-api-key", "alpha")]).await,
        statuses(0, 1)
    );
    assert_eq!(app.calls(), 6);
}

#[tokio::test]
async fn missing_key_part_can_skip_the_limit() {
    let skip = LimitSettings::new(
        Limit::new("per-key", sliding_window(1), 1).unwrap(),
        KeySpec::new(
            vec![KeyPart::parse("header:x-api-key").unwrap()],
            MissingKey::Skip,
        ),
    );
    let (app, _clock) = app_with(|layer| layer.limit(skip)).await;

    assert_eq!(app.hammer(4, &[]).await, statuses(4, 0));
    assert_eq!(app.hammer(2, &[("x-api-key", "k")]).await, statuses(1, 1));
}

/// An inner service that is never ready and must never be called; counts how often its readiness is asked for
/// (by admitted requests only: the layer's own `poll_ready` does not ask).
#[derive(Debug, Clone, Default)]
struct NeverReady {
    polled: Arc<AtomicUsize>,
}

impl Service<Request<Body>> for NeverReady {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.polled.fetch_add(1, Ordering::SeqCst);
        Poll::Pending
    }

    fn call(&mut self, _request: Request<Body>) -> Self::Future {
        panic!("called without being ready");
    }
}

fn request_from(peer: &str) -> Request<Body> {
    let mut request = Request::get("/api/items")
        .body(Body::empty())
        .expect("request");
    let addr: SocketAddr = peer.parse().expect("socket address");
    request.extensions_mut().insert(ConnectInfo(addr));
    request
}

#[tokio::test]
async fn poll_ready_never_waits_and_refusals_skip_the_inner_service() {
    let (limiter, _clock) = manual_limiter();
    let layer = api_layer(limiter)
        .limit_by("per-ip", ["ip"], sliding_window(1))
        .build()
        .unwrap();
    let inner = NeverReady::default();
    let polled = Arc::clone(&inner.polled);
    let mut service = layer.layer(inner);
    let bound = Duration::from_secs(1);

    // Ready at once although the inner service never is.
    tokio::time::timeout(bound, service.ready())
        .await
        .expect("poll_ready waited")
        .unwrap();
    // The admitted request waits for the inner service, as it must: it asks for its readiness, which never comes...
    let admitted = tokio::spawn(service.call(request_from("192.0.2.1:4000")));
    let waiting = eventually(bound, async || polled.load(Ordering::SeqCst) == 1).await;
    assert!(
        waiting.is_some(),
        "the admitted request never reached the inner service"
    );
    assert!(!admitted.is_finished());
    // ...while the refused one is answered without it.
    service.ready().await.unwrap();
    let refused = tokio::time::timeout(bound, service.call(request_from("192.0.2.1:4001")))
        .await
        .expect("refusal waited")
        .unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        polled.load(Ordering::SeqCst),
        1,
        "the refusal asked the inner service"
    );
    // Another client's budget is untouched: admitted, it waits for the inner service too.
    service.ready().await.unwrap();
    let other = tokio::spawn(service.call(request_from("198.51.100.7:4000")));
    let waiting = eventually(bound, async || polled.load(Ordering::SeqCst) == 2).await;
    assert!(
        waiting.is_some(),
        "the other client's request was not admitted"
    );
    assert!(!other.is_finished());
    admitted.abort();
    other.abort();
}

#[tokio::test]
async fn limits_a_plain_hyper_service() {
    use http_body_util::Full;
    use hyper::body::Incoming;
    use hyper_util::rt::TokioIo;

    let (limiter, _clock) = manual_limiter();
    let layer = api_layer(limiter)
        .limit_by("per-ip", ["ip"], sliding_window(2))
        .build()
        .unwrap();
    // Hyper's own body types on both sides: `Incoming` in, `Full` out.
    let hello = tower::service_fn(|_request: Request<Incoming>| async {
        Ok::<_, Infallible>(Response::new(Full::new(bytes::Bytes::from_static(b"hi\n"))))
    });
    let service = layer.layer(hello);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            let service = service.clone();
            // Plain hyper has no `ConnectInfo`: the server puts the peer where the layer looks for it.
            let per_request = hyper::service::service_fn(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert(ConnectInfo(peer));
                service.clone().oneshot(request)
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), per_request),
            );
        }
    });
    let client = client();
    let url = format!("http://{addr}/");

    let mut seen = Vec::new();
    for _ in 0..3 {
        let response = client.get(&url).send().await.unwrap();
        seen.push((response.status().as_u16(), response.text().await.unwrap()));
    }
    assert_eq!(seen[0], (200, "hi\n".to_owned()));
    assert_eq!(seen[1].0, 200);
    assert_eq!(seen[2].0, 429);
    assert!(seen[2].1.contains("\"rate_limited\""), "{}", seen[2].1);
    // The refusal names the request as the gateway's does: the client's id, or one made for it.
    let refused = client
        .get(&url)
        .header("x-request-id", "req-7")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 429);
    assert_eq!(refused.headers()["x-request-id"], "req-7");
    let refused = client.get(&url).send().await.unwrap();
    let made = refused.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(made.len(), 32, "{made}");
    server.abort();
}

#[tokio::test]
async fn headers_on_admitted_responses_can_be_turned_off() {
    let (app, _clock) = app_with(|layer| {
        layer
            .limit_by("per-ip", ["ip"], sliding_window(1))
            .headers(false)
    })
    .await;
    let client = client();

    let admitted = client.get(app.url()).send().await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(header(&admitted, "x-ratelimit-limit"), None);
    assert_eq!(header(&admitted, "ratelimit-policy"), None);
    let denied = client.get(app.url()).send().await.unwrap();
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&denied, "x-ratelimit-limit"), Some("1"));
}

#[tokio::test]
async fn deny_status_is_configurable() {
    let (app, _clock) = app_with(|layer| {
        layer
            .limit_by("per-ip", ["ip"], sliding_window(1))
            .deny_status(StatusCode::SERVICE_UNAVAILABLE)
    })
    .await;
    assert_eq!(app.hammer(2, &[]).await, [200, 503]);
}

#[tokio::test]
async fn leaky_bucket_delay_holds_the_request_before_the_inner_service() {
    // Real time: the hold is a real sleep. One request per 200 ms, a meter of one.
    let layer = RateLimitLayer::builder()
        .memory_store()
        .scope("api")
        .limit_by(
            "smooth",
            ["ip"],
            Algorithm::LeakyBucket {
                rate: Rate::new(5, 1_000).unwrap(),
                burst: 1,
                mode: LeakyMode::Delay {
                    max_delay_ms: 1_000,
                },
            },
        )
        .build()
        .unwrap();
    let app = serve(layer, Peer::ConnectInfo).await;
    let client = client();

    let started = Instant::now();
    assert_eq!(client.get(app.url()).send().await.unwrap().status(), 200);
    assert_eq!(client.get(app.url()).send().await.unwrap().status(), 200);
    let elapsed = started.elapsed();
    assert!(
        elapsed >= Duration::from_millis(150),
        "held only {elapsed:?}"
    );
    assert_eq!(app.calls(), 2);
}

#[tokio::test]
async fn without_connect_info_every_client_shares_one_address() {
    let (limiter, _clock) = manual_limiter();
    let layer = api_layer(limiter.clone())
        .limit_by("per-ip", ["ip"], sliding_window(2))
        .build()
        .unwrap();
    let app = serve(layer, Peer::Missing).await;

    assert_eq!(app.hammer(3, &[]).await, statuses(2, 1));
    // What clients say of themselves changes nothing: no peer is trusted.
    let spoofed = [("x-forwarded-for", "203.0.113.9")];
    assert_eq!(app.hammer(1, &spoofed).await, statuses(0, 1));
    assert_eq!(limiter.local().len(), 1);
}

#[tokio::test]
async fn from_route_applies_a_gateway_config_route() {
    let yaml = r#"
store:
  backend: memory
  key_prefix: "app:"
routes:
  - name: demo
    match: { path_prefix: /demo }
    respond: { status: 200 }
    limits:
      - name: per-ip
        key: ip
        algorithm: fixed_window
        limit: 3
        period: 1h
  - name: api
    match: { path_prefix: /api }
    respond: { status: 200 }
    deny_status: 503
    headers: false
    limits:
      - name: per-ip
        key: ip
        algorithm: sliding_log
        limit: 2
        period: 1m
      - name: per-tenant
        key: [query:tenant]
        missing: skip
        algorithm: gcra
        rate: 1/1m
        burst: 1
"#;
    let config = tollgate::config::parse(yaml, Path::new("layer-test.yaml")).unwrap();
    let (limiter, _clock) = manual_limiter();
    let layer = route_layer(&config, "api", limiter.clone());
    assert_eq!(layer.scope(), "api");
    let names: Vec<&str> = layer.limits().limits().map(|l| l.limit.name()).collect();
    assert_eq!(names, ["per-ip", "per-tenant"]);
    let app = serve(layer, Peer::ConnectInfo).await;
    let client = client();

    let admitted = client.get(app.url()).send().await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(header(&admitted, "x-ratelimit-limit"), None);
    assert_eq!(app.hammer(2, &[]).await, [200, 503]);
    assert_eq!(limiter.local().len(), 1);

    assert!(matches!(
        RateLimitLayer::from_route(&config, "nope"),
        Err(LayerError::UnknownRoute(name)) if name == "nope"
    ));
}

#[test]
fn builder_reports_mistakes() {
    let ok = || RateLimitLayer::builder().memory_store().scope("api");
    let error = |builder: tollgate::layer::Builder| builder.build().unwrap_err();

    assert_eq!(
        error(
            RateLimitLayer::builder()
                .scope("api")
                .limit_by("l", ["ip"], sliding_window(1))
        ),
        LayerError::NoLimiter
    );
    assert_eq!(
        error(
            RateLimitLayer::builder()
                .memory_store()
                .limit_by("l", ["ip"], sliding_window(1))
        ),
        LayerError::MissingName("scope")
    );
    assert_eq!(
        error(ok()),
        LayerError::NoLimits {
            scope: "api".into()
        }
    );
    assert_eq!(
        error(ok().limit_by("l", ["ip"], sliding_window(1)).limit_by(
            "l",
            ["route"],
            sliding_window(2)
        )),
        LayerError::DuplicateLimit {
            scope: "api".into(),
            limit: "l".into()
        }
    );
    let bad_part = error(ok().limit_by("l", ["cookie:session"], sliding_window(1)));
    assert!(matches!(bad_part, LayerError::Key { ref limit, .. } if limit == "l"));
    assert!(
        bad_part.to_string().contains("unknown key part"),
        "{bad_part}"
    );
    let zero = error(ok().limit_by("l", ["ip"], sliding_window(0)));
    assert!(matches!(zero, LayerError::Limit { ref limit, .. } if limit == "l"));
    assert_eq!(
        error(ok().limit_by("", ["ip"], sliding_window(1))),
        LayerError::MissingName("limit")
    );
    assert!(ok()
        .limit_by("l", Vec::<String>::new(), sliding_window(1))
        .build()
        .is_ok());
}

#[test]
fn token_limits_are_refused_at_build_since_the_layer_cannot_read_usage() {
    // A route with usage: is an LLM API's: its tokens are read from request and answer bodies, which a layer
    // around a generic service cannot do. Refused, instead of built without its token limits (limiting nothing).
    let yaml = r#"
store:
  backend: memory
upstreams:
  llm: { targets: ["http://127.0.0.1:9"] }
routes:
  - name: chat
    match: { path_prefix: /v1/ }
    upstream: llm
    usage: { format: openai, reserve: { prompt: body_bytes, completion: max_tokens, completion_default: 100 } }
    limits:
      - { name: tpm, key: ip, algorithm: fixed_window, limit: 1000, period: 1h, counts: total_tokens }
      - { name: rpm, key: ip, algorithm: fixed_window, limit: 10, period: 1h }
"#;
    let config = tollgate::config::parse(yaml, Path::new("layer-test.yaml")).unwrap();
    let refused = RateLimitLayer::from_route(&config, "chat").unwrap_err();
    assert_eq!(
        refused,
        LayerError::ReadsUsage {
            route: "chat".into()
        }
    );
    assert!(
        refused.to_string().contains("usage:"),
        "a reason a reader can act on: {refused}"
    );

    // The same limit added by hand.
    let tpm = LimitSettings::new(
        Limit::new("tpm", sliding_window(1000), 1).unwrap(),
        KeySpec::new(vec![KeyPart::Ip], MissingKey::Ip),
    )
    .counting(Counts::Tokens(TokenKind::Total));
    let refused = RateLimitLayer::builder()
        .memory_store()
        .scope("api")
        .limit(tpm)
        .build()
        .unwrap_err();
    assert_eq!(
        refused,
        LayerError::CountsTokens {
            limit: "tpm".into()
        }
    );
    // Limits counting answers by status are read from the answer's head, which the layer sees: built.
    let mut unauthorized = StatusSet::default();
    unauthorized.add("401").unwrap();
    let failed = LimitSettings::new(
        Limit::new("failed", sliding_window(5), 1).unwrap(),
        KeySpec::new(vec![KeyPart::Ip], MissingKey::Ip),
    )
    .counting(Counts::Status(unauthorized));
    assert!(RateLimitLayer::builder()
        .memory_store()
        .scope("login")
        .limit(failed)
        .build()
        .is_ok());
}

/// A Redis limiter that refuses (503) when Redis fails.
async fn redis_limiter(url: &str, timeout: Duration) -> Arc<RateLimiter> {
    let store = RedisStore::connect(url, 2, Duration::from_secs(1)).expect("redis url");
    Arc::new(RateLimiter::new(
        Backend::Redis(store),
        timeout,
        OnError::Deny,
        10_000,
        Arc::new(tollgate::limiter::SystemClock),
    ))
}

#[tokio::test]
async fn redis_store_is_shared_between_apps_with_the_gateway_key_layout() {
    let redis = RedisServer::start();
    let layer = |limiter: Arc<RateLimiter>| {
        api_layer(limiter)
            .key_prefix("t:")
            .limit_by(
                "per-ip",
                ["ip"],
                // 20000 days (2024-10-04 to 2079-07-08 on Redis's clock): the window never ends mid-test.
                Algorithm::FixedWindow {
                    limit: 3,
                    period_ms: 20_000 * 86_400_000,
                },
            )
            .build()
            .unwrap()
    };
    // Two apps with limiters of their own, as two instances of a service would have.
    let mut apps = Vec::new();
    for _ in 0..2 {
        let limiter = redis_limiter(&redis.url(), Duration::from_millis(500)).await;
        let Backend::Redis(store) = limiter.backend() else {
            unreachable!("a redis limiter");
        };
        assert!(store.wait_connected(Duration::from_secs(5)).await);
        apps.push(serve(layer(limiter), Peer::ConnectInfo).await);
    }

    assert_eq!(apps[0].hammer(2, &[]).await, statuses(2, 0));
    assert_eq!(apps[1].hammer(3, &[]).await, statuses(1, 2));
    assert_eq!(apps[0].hammer(1, &[]).await, statuses(0, 1));
    assert_eq!(apps[0].calls() + apps[1].calls(), 3);
    assert_eq!(
        redis
            .cli(&["EXISTS", "t:api:per-ip:{127.0.0.1}"])
            .as_deref(),
        Some("1")
    );
}

/// A layer's own limit keyed by the header the consumers' API keys are sent in keys by the key's digest, as the
/// gateway's limits do: the key never stands in a store key.
#[tokio::test]
async fn a_layer_limit_keyed_by_the_consumers_key_header_stores_its_digest() {
    use sha2::{Digest, Sha256};
    let redis = RedisServer::start();
    let limiter = redis_limiter(&redis.url(), Duration::from_millis(500)).await;
    let Backend::Redis(store) = limiter.backend() else {
        unreachable!("a redis limiter");
    };
    assert!(store.wait_connected(Duration::from_secs(5)).await);
    let consumers = tollgate::consumers::ConsumersSettings::from_yaml(
        "identify: [{ api_key: { header: x-api-key } }]\nkeys: [{ key: live-key-1, consumer: c, plan: p }]\nplans:\n  p: { limits: [] }\n",
        Path::new("consumers.yaml"),
    )
    .unwrap();
    let layer = api_layer(limiter)
        .consumers(consumers, tollgate::consumers::ConsumerMode::Optional)
        .limit_by("by-key", ["header:x-api-key"], sliding_window(10))
        .build()
        .unwrap();
    let app = serve(layer, Peer::ConnectInfo).await;
    assert_eq!(
        app.hammer(1, &[("x-api-key", "live-key-1")]).await,
        statuses(1, 0)
    );
    let keys = redis.cli(&["KEYS", "*"]).expect("KEYS");
    let digest = hex(&Sha256::digest(b"live-key-1"));
    assert!(
        !keys.contains("live-key-1"),
        "the key in a store key:\n{keys}"
    );
    assert!(
        keys.contains(&format!("tollgate:api:by-key:{{{digest}}}")),
        "{keys}"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn store_failure_with_on_error_deny_answers_503() {
    // Nothing listens there (held, not listening): every check fails and the policy refuses.
    let reserved = common::ReservedPort::new();
    let dead = format!("redis://{}", reserved.addr());
    let limiter = redis_limiter(&dead, Duration::from_millis(100)).await;
    let layer = api_layer(limiter)
        .limit_by("per-ip", ["ip"], sliding_window(10))
        .build()
        .unwrap();
    let app = serve(layer, Peer::ConnectInfo).await;

    let response = client().get(app.url()).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = serde_json::from_str(&response.text().await.unwrap()).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"error": "limiter_unavailable", "route": "api"})
    );
    assert_eq!(app.calls(), 0);
}

/// The route config the equivalence test gives both the gateway and the layer: limits keyed three ways (a
/// leaky bucket that delays included), an allowlist, trusted proxies so that the test can speak for several
/// clients over loopback.
const SAME_ROUTE: &str = r#"
store: { backend: memory }
client_ip:
  trusted_proxies: [127.0.0.1/32]
consumers:
  identify: [ { api_key: { header: x-client-key } } ]
  keys: [ { key: pro-key, consumer: acme, plan: pro } ]
  plans:
    pro: { limits: [ { name: hourly, key: consumer, algorithm: fixed_window, limit: 2, period: 1h } ] }
routes:
  - name: api
    match: { path_prefix: /api }
    # As the layer's inner handler answers, so that only admission can tell the two apart.
    respond: { status: 200, body: "items\n", headers: { content-type: "text/plain; charset=utf-8" } }
    allow: [10.0.0.0/8]
    limits:
      - { name: per-ip, key: ip, algorithm: sliding_window, limit: 4, period: 1m }
      - { name: per-key, key: [header:x-api-key], missing: skip, algorithm: token_bucket, rate: 1/s, burst: 2 }
      - { name: paced, key: route, algorithm: leaky_bucket, rate: 50/s, burst: 20, mode: delay, max_delay: 1s }
"#;

#[tokio::test]
async fn the_gateway_and_the_layer_answer_a_request_sequence_alike() {
    let config = common::config(SAME_ROUTE);
    let (gateway_limiter, _gateway_clock) = manual_limiter();
    let gateway = common::start_with_limiter(config.clone(), gateway_limiter).await;
    let (layer_limiter, _layer_clock) = manual_limiter();
    let layer = route_layer(&config, "api", layer_limiter);
    let app = serve(layer, Peer::ConnectInfo).await;

    // Clients by X-Forwarded-For (10.x is allowlisted), keys by X-Api-Key (sent twice: ambiguous), in an order that
    // exhausts each limit in turn.
    let sequence: &[&[(&str, &str)]] = &[
        &[("x-forwarded-for", "203.0.113.1"), ("x-api-key", "k1")],
        &[("x-forwarded-for", "203.0.113.1"), ("x-api-key", "k1")],
        &[("x-forwarded-for", "203.0.113.2"), ("x-api-key", "k1")],
        &[("x-forwarded-for", "203.0.113.1")],
        &[("x-forwarded-for", "203.0.113.1")],
        &[("x-forwarded-for", "203.0.113.1")],
        &[("x-forwarded-for", "10.1.2.3"), ("x-api-key", "k1")],
        &[
            ("x-forwarded-for", "203.0.113.3"),
            ("x-api-key", "a"),
            ("x-api-key", "b"),
        ],
        &[("x-forwarded-for", "203.0.113.3"), ("x-api-key", "k2")],
        // A consumer's plan limit across client addresses, and a key that does not verify.
        &[
            ("x-forwarded-for", "203.0.113.4"),
            ("x-client-key", "pro-key"),
        ],
        &[
            ("x-forwarded-for", "203.0.113.5"),
            ("x-client-key", "pro-key"),
        ],
        &[
            ("x-forwarded-for", "203.0.113.6"),
            ("x-client-key", "pro-key"),
        ],
        &[
            ("x-forwarded-for", "203.0.113.6"),
            ("x-client-key", "stolen"),
        ],
    ];
    let fields = [
        "retry-after",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "ratelimit-policy",
        "ratelimit",
        "content-type",
        "www-authenticate",
    ];
    let client = client();
    let mut statuses = Vec::new();
    for headers in sequence {
        let mut answers = Vec::new();
        for url in [gateway.url("/api/items"), app.url()] {
            let mut request = client.get(url);
            for (name, value) in *headers {
                request = request.header(*name, *value);
            }
            let response = request.send().await.expect("request");
            let status = response.status().as_u16();
            let seen: Vec<Option<String>> = fields
                .iter()
                .map(|name| {
                    response
                        .headers()
                        .get(*name)
                        .map(|v| v.to_str().expect("text").to_owned())
                })
                .collect();
            let body = response.text().await.expect("body");
            answers.push((status, seen, body));
        }
        assert_eq!(
            answers[0], answers[1],
            "gateway, then layer, for {headers:?}"
        );
        statuses.push(answers[0].0);
    }
    // The sequence reaches every answer there is: admitted, refused by each keyed limit, exempt, ambiguous, refused
    // by a plan's limit, an unknown key.
    assert_eq!(
        statuses,
        [200, 200, 429, 200, 200, 429, 200, 400, 200, 200, 200, 429, 401]
    );
}

#[tokio::test]
async fn the_layer_believes_only_the_client_ip_header_it_is_told_from_trusted_proxies() {
    // From code: a trusted proxy that writes Forwarded, and passes the client's own X-Forwarded-For through.
    let (app, _clock) = app_with(|layer| {
        layer
            .limit_by("per-ip", ["ip"], sliding_window(1))
            .trusted_proxies([std::net::IpAddr::from([127, 0, 0, 1])])
            .client_ip_header(ClientIpHeader::Forwarded)
    })
    .await;
    let first = [
        ("forwarded", "for=203.0.113.1"),
        ("x-forwarded-for", "198.51.100.1"),
    ];
    assert_eq!(app.hammer(1, &first).await, [200]);
    // Another X-Forwarded-For (or X-Real-IP) is the same client: only Forwarded names it.
    let spoofed = [
        ("forwarded", "for=203.0.113.1"),
        ("x-forwarded-for", "198.51.100.2"),
        ("x-real-ip", "198.51.100.3"),
    ];
    assert_eq!(app.hammer(1, &spoofed).await, [429]);
    assert_eq!(
        app.hammer(1, &[("forwarded", "for=203.0.113.2")]).await,
        [200]
    );

    // From a config route: client_ip.header comes with trusted_proxies.
    let config = common::config(
        r#"
store: { backend: memory }
client_ip: { trusted_proxies: [127.0.0.1/32], header: x-real-ip }
routes:
  - name: api
    match: { path_prefix: /api }
    respond: { status: 200 }
    limits: [ { name: per-ip, key: ip, algorithm: sliding_window, limit: 1, period: 1m } ]
"#,
    );
    let (limiter, _clock) = manual_limiter();
    let layer = route_layer(&config, "api", limiter);
    let app = serve(layer, Peer::ConnectInfo).await;
    assert_eq!(app.hammer(1, &[("x-real-ip", "203.0.113.1")]).await, [200]);
    let spoofed = [
        ("x-real-ip", "203.0.113.1"),
        ("x-forwarded-for", "198.51.100.2"),
        ("forwarded", "for=198.51.100.3"),
    ];
    assert_eq!(app.hammer(1, &spoofed).await, [429]);
    assert_eq!(app.hammer(1, &[("x-real-ip", "203.0.113.2")]).await, [200]);
}
