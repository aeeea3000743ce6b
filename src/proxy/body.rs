//! The client's request body, with its errors marked as the client's: a malformed or cut-short body is the
//! client's fault (400), told apart from an upstream failure wherever it surfaces.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use thiserror::Error;

/// The body of a request as the gateway received it, held to `server.body_read_timeout`: a wait for its next piece
/// that lasts longer fails it as the client's ([`ClientBodyError::Stalled`]), so that the upstream request is
/// cancelled and the client answered 408. The server boxes the body into an axum `Body` once either way; the clock
/// costs nothing until a read finds nothing ready.
#[derive(Debug)]
pub struct ClientBody {
    incoming: Incoming,
    read_timeout: Duration,
    /// The sleep for the current wait; made at the body's first wait.
    stall: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `stall` is set for the current wait (false again once a piece came).
    waiting: bool,
}

/// The reading of a body that nobody will use (see [`discard`]).
pub type Discarding = Pin<Box<dyn Future<Output = Result<(), axum::Error>> + Send>>;

/// The client's body could not be read: bad chunk size, fewer bytes than its `Content-Length`, connection closed
/// or reset mid-body.
#[derive(Debug, Error)]
pub enum ClientBodyError {
    /// Malformed, cut short, or the connection failed mid-body.
    #[error("the client's request body: {0}")]
    Read(#[source] hyper::Error),
    /// Larger than `server.max_body_bytes` (413).
    #[error("the client's request body is larger than server.max_body_bytes")]
    TooLarge,
    /// No piece of it came for `server.body_read_timeout` (408).
    #[error("the client's request body stalled for server.body_read_timeout")]
    Stalled,
}

/// A request body held to `server.max_body_bytes`: the reading fails as the client's ([`ClientBodyError::TooLarge`])
/// once more bytes came than that, so that the upstream request is cancelled and the client answered 413.
#[derive(Debug)]
pub struct LimitedBody {
    inner: Body,
    remaining: u64,
}

/// How much of a body a `respond` route reads before answering, and for how long, so that malformed framing is 400
/// there too. Past either the rest is left unread and the server closes the connection after the answer, as it does
/// for any body left unread: a slow or endless body delays the answer, never holds it.
const DISCARD_LIMIT: usize = 1 << 20;
const DISCARD_WITHIN: Duration = Duration::from_secs(5);

// === impl ClientBody ===

impl ClientBody {
    /// The body of a request served from `incoming`, failing when its next piece takes longer than `read_timeout`.
    pub fn new(incoming: Incoming, read_timeout: Duration) -> Self {
        Self {
            incoming,
            read_timeout,
            stall: None,
            waiting: false,
        }
    }

    /// Whether the current wait for a piece has lasted `read_timeout`; starts its clock if it is new.
    fn stalled(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.waiting {
            self.waiting = true;
            let deadline = tokio::time::Instant::now() + self.read_timeout;
            match &mut self.stall {
                Some(sleep) => sleep.as_mut().reset(deadline),
                None => self.stall = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        self.stall
            .as_mut()
            .is_some_and(|sleep| sleep.as_mut().poll(cx).is_ready())
    }
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        match Pin::new(&mut self.incoming).poll_frame(cx) {
            Poll::Ready(frame) => {
                self.waiting = false;
                Poll::Ready(frame.map(|frame| frame.map_err(ClientBodyError::Read)))
            }
            Poll::Pending if self.stalled(cx) => Poll::Ready(Some(Err(ClientBodyError::Stalled))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

// === impl ClientBodyError ===

impl LimitedBody {
    /// `body`, failing past `max` bytes.
    pub fn new(body: Body, max: u64) -> Self {
        Self {
            inner: body,
            remaining: max,
        }
    }
}

impl http_body::Body for LimitedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            let length = frame.data_ref().map_or(0, |data| data.len() as u64);
            match self.remaining.checked_sub(length) {
                Some(left) => self.remaining = left,
                None => return Poll::Ready(Some(Err(axum::Error::new(ClientBodyError::TooLarge)))),
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

impl ClientBodyError {
    /// The client body error `error` is or was caused by, if any: a hyper client reports the body it was streaming
    /// as a cause several layers down.
    pub fn find<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e Self> {
        let mut cause = Some(error);
        while let Some(error) = cause {
            if let Some(found) = error.downcast_ref::<Self>() {
                return Some(found);
            }
            cause = error.source();
        }
        None
    }

    /// Whether `error` (or an error it was caused by) is a body over `server.max_body_bytes`.
    pub fn too_large(error: &(dyn std::error::Error + 'static)) -> bool {
        matches!(Self::find(error), Some(Self::TooLarge))
    }

    /// Whether `error` (or an error it was caused by) is the client's body failing: a hyper client reports the body
    /// it was streaming as a cause several layers down.
    pub fn caused(error: &(dyn std::error::Error + 'static)) -> bool {
        let mut cause = Some(error);
        while let Some(error) = cause {
            if error.is::<Self>() {
                return true;
            }
            cause = error.source();
        }
        false
    }
}

/// Reads a request body that nobody will use (up to a bound in bytes and one in time):
/// `None` for a request without a body, else a future giving `Err` when the client's framing is malformed or the
/// body is cut short. Boxed and out of line: a body for a route that answers itself is rare, and its reading
/// future inlined into the request's would make that future larger, and so every request's moves of it longer.
#[inline(never)]
pub fn discard(body: Body) -> Option<Discarding> {
    if body.is_end_stream() {
        return None;
    }
    Some(Box::pin(async move {
        tokio::time::timeout(DISCARD_WITHIN, read_some(body))
            .await
            .unwrap_or(Ok(()))
    }))
}

async fn read_some(mut body: Body) -> Result<(), axum::Error> {
    let mut read = 0;
    while !body.is_end_stream() && read <= DISCARD_LIMIT {
        match body.frame().await {
            Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
            Some(Err(error)) => return Err(error),
            None => break,
        }
    }
    Ok(())
}
