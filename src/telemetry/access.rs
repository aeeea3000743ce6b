//! The access log: one line per request on the target `tollgate::access`, written when its answer's body has been
//! sent (or the client left), with what the request's [`Trail`] noted on its way there.

use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Request, Response};
use http_body::{Frame, SizeHint};

use crate::trail::{Received, Trail};

/// The log target of access lines: `RUST_LOG=info,tollgate::access=off` drops them.
pub const TARGET: &str = "tollgate::access";

/// An access line in the making: what the request said when it arrived, and its trail.
#[derive(Debug)]
pub struct AccessLine {
    started: Instant,
    method: Method,
    /// The path as received (the route matched its canonical form).
    path: Box<str>,
    client: IpAddr,
    peer: IpAddr,
    request_id: HeaderValue,
    trace_id: Option<TraceId>,
    route: Option<Box<str>>,
    status: u16,
    sent: u64,
    trail: Arc<Trail>,
}

/// A W3C trace id, as the 32 lower-case hex digits `traceparent` carries it.
#[derive(Debug, Clone, Copy)]
struct TraceId([u8; 32]);

// === impl AccessLine ===

impl AccessLine {
    /// Starts the line of `request` when access lines are written (`None`, at the cost of one check, when not):
    /// its trail goes into the request's extensions, and its body counts what it yields.
    #[inline]
    pub fn begin(
        request: &mut Request<Body>,
        client: IpAddr,
        peer: IpAddr,
        request_id: &HeaderValue,
    ) -> Option<Self> {
        if !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
            return None;
        }
        Some(Self::begin_enabled(request, client, peer, request_id))
    }

    #[cold]
    #[inline(never)]
    fn begin_enabled(
        request: &mut Request<Body>,
        client: IpAddr,
        peer: IpAddr,
        request_id: &HeaderValue,
    ) -> Self {
        let trail = Arc::new(Trail::default());
        request.extensions_mut().insert(Arc::clone(&trail));
        let body = std::mem::take(request.body_mut());
        *request.body_mut() = Body::new(Received::new(body, Arc::clone(&trail)));
        Self {
            started: Instant::now(),
            method: request.method().clone(),
            path: Box::from(request.uri().path()),
            client,
            peer,
            request_id: request_id.clone(),
            trace_id: TraceId::of(request.headers()),
            route: None,
            status: 0,
            sent: 0,
            trail,
        }
    }

    /// Follows `response`, the answer of the request on `route`: the line is written once its body has been sent.
    pub fn follow(mut self, route: Option<&str>, response: Response<Body>) -> Response<Body> {
        self.route = route.map(Box::from);
        self.status = response.status().as_u16();
        response.map(|body| Body::new(Logged { body, line: self }))
    }

    /// Writes the line.
    fn write(&self) {
        let noted = self.trail.noted();
        tracing::info!(
            target: TARGET,
            method = %self.method,
            path = &*self.path,
            route = self.route.as_deref().unwrap_or("none"),
            status = self.status,
            client = %self.client,
            peer = %self.peer,
            request_id = self.request_id.to_str().unwrap_or_default(),
            trace_id = self.trace_id.as_ref().map(TraceId::as_str),
            limit = noted.limit.as_deref(),
            consumer = noted.consumer.as_deref(),
            plan = noted.plan.as_deref(),
            upstream = noted.upstream.as_ref().and_then(|target| target.to_str().ok()),
            upstream_us = noted.upstream_time.map(|time| micros(time.as_micros())),
            bytes_received = self.trail.received(),
            bytes_sent = self.sent,
            duration_us = micros(self.started.elapsed().as_micros()),
        );
    }
}

/// Microseconds as the log writes them: a whole number (584,000 years fit).
fn micros(us: u128) -> u64 {
    u64::try_from(us).unwrap_or(u64::MAX)
}

// === impl TraceId ===

impl TraceId {
    /// The trace id of a well-formed `traceparent` (`00-<trace id>-<parent id>-<flags>`), if `headers` carry one.
    fn of(headers: &HeaderMap) -> Option<Self> {
        let value = headers.get("traceparent")?.as_bytes();
        let mut fields = value.split(|&byte| byte == b'-');
        let version = fields.next()?;
        let trace_id = fields.next()?;
        let parent_id = fields.next()?;
        let flags = fields.next()?;
        let hex = |field: &[u8], len| {
            field.len() == len && field.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        };
        let well_formed = hex(version, 2)
            && version != b"ff"
            && hex(trace_id, 32)
            && hex(parent_id, 16)
            && hex(flags, 2)
            // Version 00 has exactly four fields; later versions may add some.
            && (version != b"00" || fields.next().is_none())
            && trace_id.iter().any(|&b| b != b'0')
            && parent_id.iter().any(|&b| b != b'0');
        well_formed.then(|| Self(trace_id.try_into().unwrap_or([b'0'; 32])))
    }

    fn as_str(&self) -> &str {
        // Only hex digits were copied in.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
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
        self.line.write();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_id(traceparent: &str) -> Option<String> {
        let mut headers = HeaderMap::new();
        headers.insert("traceparent", HeaderValue::from_str(traceparent).unwrap());
        TraceId::of(&headers).map(|id| id.as_str().to_owned())
    }

    #[test]
    fn a_well_formed_traceparent_gives_its_trace_id() {
        assert_eq!(
            trace_id("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
        // A later version may carry more fields.
        assert!(
            trace_id("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").is_some()
        );
    }

    #[test]
    fn a_malformed_traceparent_gives_none() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(trace_id(bad), None, "{bad}");
        }
    }
}
