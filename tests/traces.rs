//! Traces from the running binary to a real OTLP/HTTP receiver, which decodes what it gets with the OpenTelemetry
//! project's own protobuf types: the server span and its children for the limiter and the upstream, the
//! `traceparent` the upstream receives, parent-based sampling, and a collector that is down or never answers
//! costing dropped spans (counted), never a request.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use axum::Router;
use common::binary::Tollgate;
use common::eventually;
use common::http_client::{client, metrics_text};
use common::pki::{Issued, TestCa};
use common::redis::RedisServer;
use common::upstream::{serve_tls, TlsServer, Upstream};
use futures_util::StreamExt;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;

/// The spans a collector received, each with the service name it came with.
type Received = Arc<Mutex<Vec<(String, Span)>>>;

/// An OTLP/HTTP receiver on a free port, keeping every span it decoded and the service names they came with.
struct Collector {
    url: String,
    received: Received,
    _task: tokio::task::JoinHandle<()>,
}

impl Collector {
    async fn start() -> Self {
        let received = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(receive))
            .with_state(received.clone());
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url,
            received,
            _task: task,
        }
    }

    fn spans(&self) -> Vec<(String, Span)> {
        self.received.lock().expect("spans").clone()
    }

    /// Waits for the spans of the trace `trace_id` (hex) to hold `n` spans, and returns them.
    async fn trace(&self, trace_id: &str, n: usize) -> Vec<Span> {
        let of_trace = || -> Vec<Span> {
            self.spans()
                .into_iter()
                .map(|(_, span)| span)
                .filter(|span| hex(&span.trace_id) == trace_id)
                .collect()
        };
        eventually(Duration::from_secs(10), async || of_trace().len() >= n).await;
        let spans = of_trace();
        assert_eq!(spans.len(), n, "{spans:#?}");
        spans
    }
}

async fn receive(
    State(received): State<Received>,
    headers: http::HeaderMap,
    body: Bytes,
) -> http::StatusCode {
    assert_eq!(headers["content-type"], "application/x-protobuf");
    keep(
        &received,
        ExportTraceServiceRequest::decode(body).expect("an OTLP export request"),
    );
    http::StatusCode::OK
}

/// The same receiver over OTLP/gRPC: the OpenTelemetry project's generated `TraceService`, served by tonic.
struct GrpcCollector(Received);

#[tonic::async_trait]
impl TraceService for GrpcCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// The receiver over TLS with `server`'s certificate: OTLP/HTTP (`https://`), or gRPC (`grpcs://`).
    async fn start_tls(server: &Issued, grpc: bool) -> (Self, TlsServer) {
        let received = Received::default();
        let app = if grpc {
            let service = TraceServiceServer::new(GrpcCollector(received.clone()));
            tonic::service::Routes::new(service).into_axum_router()
        } else {
            Router::new()
                .route("/v1/traces", post(receive))
                .with_state(received.clone())
        };
        let served = serve_tls(app, server, None).await;
        let scheme = if grpc { "grpcs" } else { "https" };
        let collector = Self {
            url: format!("{scheme}://{}", served.addr),
            received,
            _task: tokio::spawn(async {}),
        };
        (collector, served)
    }

    async fn start_grpc() -> Self {
        let received = Received::default();
        let service = TraceServiceServer::new(GrpcCollector(received.clone()));
        let app = tonic::service::Routes::new(service).into_axum_router();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("grpc://{}", listener.local_addr().expect("addr"));
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            url,
            received,
            _task: task,
        }
    }
}

/// Keeps the spans of `request`, each with its resource's service name.
fn keep(received: &Received, request: ExportTraceServiceRequest) {
    let mut received = received.lock().expect("spans");
    for resource in request.resource_spans {
        let service = resource
            .resource
            .iter()
            .flat_map(|resource| &resource.attributes)
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                received.push((service.clone(), span));
            }
        }
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(text) => Some(text.clone()),
        Value::IntValue(n) => Some(n.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The attribute `key` of `span`, as text.
fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
}

fn named(spans: &[Span], kind: i32) -> &Span {
    spans
        .iter()
        .find(|span| span.kind == kind)
        .unwrap_or_else(|| panic!("a span of kind {kind} in {spans:#?}"))
}

const SERVER: i32 = 2;
const CLIENT: i32 = 3;
const INTERNAL: i32 = 1;

/// The binary with traces sent to `endpoint` at `ratio`, one upstream, a route limited to 1 an hour per `x-user`
/// header, and one under a shadow limit of 1 an hour.
/// The binary sending its traces to `endpoint` at `ratio`, with its upstream and its config's folder.
struct Traced {
    gateway: Tollgate,
    upstream: Upstream,
    _dir: tempfile::TempDir,
}

async fn traced(endpoint: &str, ratio: &str) -> Traced {
    traced_on(endpoint, ratio, None).await
}

/// [`traced`] with its limits in `redis` (the memory store when `None`).
async fn traced_on(endpoint: &str, ratio: &str, redis: Option<&RedisServer>) -> Traced {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let gateway = gateway(&dir, endpoint, ratio, &upstream, redis);
    Traced {
        gateway,
        upstream,
        _dir: dir,
    }
}

fn gateway(
    dir: &tempfile::TempDir,
    endpoint: &str,
    ratio: &str,
    upstream: &Upstream,
    redis: Option<&RedisServer>,
) -> Tollgate {
    let store = common::store_yaml(redis);
    let yaml = format!(
        r#"listen: 127.0.0.1:0
admin:
  listen: 127.0.0.1:0
store:
{store}telemetry:
  otlp:
    endpoint: {endpoint}
    service_name: edge-gateway
    sample_ratio: {ratio}
upstreams:
  backend:
    targets: ["{}"]
routes:
  - name: api
    match: {{ path_prefix: /api }}
    upstream: backend
    limits:
      - {{ name: per-user, key: "header:x-user", algorithm: fixed_window, limit: 1, period: 1h }}
  - name: shadowed
    match: {{ path_prefix: /shadowed }}
    upstream: backend
    limits:
      - {{ name: cap, key: route, algorithm: fixed_window, limit: 1, period: 1h, shadow: true }}
"#,
        upstream.url()
    );
    let path = dir.path().join("gateway.yaml");
    std::fs::write(&path, yaml).expect("config written");
    Tollgate::run(&path)
}

/// GET `path` from `gateway` as `user` (its `x-user` header) with `traceparent`, when given.
async fn get(
    gateway: &Tollgate,
    path: &str,
    user: Option<&str>,
    traceparent: Option<String>,
) -> reqwest::Response {
    let mut request = client().get(gateway.url(path));
    if let Some(user) = user {
        request = request.header("x-user", user);
    }
    if let Some(traceparent) = traceparent {
        request = request.header("traceparent", traceparent);
    }
    request.send().await.expect("request")
}

/// The echo upstream's JSON answer.
async fn echo(response: reqwest::Response) -> serde_json::Value {
    serde_json::from_slice(&response.bytes().await.expect("body")).expect("echo")
}

/// The `traceparent` the echo upstream received, from its JSON answer.
fn sent_upstream(echo: &serde_json::Value) -> String {
    echo["headers"]["traceparent"]
        .as_str()
        .expect("a traceparent sent upstream")
        .to_owned()
}

#[tokio::test]
async fn a_sampled_request_gives_a_server_span_with_its_limiter_and_upstream_children() {
    let collector = Collector::start().await;
    // A ratio of 0 starts no trace of its own: a sampled parent is followed whatever the ratio.
    let Traced {
        gateway,
        upstream,
        _dir,
    } = traced(&collector.url, "0").await;
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let admitted = get(
        &gateway,
        "/api/orders",
        Some("alice"),
        Some(format!("00-{trace_id}-{parent}-01")),
    )
    .await;
    assert_eq!(admitted.status(), 200);
    let echo = echo(admitted).await;

    let spans = collector.trace(trace_id, 3).await;
    assert!(collector
        .spans()
        .iter()
        .all(|(service, _)| service == "edge-gateway"));
    let server = named(&spans, SERVER);
    assert_eq!(hex(&server.parent_span_id), parent);
    assert_eq!(server.name, "GET api");
    assert_eq!(
        attribute(server, "http.request.method").as_deref(),
        Some("GET")
    );
    assert_eq!(attribute(server, "http.route").as_deref(), Some("api"));
    assert_eq!(
        attribute(server, "url.path").as_deref(),
        Some("/api/orders")
    );
    assert_eq!(
        attribute(server, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(
        attribute(server, "tollgate.decision").as_deref(),
        Some("allowed")
    );
    assert!(server.end_time_unix_nano > server.start_time_unix_nano);

    let limiter = named(&spans, INTERNAL);
    assert_eq!(limiter.parent_span_id, server.span_id);
    assert_eq!(
        attribute(limiter, "tollgate.store").as_deref(),
        Some("memory")
    );
    assert_eq!(attribute(limiter, "tollgate.keys").as_deref(), Some("1"));
    assert_eq!(
        attribute(limiter, "tollgate.fallback").as_deref(),
        Some("false")
    );
    // The memory store makes no call that could carry others.
    assert_eq!(attribute(limiter, "tollgate.batch_size"), None);

    let client_span = named(&spans, CLIENT);
    assert_eq!(client_span.parent_span_id, server.span_id);
    assert_eq!(
        attribute(client_span, "server.port").as_deref(),
        Some(&*upstream.addr.port().to_string())
    );
    assert_eq!(
        attribute(client_span, "http.response.status_code").as_deref(),
        Some("200")
    );
    // The upstream joins the trace under the client span.
    assert_eq!(
        sent_upstream(&echo),
        format!("00-{trace_id}-{}-01", hex(&client_span.span_id))
    );

    // The second request of the hour is refused: its server span says by which limit, and has no upstream child.
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let refused = get(
        &gateway,
        "/api/orders",
        Some("alice"),
        Some(format!("00-{trace_id}-b7ad6b7169203331-01")),
    )
    .await;
    assert_eq!(refused.status(), 429);
    let spans = collector.trace(trace_id, 2).await;
    let server = named(&spans, SERVER);
    assert_eq!(
        attribute(server, "tollgate.decision").as_deref(),
        Some("denied")
    );
    assert_eq!(
        attribute(server, "tollgate.limit").as_deref(),
        Some("per-user")
    );
    assert_eq!(
        attribute(server, "http.response.status_code").as_deref(),
        Some("429")
    );
    // A refusal is the client's outcome, not the server's failure.
    assert!(server.status.as_ref().is_none_or(|status| status.code != 2));
    assert!(spans.iter().all(|span| span.kind != CLIENT));
}

#[tokio::test]
async fn an_unsampled_request_records_nothing_but_still_sends_a_traceparent_upstream() {
    let collector = Collector::start().await;
    let Traced {
        gateway,
        upstream: _upstream,
        _dir,
    } = traced(&collector.url, "0").await;
    // No traceparent, ratio 0: a new trace, not sampled.
    let fresh: serde_json::Value = echo(get(&gateway, "/api/a", Some("u1"), None).await).await;
    let fresh = sent_upstream(&fresh);
    assert!(
        fresh.starts_with("00-") && fresh.ends_with("-00"),
        "{fresh}"
    );
    // A parent that says not sampled: kept in its trace, not sampled.
    let unsampled = "11111111111111111111111111111111";
    let followed: serde_json::Value = echo(
        get(
            &gateway,
            "/api/b",
            Some("u2"),
            Some(format!("00-{unsampled}-2222222222222222-00")),
        )
        .await,
    )
    .await;
    let followed = sent_upstream(&followed);
    assert!(
        followed.starts_with(&format!("00-{unsampled}-")),
        "{followed}"
    );
    assert!(
        followed.ends_with("-00") && !followed.contains("2222222222222222"),
        "{followed}"
    );
    // A sampled request after them: once its spans arrived, the two before would have too.
    let marker = "33333333333333333333333333333333";
    get(
        &gateway,
        "/api/c",
        Some("u3"),
        Some(format!("00-{marker}-4444444444444444-01")),
    )
    .await;
    collector.trace(marker, 3).await;
    let traces: std::collections::HashSet<String> = collector
        .spans()
        .iter()
        .map(|(_, span)| hex(&span.trace_id))
        .collect();
    assert_eq!(traces.len(), 1, "{traces:?}");
}

#[tokio::test]
async fn a_ratio_of_one_samples_every_new_trace() {
    let collector = Collector::start().await;
    let Traced {
        gateway,
        upstream: _upstream,
        _dir,
    } = traced(&collector.url, "1.0").await;
    let echo: serde_json::Value = echo(get(&gateway, "/api/a", Some("u1"), None).await).await;
    let sent = sent_upstream(&echo);
    assert!(sent.ends_with("-01"), "{sent}");
    let trace_id = &sent[3..35];
    let spans = collector.trace(trace_id, 3).await;
    // A new trace: the server span is its root.
    assert!(named(&spans, SERVER).parent_span_id.is_empty());
    let log = gateway.log();
    // The access line names the trace.
    assert!(log.contains(trace_id), "{log}");
}

/// The dropped-span counter of the gateway's metrics.
async fn dropped_spans(gateway: &Tollgate) -> f64 {
    metrics_text(&gateway.admin_url(""))
        .await
        .lines()
        .find(|line| line.starts_with("tollgate_telemetry_dropped_spans_total"))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_collector_that_is_down_costs_dropped_spans_not_requests() {
    let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let Traced {
        gateway,
        upstream: _upstream,
        _dir,
    } = traced(&endpoint, "1").await;
    for i in 0..20 {
        let status = get(&gateway, "/api/a", Some(&format!("user-{i}")), None)
            .await
            .status();
        assert_eq!(status, 200);
    }
    assert!(
        eventually(Duration::from_secs(10), async || dropped_spans(&gateway)
            .await
            >= 60.0)
        .await
        .is_some(),
        "{}",
        metrics_text(&gateway.admin_url("")).await
    );
    // The counter moves before the warning is written, and the log is read from the process's stderr as it comes.
    assert!(
        eventually(Duration::from_secs(10), async || gateway
            .log()
            .contains("spans not exported"))
        .await
        .is_some(),
        "{}",
        gateway.log()
    );
}

#[tokio::test]
async fn a_collector_that_never_answers_fills_a_bounded_queue_and_requests_go_on() {
    // Accepts connections and never reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", silent.local_addr().unwrap());
    let _held = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let Traced {
        gateway,
        upstream: _upstream,
        _dir,
    } = traced(&endpoint, "1").await;
    // 3 spans a request: 2,000 requests are more than the queue's 4,096 spans and one batch of 512 on its way.
    let requests = (0..2000).map(|i| {
        let url = gateway.url("/api/a");
        async move {
            client()
                .get(url)
                .header("x-user", format!("user-{i}"))
                .send()
                .await
                .map(|response| response.status().as_u16())
                .unwrap_or(0)
        }
    });
    let statuses: Vec<u16> = futures_util::stream::iter(requests)
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(statuses.iter().all(|&status| status == 200), "{statuses:?}");
    // Whatever was not queued or on its way was dropped, and counted.
    let least = 6000.0 - 4096.0 - 512.0;
    assert!(
        eventually(Duration::from_secs(10), async || dropped_spans(&gateway)
            .await
            >= least)
        .await
        .is_some(),
        "{}",
        dropped_spans(&gateway).await
    );
}

#[tokio::test]
async fn spans_reach_a_grpc_collector() {
    let collector = Collector::start_grpc().await;
    let Traced {
        gateway,
        upstream: _upstream,
        _dir,
    } = traced(&collector.url, "1").await;
    let trace_id = "5bf92f3577b34da6a3ce929d0e0e4736";
    let response = get(
        &gateway,
        "/api/orders",
        Some("alice"),
        Some(format!("00-{trace_id}-00f067aa0ba902b7-01")),
    )
    .await;
    assert_eq!(response.status(), 200);
    let spans = collector.trace(trace_id, 3).await;
    assert_eq!(named(&spans, SERVER).name, "GET api");
    assert!(collector
        .spans()
        .iter()
        .all(|(service, _)| service == "edge-gateway"));
}

#[tokio::test]
async fn a_shadow_limit_that_would_deny_is_named_on_the_admitted_request() {
    let collector = Collector::start().await;
    let Traced {
        gateway,
        upstream: _upstream,
        _dir,
    } = traced(&collector.url, "1").await;
    let traces = [
        "6bf92f3577b34da6a3ce929d0e0e4736",
        "7bf92f3577b34da6a3ce929d0e0e4736",
    ];
    for trace_id in traces {
        let response = get(
            &gateway,
            "/shadowed",
            None,
            Some(format!("00-{trace_id}-00f067aa0ba902b7-01")),
        )
        .await;
        assert_eq!(response.status(), 200);
    }
    let first = collector.trace(traces[0], 3).await;
    assert_eq!(
        attribute(named(&first, SERVER), "tollgate.shadow_denied"),
        None
    );
    let second = collector.trace(traces[1], 3).await;
    let server = named(&second, SERVER);
    assert_eq!(
        attribute(server, "tollgate.decision").as_deref(),
        Some("allowed")
    );
    assert_eq!(
        attribute(server, "tollgate.shadow_denied").as_deref(),
        Some("cap")
    );
}

#[tokio::test]
async fn a_limiter_span_on_redis_tells_how_many_requests_its_call_carried() {
    let redis = RedisServer::start();
    let collector = Collector::start().await;
    let Traced {
        gateway,
        upstream: _upstream,
        _dir,
    } = traced_on(&collector.url, "1.0", Some(&redis)).await;
    let limiter_spans = || -> Vec<Span> {
        collector
            .spans()
            .into_iter()
            .map(|(_, span)| span)
            .filter(|span| span.kind == INTERNAL)
            .collect()
    };

    // Alone, a request's check is a call of its own.
    let sent = sent_upstream(&echo(get(&gateway, "/api/a", Some("solo"), None).await).await);
    let spans = collector.trace(&sent[3..35], 3).await;
    let limiter = named(&spans, INTERNAL);
    assert_eq!(
        attribute(limiter, "tollgate.store").as_deref(),
        Some("redis")
    );
    assert_eq!(
        attribute(limiter, "tollgate.batch_size").as_deref(),
        Some("1")
    );

    // A burst: every request of a call reports the call's size, so calls of b requests give a multiple of b spans
    // of size b, however the batcher happened to group them.
    let users: Vec<String> = (0..64).map(|i| format!("u{i}")).collect();
    let burst = users
        .iter()
        .map(|user| get(&gateway, "/api/b", Some(user), None));
    for response in futures_util::future::join_all(burst).await {
        assert_eq!(response.status(), 200);
    }
    eventually(Duration::from_secs(10), async || {
        limiter_spans().len() >= 65
    })
    .await;
    let mut sizes = std::collections::BTreeMap::<u64, usize>::new();
    for span in limiter_spans() {
        let size = attribute(&span, "tollgate.batch_size").expect("a batch size on Redis");
        *sizes.entry(size.parse().expect("a number")).or_default() += 1;
    }
    assert_eq!(sizes.values().sum::<usize>(), 65, "{sizes:?}");
    for (&size, &count) in &sizes {
        assert!((1..=128).contains(&size), "{sizes:?}");
        assert_eq!(
            count as u64 % size,
            0,
            "calls of {size} requests: {sizes:?}"
        );
    }
}

#[tokio::test]
async fn spans_reach_collectors_over_tls_whose_certificate_chains_to_the_ca_file_only() {
    let certificates = tempfile::tempdir().expect("tempdir");
    let ca = TestCa::new(certificates.path(), "collector");
    let issued = ca.issue("collector", &["127.0.0.1"]);
    for grpc in [false, true] {
        let (collector, _served) = Collector::start_tls(&issued, grpc).await;
        // The endpoint's line, then the CA file that its certificate chains to.
        let trusting = format!("{}\n    ca_file: {}", collector.url, ca.ca_file.display());
        let Traced {
            gateway,
            upstream: _upstream,
            _dir,
        } = traced(&trusting, "1.0").await;
        let sent = sent_upstream(&echo(get(&gateway, "/api/a", Some("u1"), None).await).await);
        let spans = collector.trace(&sent[3..35], 3).await;
        assert_eq!(named(&spans, SERVER).name, "GET api", "grpc: {grpc}");
    }

    // Trusting another CA, the handshake fails: the spans are dropped and counted, and the request is served all
    // the same.
    let other = TestCa::new(certificates.path(), "other");
    let (collector, _served) = Collector::start_tls(&issued, false).await;
    let distrusting = format!(
        "{}\n    ca_file: {}",
        collector.url,
        other.ca_file.display()
    );
    let Traced {
        gateway,
        upstream: _upstream,
        _dir,
    } = traced(&distrusting, "1.0").await;
    assert_eq!(
        get(&gateway, "/api/a", Some("u1"), None).await.status(),
        200
    );
    eventually(Duration::from_secs(10), async || {
        dropped_spans(&gateway).await >= 3.0
    })
    .await;
    assert!(collector.spans().is_empty());
}
