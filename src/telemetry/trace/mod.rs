//! Traces: the W3C trace context read from each request and sent upstream, and for a sampled trace one server span
//! per request, with children for the limiter call and the upstream call, exported to an OpenTelemetry collector
//! off the request path (export.rs). Spans are built only for sampled requests, when their answer ends.

mod export;
mod otlp;

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http::{HeaderMap, Method};

use crate::config::OtlpSettings;
use crate::trace_context::{TraceContext, TRACEPARENT};
use crate::trail::{Noted, Trail};
use otlp::{span_kind, KeyValue, Span, Status, STATUS_ERROR};

/// Where sampled spans go, and which new traces are sampled.
#[derive(Debug)]
pub struct Tracer {
    /// A new trace is sampled when its id's last 8 bytes, as a number, are below this (`u64::MAX`: all).
    threshold: u64,
    queue: export::Queue,
}

/// The facts of a served request its server span carries, besides what its trail noted.
#[derive(Debug)]
pub struct Served<'a> {
    /// The request method.
    pub method: &'a Method,
    /// The path as received.
    pub path: &'a str,
    /// The route that took it.
    pub route: Option<&'a str>,
    /// The status answered.
    pub status: u16,
    /// The client address.
    pub client: IpAddr,
    /// When the request arrived, and how long it took.
    pub start: SystemTime,
    pub took: Duration,
}

// === impl Tracer ===

impl Tracer {
    /// Starts exporting to `settings`' collector. Needs a tokio runtime.
    pub fn start(settings: &OtlpSettings) -> Self {
        let threshold = if settings.sample_ratio >= 1.0 {
            u64::MAX
        } else {
            // The ratio of the id space below the threshold is the ratio asked.
            (settings.sample_ratio * u64::MAX as f64) as u64
        };
        Self {
            threshold,
            queue: export::Queue::start(settings),
        }
    }

    /// The server span of a request with `headers`: in the trace its `traceparent` names, sampled as it says
    /// (parent-based), or in a new trace sampled by the ratio.
    pub fn server_span(&self, headers: &HeaderMap) -> (TraceContext, Option<[u8; 8]>) {
        match TraceContext::of(headers) {
            Some(parent) => (parent.child(), Some(parent.span_id)),
            None => {
                let mut trace = TraceContext::new_trace(false);
                let low = u64::from_be_bytes(trace.trace_id[8..].try_into().unwrap_or_default());
                trace.sampled = self.threshold == u64::MAX || low < self.threshold;
                (trace, None)
            }
        }
    }

    /// Queues the spans of a sampled request: its server span `span` (a child of `parent`, when one came), and what
    /// its trail noted of the limiter and the upstream.
    pub fn finish(
        &self,
        span: &TraceContext,
        parent: Option<[u8; 8]>,
        served: &Served<'_>,
        trail: &Trail,
    ) {
        let noted = trail.noted();
        if let Some(call) = &noted.limiter_call {
            let mut attributes = vec![
                KeyValue::text("tollgate.store", call.store),
                KeyValue::flag("tollgate.fallback", call.fallback),
                KeyValue::int("tollgate.keys", call.keys as i64),
            ];
            // Only a Redis call has a size: the requests the batcher sent in it.
            if call.batch > 0 {
                attributes.push(KeyValue::int("tollgate.batch_size", i64::from(call.batch)));
            }
            self.queue.push(Span {
                name: "rate limit check".to_owned(),
                kind: span_kind::INTERNAL,
                start_time_unix_nano: unix_nanos(call.start),
                end_time_unix_nano: unix_nanos(call.start + call.took),
                attributes,
                ..ids(&span.child(), Some(span.span_id))
            });
        }
        if let Some(call) = &noted.upstream_call {
            self.queue
                .push(upstream_span(span, call, &noted, served.method));
        }
        self.queue.push(server_span(span, parent, served, &noted));
    }
}

fn server_span(
    span: &TraceContext,
    parent: Option<[u8; 8]>,
    served: &Served<'_>,
    noted: &Noted,
) -> Span {
    let mut attributes = vec![
        KeyValue::text("http.request.method", served.method.as_str()),
        KeyValue::text("url.path", served.path),
        KeyValue::int("http.response.status_code", i64::from(served.status)),
        KeyValue::text("client.address", served.client.to_string()),
    ];
    if let Some(route) = served.route {
        attributes.push(KeyValue::text("http.route", route));
    }
    let texts = [
        ("tollgate.decision", noted.decision),
        ("tollgate.limit", noted.limit.as_deref()),
        ("tollgate.shadow_denied", noted.shadow_denied.as_deref()),
        ("tollgate.consumer", noted.consumer.as_deref()),
        ("tollgate.plan", noted.plan.as_deref()),
    ];
    for (key, value) in texts {
        if let Some(value) = value {
            attributes.push(KeyValue::text(key, value));
        }
    }
    let name = match served.route {
        Some(route) => format!("{} {route}", served.method),
        None => served.method.to_string(),
    };
    Span {
        name,
        kind: span_kind::SERVER,
        start_time_unix_nano: unix_nanos(served.start),
        end_time_unix_nano: unix_nanos(served.start + served.took),
        attributes,
        // A server's span is an error for its own failures (5xx), not for the client's (4xx, 429 among them).
        status: (served.status >= 500).then(|| Status {
            message: String::new(),
            code: STATUS_ERROR,
        }),
        ..ids(span, parent)
    }
}

fn upstream_span(
    server: &TraceContext,
    call: &crate::trail::UpstreamCall,
    noted: &Noted,
    method: &Method,
) -> Span {
    let mut attributes = vec![KeyValue::text("http.request.method", method.as_str())];
    if let Some((host, port)) = noted
        .upstream
        .as_ref()
        .and_then(|target| target.to_str().ok())
        .and_then(|target| target.rsplit_once(':'))
    {
        attributes.push(KeyValue::text("server.address", host));
        if let Ok(port) = port.parse::<i64>() {
            attributes.push(KeyValue::int("server.port", port));
        }
    }
    if let Some(status) = call.status {
        attributes.push(KeyValue::int(
            "http.response.status_code",
            i64::from(status),
        ));
    }
    let took = noted.upstream_time.unwrap_or_default();
    Span {
        name: method.to_string(),
        kind: span_kind::CLIENT,
        start_time_unix_nano: unix_nanos(call.start),
        end_time_unix_nano: unix_nanos(call.start + took),
        attributes,
        status: call
            .status
            .is_none_or(|status| status >= 500)
            .then(|| Status {
                message: String::new(),
                code: STATUS_ERROR,
            }),
        ..ids(&call.span, Some(server.span_id))
    }
}

/// A span with `context`'s ids, under `parent`.
fn ids(context: &TraceContext, parent: Option<[u8; 8]>) -> Span {
    Span {
        trace_id: context.trace_id.to_vec(),
        span_id: context.span_id.to_vec(),
        parent_span_id: parent.map(|id| id.to_vec()).unwrap_or_default(),
        // W3C's sampled flag: only sampled spans are sent.
        flags: 1,
        ..Span::default()
    }
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

/// Sets the `traceparent` sent upstream to `span`.
pub fn propagate(headers: &mut HeaderMap, span: &TraceContext) {
    headers.insert(TRACEPARENT, span.traceparent());
}
