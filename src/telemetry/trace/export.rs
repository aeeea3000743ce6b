//! Spans leave the request path through a bounded queue: a task batches them and posts each batch to the
//! collector over OTLP/HTTP. A full queue (a collector slow, down or never answering) drops spans and counts them
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
    ExportTraceServiceRequest, InstrumentationScope, KeyValue, Resource, ResourceSpans, ScopeSpans,
    Span,
};

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
    /// Starts the task that sends what the queue takes to `endpoint`, as `service_name`. Needs a tokio runtime.
    pub(super) fn start(endpoint: Uri, service_name: &str) -> Self {
        let (spans, waiting) = mpsc::channel(QUEUE_SPANS);
        let exporter = Exporter::new(endpoint, service_name);
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
    client: Client<HttpConnector, Full<Bytes>>,
    endpoint: Uri,
    resource: Resource,
    scope: InstrumentationScope,
    /// Whether the last POST failed: a failure is logged when it starts, not once per batch.
    failing: bool,
}

// === impl Exporter ===

impl Exporter {
    fn new(endpoint: Uri, service_name: &str) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(EXPORT_TIMEOUT));
        Self {
            client: Client::builder(TokioExecutor::new()).build(connector),
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
            let body = self.encode(std::mem::take(&mut batch));
            batch.reserve(BATCH_SPANS);
            let outcome = tokio::time::timeout(EXPORT_TIMEOUT, self.post(body)).await;
            let failure = match outcome {
                Ok(Ok(())) => None,
                Ok(Err(reason)) => Some(reason),
                Err(_) => Some(format!("no answer within {EXPORT_TIMEOUT:?}")),
            };
            self.note(spans, failure);
        }
    }

    fn encode(&self, spans: Vec<Span>) -> Bytes {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(self.scope.clone()),
                    spans,
                }],
            }],
        };
        Bytes::from(request.encode_to_vec())
    }

    async fn post(&self, body: Bytes) -> Result<(), String> {
        let mut request = Request::post(self.endpoint.clone())
            .body(Full::new(body))
            .map_err(|error| error.to_string())?;
        request.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/x-protobuf"),
        );
        let response = self
            .client
            .request(request)
            .await
            .map_err(|error| error.to_string())?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("the collector answered {}", response.status()))
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
