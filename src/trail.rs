//! What one request's way through the gateway leaves for its access line and its trace: the decision and the limit
//! that refused it, its caller and plan, the limiter call, the upstream target and how long it took to answer, the
//! body bytes each way. Below admission and the proxy, which note into it, and the gateway, which writes the line
//! and the spans; kept only for a request whose line is written or whose trace is sampled.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Request};
use http_body::{Body, Frame, SizeHint};

use crate::trace_context::TraceContext;

/// One request's trail, carried in its extensions (as `Arc<Trail>`) while an access line will be written for it.
/// Everything that notes into it finds it there, so a request without one pays one look into an empty map.
#[derive(Debug, Default)]
pub struct Trail {
    noted: Mutex<Noted>,
    received: AtomicU64,
    /// The request's server span, when its trace is sampled.
    span: Option<TraceContext>,
}

/// What the request's way noted, read once when its line is written.
#[derive(Debug, Default, Clone)]
pub struct Noted {
    /// The limit that refused the request, as its refusal names it.
    pub limit: Option<Box<str>>,
    /// The identified consumer.
    pub consumer: Option<Arc<str>>,
    /// The consumer's plan.
    pub plan: Option<Box<str>>,
    /// The upstream target that was sent the request (its authority).
    pub upstream: Option<HeaderValue>,
    /// From sending the request upstream to the answer's head (or the failure).
    pub upstream_time: Option<Duration>,
    /// `allowed` or `denied`, once the limits were asked.
    pub decision: Option<&'static str>,
    /// The shadow limits that would have denied the request, comma-separated.
    pub shadow_denied: Option<Box<str>>,
    /// The limiter call, on a sampled trace.
    pub limiter_call: Option<LimiterCall>,
    /// The upstream call, on a sampled trace.
    pub upstream_call: Option<UpstreamCall>,
}

/// One limiter call, as its span tells it.
#[derive(Debug, Clone)]
pub struct LimiterCall {
    /// When it was asked.
    pub start: SystemTime,
    /// How long it took.
    pub took: Duration,
    /// The store behind the limiter (`redis`, `memory`).
    pub store: &'static str,
    /// Whether the in-process fallback decided, the store having failed.
    pub fallback: bool,
    /// How many limits (keys) it asked about.
    pub keys: usize,
    /// How many requests the Redis call that decided it carried, itself included; 0 when no Redis call did.
    pub batch: u32,
}

/// The request sent upstream, as its span tells it.
#[derive(Debug, Clone)]
pub struct UpstreamCall {
    /// The span, a child of the request's, named in the `traceparent` sent upstream.
    pub span: TraceContext,
    /// When it was sent.
    pub start: SystemTime,
    /// The upstream's status, when it answered.
    pub status: Option<u16>,
}

// === impl Trail ===

impl Trail {
    /// A trail for a request whose server span is `span` (`None`: no sampled trace).
    pub fn new(span: Option<TraceContext>) -> Self {
        Self {
            span,
            ..Self::default()
        }
    }

    /// The request's server span, when its trace is sampled.
    pub fn span(&self) -> Option<&TraceContext> {
        self.span.as_ref()
    }

    /// The trail `request` carries, if an access line will be written for it or its trace is sampled.
    #[inline]
    pub fn of<B>(request: &Request<B>) -> Option<&Arc<Trail>> {
        request.extensions().get::<Arc<Trail>>()
    }

    /// Notes the caller admission identified.
    pub fn note_caller(&self, consumer: Option<&Arc<str>>, plan: Option<&str>) {
        let mut noted = self.lock();
        noted.consumer = consumer.cloned();
        noted.plan = plan.map(Box::from);
    }

    /// Notes the limit that refused the request.
    pub fn note_refusing_limit(&self, limit: &str) {
        let mut noted = self.lock();
        noted.limit = Some(Box::from(limit));
        noted.decision = Some("denied");
    }

    /// Notes that the limits admitted the request.
    pub fn note_admitted(&self) {
        self.lock().decision = Some("allowed");
    }

    /// Notes the shadow limits that would have denied the request.
    pub fn note_shadow_denials<'n>(&self, names: impl Iterator<Item = &'n str>) {
        let names = names.collect::<Vec<_>>();
        if !names.is_empty() {
            self.lock().shadow_denied = Some(names.join(",").into_boxed_str());
        }
    }

    /// Notes the limiter call (kept on a sampled trace only).
    pub fn note_limiter_call(&self, call: impl FnOnce() -> LimiterCall) {
        if self.span.is_some() {
            self.lock().limiter_call = Some(call());
        }
    }

    /// Notes the upstream call as it is sent (on a sampled trace only).
    pub fn note_upstream_call(&self, call: UpstreamCall) {
        self.lock().upstream_call = Some(call);
    }

    /// Notes the upstream target sent the request.
    pub fn note_upstream(&self, target: &HeaderValue) {
        self.lock().upstream = Some(target.clone());
    }

    /// Notes how long the upstream took to answer (or to fail), and its status when it answered.
    pub fn note_upstream_answer(&self, elapsed: Duration, status: Option<u16>) {
        let mut noted = self.lock();
        noted.upstream_time = Some(elapsed);
        if let Some(call) = &mut noted.upstream_call {
            call.status = status;
        }
    }

    /// What was noted so far.
    pub fn noted(&self) -> Noted {
        self.lock().clone()
    }

    /// Reads what was noted so far, in place.
    pub fn read<R>(&self, read: impl FnOnce(&Noted) -> R) -> R {
        read(&self.lock())
    }

    /// The body bytes read from the client so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// A lock held for a field's write: a poisoned one (a panic while writing a field) still holds usable facts.
    fn lock(&self) -> std::sync::MutexGuard<'_, Noted> {
        self.noted.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A request body that adds what it yields to its trail's received bytes.
#[derive(Debug)]
pub struct Received<B> {
    inner: B,
    trail: Arc<Trail>,
}

// === impl Received ===

impl<B> Received<B> {
    /// Counts `inner`'s bytes into `trail`.
    pub fn new(inner: B, trail: Arc<Trail>) -> Self {
        Self { inner, trail }
    }
}

impl<B> Body for Received<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let polled = std::pin::Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.trail
                    .received
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
