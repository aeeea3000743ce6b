//! Spans leave the request path through a bounded queue: a task batches them and sends each batch to the
//! collector, over OTLP/HTTP (a protobuf POST) or OTLP/gRPC (the `TraceService/Export` call), in clear or over TLS.
//! A full queue (a collector slow, down or never answering) drops spans and counts them
//! in `tollgate_telemetry_dropped_spans_total`; a request never waits for the collector.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Uri};
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use prost::Message;
use rustls::RootCertStore;
use tokio::sync::mpsc;

use super::otlp::{
    ExportTraceServiceRequest, ExportTraceServiceResponse, InstrumentationScope, KeyValue,
    Resource, ResourceSpans, ScopeSpans, Span,
};
use crate::config::{OtlpProtocol, OtlpSettings};
use crate::proxy::{client_config, trusted_roots};

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
    pub(super) fn start(settings: &OtlpSettings) -> Self {
        let (spans, waiting) = mpsc::channel(QUEUE_SPANS);
        match Exporter::new(settings) {
            Ok(exporter) => {
                tokio::spawn(exporter.run(waiting));
            }
            // Read when the config was loaded: a CA file gone since. The closed queue drops and counts every span.
            Err(error) => {
                tracing::error!(endpoint = %settings.endpoint, %error, "traces cannot be exported: spans dropped");
            }
        }
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
    fn new(settings: &OtlpSettings) -> Result<Self, String> {
        let endpoint = settings.endpoint.clone();
        let connector = connector(settings)?;
        let transport = match settings.protocol {
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
        Ok(Self {
            transport,
            endpoint,
            resource: Resource {
                attributes: vec![
                    KeyValue::text("service.name", &settings.service_name),
                    KeyValue::text("service.version", env!("CARGO_PKG_VERSION")),
                ],
            },
            scope: InstrumentationScope {
                name: "tollgate".to_owned(),
                version: env!("CARGO_PKG_VERSION").to_owned(),
            },
            failing: false,
        })
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

/// The collector's connections: TCP, and TLS for an `https` endpoint (ALPN `http/1.1` for OTLP/HTTP, `h2` for
/// gRPC), trusting `ca_file` or the system's roots.
type Connector = HttpsConnector<HttpConnector>;

fn connector(settings: &OtlpSettings) -> Result<Connector, String> {
    let mut tcp = HttpConnector::new();
    tcp.set_nodelay(true);
    tcp.set_connect_timeout(Some(EXPORT_TIMEOUT));
    // The TLS layer above takes the `https` addresses.
    tcp.enforce_http(false);
    let over_tls = settings.endpoint.scheme() == Some(&http::uri::Scheme::HTTPS);
    let roots = if over_tls {
        trusted_roots(settings.ca_file.as_deref()).map_err(|error| error.message)?
    } else {
        Arc::new(RootCertStore::empty())
    };
    let tls = client_config(roots).map_err(|error| error.message)?;
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    Ok(match settings.protocol {
        OtlpProtocol::Http => builder.enable_http1().wrap_connector(tcp),
        OtlpProtocol::Grpc => builder.enable_http2().wrap_connector(tcp),
    })
}

/// How batches travel.
enum Transport {
    /// OTLP/HTTP: a protobuf body POSTed to the traces address.
    Http(Client<Connector, Full<Bytes>>),
    /// OTLP/gRPC: the `Export` call over HTTP/2.
    Grpc(tonic::client::Grpc<Client<Connector, tonic::body::Body>>),
}

async fn post(
    client: &Client<Connector, Full<Bytes>>,
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
    grpc: &mut tonic::client::Grpc<Client<Connector, tonic::body::Body>>,
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
