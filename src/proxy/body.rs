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

/// The body of a request as the gateway received it. Wrapping costs nothing per request: the server boxes the body
/// into an axum `Body` once either way, and only an error is changed.
#[derive(Debug)]
pub struct ClientBody(Incoming);

/// The reading of a body that nobody will use (see [`discard`]).
pub type Discarding = Pin<Box<dyn Future<Output = Result<(), axum::Error>> + Send>>;

/// The client's body could not be read: bad chunk size, fewer bytes than its `Content-Length`, connection closed
/// or reset mid-body.
#[derive(Debug, Error)]
#[error("the client's request body: {0}")]
pub struct ClientBodyError(#[source] hyper::Error);

/// How much of a body a `respond` route reads before answering, and for how long, so that malformed framing is 400
/// there too. Past either the rest is left unread and the server closes the connection after the answer, as it does
/// for any body left unread: a slow or endless body delays the answer, never holds it.
const DISCARD_LIMIT: usize = 1 << 20;
const DISCARD_WITHIN: Duration = Duration::from_secs(5);

// === impl ClientBody ===

impl ClientBody {
    /// The body of a request served from `incoming`.
    pub fn new(incoming: Incoming) -> Self {
        Self(incoming)
    }
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = ClientBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ClientBodyError>>> {
        Pin::new(&mut self.0)
            .poll_frame(cx)
            .map_err(ClientBodyError)
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.0.size_hint()
    }
}

// === impl ClientBodyError ===

impl ClientBodyError {
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

/// Reads a request body that nobody will use (at most [`DISCARD_LIMIT`] bytes, for at most [`DISCARD_WITHIN`]):
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
