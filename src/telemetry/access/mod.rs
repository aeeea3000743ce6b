//! The access log: one line per request on the target `tollgate::access`, written when its answer's body has been
//! sent (or the client left), with what the request's [`Trail`] noted on its way there; and, for a sampled trace,
//! its spans handed to the tracer at the same moment.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Instant, SystemTime};

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response};
use http_body::{Frame, SizeHint};

mod line;

pub use line::{write_directly, LineFormat};

use self::line::Fields;
use super::trace::{self, Served, Tracer};
use crate::trace_context::TraceContext;
use crate::trail::{Received, Trail};

/// The log target of access lines: `RUST_LOG=info,tollgate::access=off` drops them.
pub const TARGET: &str = "tollgate::access";

/// An access line (and a sampled trace's spans) in the making: what the request said when it arrived, and its
/// trail.
#[derive(Debug)]
pub struct AccessLine {
    /// Whether the line is written (the log's filter lets it through).
    log: bool,
    /// The tracer, the request's server span and its parent's id, on a sampled trace.
    traced: Option<(Arc<Tracer>, TraceContext, Option<[u8; 8]>)>,
    started: Instant,
    started_at: SystemTime,
    method: Method,
    /// The path as received (the route matched its canonical form).
    path: Box<str>,
    client: IpAddr,
    peer: IpAddr,
    request_id: HeaderValue,
    trace_id: Option<TraceContext>,
    route: Option<Box<str>>,
    status: u16,
    sent: u64,
    trail: Arc<Trail>,
}

// === impl AccessLine ===

impl AccessLine {
    /// Starts the line of `request` when access lines are written, and its trace when `tracer` is on (`None`, at
    /// the cost of one check, when neither): the request's trail goes into its extensions, its body counts what
    /// it yields, and the `traceparent` sent upstream is tollgate's.
    #[inline]
    pub fn begin(
        request: &mut Request<Body>,
        client: IpAddr,
        peer: IpAddr,
        request_id: &HeaderValue,
        tracer: Option<&Arc<Tracer>>,
    ) -> Option<Self> {
        let log = tracing::enabled!(target: TARGET, tracing::Level::INFO);
        if !log && tracer.is_none() {
            return None;
        }
        Self::begin_enabled(request, (client, peer), request_id, log, tracer)
    }

    #[cold]
    #[inline(never)]
    fn begin_enabled(
        request: &mut Request<Body>,
        (client, peer): (IpAddr, IpAddr),
        request_id: &HeaderValue,
        log: bool,
        tracer: Option<&Arc<Tracer>>,
    ) -> Option<Self> {
        let span = tracer.map(|tracer| tracer.server_span(request.headers()));
        if let Some((span, _)) = span.filter(|(span, _)| !span.sampled) {
            // Not sampled: nothing is recorded, but the upstream still joins the trace, unsampled too.
            trace::propagate(request.headers_mut(), &span);
            if !log {
                return None;
            }
        }
        let trace_id = match span {
            Some((span, _)) => Some(span),
            None => TraceContext::of(request.headers()),
        };
        let traced = tracer
            .zip(span)
            .filter(|(_, (span, _))| span.sampled)
            .map(|(tracer, (span, parent))| (Arc::clone(tracer), span, parent));
        let trail = Arc::new(Trail::new(traced.as_ref().map(|(_, span, _)| *span)));
        request.extensions_mut().insert(Arc::clone(&trail));
        let body = std::mem::take(request.body_mut());
        *request.body_mut() = Body::new(Received::new(body, Arc::clone(&trail)));
        Some(Self {
            log,
            traced,
            started: Instant::now(),
            started_at: SystemTime::now(),
            method: request.method().clone(),
            path: Box::from(request.uri().path()),
            client,
            peer,
            request_id: request_id.clone(),
            trace_id,
            route: None,
            status: 0,
            sent: 0,
            trail,
        })
    }

    /// Follows `response`, the answer of the request on `route`: the line is written once its body has been sent.
    pub fn follow(mut self, route: Option<&str>, response: Response<Body>) -> Response<Body> {
        self.route = route.map(Box::from);
        self.status = response.status().as_u16();
        response.map(|body| Body::new(Logged { body, line: self }))
    }

    /// Writes the line, and hands a sampled trace's spans to the tracer.
    fn finish(&self) {
        if self.log {
            self.write();
        }
        if let Some((tracer, span, parent)) = &self.traced {
            let served = Served {
                method: &self.method,
                path: &self.path,
                route: self.route.as_deref(),
                status: self.status,
                client: self.client,
                start: self.started_at,
                took: self.started.elapsed(),
            };
            tracer.finish(span, *parent, &served, &self.trail);
        }
    }

    fn write(&self) {
        let trace_id = self.trace_id.as_ref().map(TraceContext::trace_id_hex);
        self.trail.read(|noted| {
            Fields {
                method: self.method.as_str(),
                path: &self.path,
                route: self.route.as_deref().unwrap_or("none"),
                status: self.status,
                client: self.client,
                peer: self.peer,
                request_id: self.request_id.to_str().unwrap_or_default(),
                trace_id: trace_id
                    .as_ref()
                    .and_then(|hex| std::str::from_utf8(hex).ok()),
                limit: noted.limit.as_deref(),
                consumer: noted.consumer.as_deref(),
                plan: noted.plan.as_deref(),
                upstream: noted
                    .upstream
                    .as_ref()
                    .and_then(|target| target.to_str().ok()),
                upstream_us: noted.upstream_time.map(|time| micros(time.as_micros())),
                bytes_received: self.trail.received(),
                bytes_sent: self.sent,
                duration_us: micros(self.started.elapsed().as_micros()),
            }
            .write();
        });
    }
}

/// Microseconds as the log writes them: a whole number (584,000 years fit).
fn micros(us: u128) -> u64 {
    u64::try_from(us).unwrap_or(u64::MAX)
}

/// An answer's body that counts what it sends and writes its request's access line when it is dropped: after
/// its end, or when the client left before it.
struct Logged {
    body: Body,
    line: AccessLine,
}

impl http_body::Body for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.line.sent += data.len() as u64;
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.line.finish();
    }
}
