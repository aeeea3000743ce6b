//! The response body that holds its connection and hands it back to the pool when the response ends.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;

use super::connect::Connection;
use super::idle::Shared;

/// A response body that hands its connection back to the pool once read to the end.
pub(super) struct PooledBody {
    pub(super) body: Incoming,
    pub(super) lease: Option<Lease>,
}

pub(super) struct Lease {
    pub(super) connection: Connection,
    pub(super) pool: Arc<Shared>,
}

// === impl PooledBody ===

impl PooledBody {
    fn release(&mut self) {
        if let Some(Lease { connection, pool }) = self.lease.take() {
            pool.checkin(connection);
        }
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.release(),
            // A broken exchange leaves the connection in an unknown state: it is not reused.
            Poll::Ready(Some(Err(_))) => self.lease = None,
            _ => {}
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

impl Drop for PooledBody {
    fn drop(&mut self) {
        // The server stops polling a body that says it has ended (and never polls one for HEAD or 204), so the
        // end is also recognised here. A body dropped half read takes its connection with it.
        if self.body.is_end_stream() {
            self.release();
        }
    }
}
