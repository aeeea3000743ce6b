//! The future a [`RateLimit`](super::RateLimit) service returns: the limiter's answer, then the inner service's.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use http::Response;

/// The response future of [`RateLimit`](super::RateLimit): the refusal, or the inner service's response with the
/// rate-limit headers.
///
/// Boxed because asking the store is an `async fn`; one allocation per request buys a nameable type.
pub struct ResponseFuture<E> {
    inner: Pin<Box<dyn Future<Output = Result<Response<Body>, E>> + Send>>,
}

// === impl ResponseFuture ===

impl<E> ResponseFuture<E> {
    pub(super) fn new(
        future: impl Future<Output = Result<Response<Body>, E>> + Send + 'static,
    ) -> Self {
        Self {
            inner: Box::pin(future),
        }
    }
}

impl<E> Future for ResponseFuture<E> {
    type Output = Result<Response<Body>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.inner.as_mut().poll(cx)
    }
}

impl<E> fmt::Debug for ResponseFuture<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}
