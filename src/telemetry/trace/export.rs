//! Spans leave the request path through a bounded queue: a task batches them and sends each batch to the
//! collector, over OTLP/HTTP (a protobuf POST) or OTLP/gRPC (the `TraceService/Export` call). A full queue (a collector slow, down or never answering) drops spans and counts them
//! in `tollgate_telemetry_dropped_spans_total`; a request never waits for the collector.

use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost::Message;
use tokio::sync::mpsc;

use super::otlp::{
    ExportTraceServiceRequest, ExportTraceServiceResponse, InstrumentationScope, KeyValue,
    Resource, ResourceSpans, ScopeSpans, Span,
};
use crate::config::OtlpProtocol;

/// The gRPC method a batch is sent to.
const GRPC_EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// Spans waiting to be sent: beyond this, new ones are dropped.
pub(super) const QUEUE_SPANS: usize = 4096;
/// Spans per POST at most.
const BATCH_SPANS: usize = 512;
/// How long a batch waits to fill before it is sent anyway.
const BATCH_WAIT: Duration = Duration::from_millis(500);
/// How long one POST may take; a collector that never answers costs its batch, not the queue behind it forever.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// The request path's end of the queue.
#[derive(Debug, Clone)]
pub(super) struct Queue {
    spans: mpsc::Sender<Span>,
}

// === impl Queue ===

impl Queue {
    /// Starts the task that sends what the queue takes to `endpoint` by `protocol`, as `service_name`. Needs a
    /// tokio runtime.
    pub(super) fn start(endpoint: Uri, protocol: OtlpProtocol, service_name: &str) -> Self {
        let (spans, waiting) = mpsc::channel(QUEUE_SPANS);
        let exporter = Exporter::new(endpoint, protocol, service_name);
        tokio::spawn(exporter.run(waiting));
        Self { spans }
    }

    /// Queues `span`, or drops and counts it when the queue is full.
    pub(super) fn push(&self, span: Span) {
        if self.spans.try_send(span).is_err() {
            dropped(1);
        }
    }
}

fn dropped(spans: usize) {
    metrics::counter!("tollgate_telemetry_dropped_spans_total").increment(spans as u64);
}

/// The task's end: batches, and where they go.
struct Exporter {
    transport: Transport,
    endpoint: Uri,
    resource: Resource,
    scope: InstrumentationScope,
    /// Whether the last POST failed: a failure is logged when it starts, not once per batch.
    failing: bool,
}

// === impl Exporter ===

impl Exporter {
    fn new(endpoint: Uri, protocol: OtlpProtocol, service_name: &str) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(EXPORT_TIMEOUT));
        let transport = match protocol {
            OtlpProtocol::Http => {
                Transport::Http(Client::builder(TokioExecutor::new()).build(connector))
            }
            OtlpProtocol::Grpc => {
                let client = Client::builder(TokioExecutor::new())
                    .http2_only(true)
                    .build(connector);
                Transport::Grpc(tonic::client::Grpc::with_origin(client, endpoint.clone()))
            }
        };
        Self {
            transport,
            endpoint,
            resource: Resource {
                attributes: vec![
                    KeyValue::text("service.name", service_name),
                    KeyValue::text("service.version", env!("CARGO_PKG_VERSION")),
                ],
            },
            scope: InstrumentationScope {
                name: "tollgate".to_owned(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
            },
            failing: false,
        }
    }

    async fn run(mut self, mut waiting: mpsc::Receiver<Span>) {
        let mut batch = Vec::with_capacity(BATCH_SPANS);
        loop {
            if waiting.recv_many(&mut batch, BATCH_SPANS).await == 0 {
                return;
            }
            if batch.len() < BATCH_SPANS {
                // Let a batch fill a little: one POST per span would cost the collector more than the spans.
                tokio::time::sleep(BATCH_WAIT).await;
                while batch.len() < BATCH_SPANS {
                    match waiting.try_recv() {
                        Ok(span) => batch.push(span),
                        Err(_) => break,
                    }
                }
            }
            let spans = batch.len();
            let request = self.request(std::mem::take(&mut batch));
            batch.reserve(BATCH_SPANS);
            let outcome = tokio::time::timeout(EXPORT_TIMEOUT, self.send(request)).await;
            let failure = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(reason)) => Some(reason),
                Err(_) => Some(format!("no answer within {EXPORT_TIMEOUT:?}")),
            };
            self.note(spans, failure);
        }
    }

    fn request(&self, spans: Vec<Span>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(self.scope.clone()),
                    spans,
                }],
            }],
        }
    }

    async fn send(&mut self, request: ExportTraceServiceRequest) -> Result<(), String> {
        match &mut self.transport {
            Transport::Http(client) => post(client, &self.endpoint, &request).await,
            Transport::Grpc(grpc) => call(grpc, request).await,
        }
    }

    /// Counts a batch that did not arrive, and logs when sending starts or stops failing.
    fn note(&mut self, spans: usize, failure: Option<String>) {
        match failure {
            Some(reason) => {
                dropped(spans);
                if !self.failing {
                    tracing::warn!(endpoint = %self.endpoint, %reason, "spans not exported: dropped until the collector answers");
                }
                self.failing = true;
            }
            None if self.failing => {
                tracing::info!(endpoint = %self.endpoint, "spans exported again");
                self.failing = false;
            }
            None => {}
        }
    }
}

/// How batches travel.
enum Transport {
    /// OTLP/HTTP: a protobuf body POSTed to the traces address.
    Http(Client<HttpConnector, Full<Bytes>>),
    /// OTLP/gRPC: the `Export` call over HTTP/2 in clear.
    Grpc(tonic::client::Grpc<Client<HttpConnector, tonic::body::Body>>),
}

async fn post(
    client: &Client<HttpConnector, Full<Bytes>>,
    endpoint: &Uri,
    request: &ExportTraceServiceRequest,
) -> Result<(), String> {
    let body = Bytes::from(request.encode_to_vec());
    let mut post = Request::post(endpoint.clone())
        .body(Full::new(body))
        .map_err(|error| error.to_string())?;
    post.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-protobuf"),
    );
    let response = client
        .request(post)
        .await
        .map_err(|error| error.to_string())?;
    if response.status().is_success() {
        Ok(())
    } else {
        Err(format!("the collector answered {}", response.status()))
    }
}

async fn call(
    grpc: &mut tonic::client::Grpc<Client<HttpConnector, tonic::body::Body>>,
    request: ExportTraceServiceRequest,
) -> Result<(), String> {
    grpc.ready().await.map_err(|error| error.to_string())?;
    let codec =
        tonic_prost::ProstCodec::<ExportTraceServiceRequest, ExportTraceServiceResponse>::default();
    grpc.unary(
        tonic::Request::new(request),
        http::uri::PathAndQuery::from_static(GRPC_EXPORT),
        codec,
    )
    .await
    .map(|_| ())
    .map_err(|status| {
        format!(
            "the collector answered {:?}: {}",
            status.code(),
            status.message()
        )
    })
}
