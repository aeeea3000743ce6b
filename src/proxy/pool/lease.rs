//! The response body that holds its connection, hands it back to the pool when the response ends, and ends the
//! answer when the target goes silent for longer than its read timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use thiserror::Error;
use tokio::time::Sleep;

use super::connect::Connection;
use super::idle::Shared;
use crate::proxy::health::Failure;

/// A response body that hands its connection back to the pool once read to the end, and fails once its target
/// stays silent for `read_timeout`.
pub(super) struct PooledBody {
    pub(super) body: Incoming,
    pub(super) lease: Option<Lease>,
    pub(super) read_timeout: Duration,
    /// Made the first time the body waits for its target: a body whose bytes are there when asked for never makes
    /// one. Boxed: most answers never need it, and their bodies should not carry its room.
    pub(super) silence: Option<Pin<Box<Sleep>>>,
    /// Whether `silence` times the current wait.
    pub(super) waiting: bool,
}

/// Why an answer's body broke.
#[derive(Debug, Error)]
pub enum AnswerError {
    /// The target's connection failed mid-answer.
    #[error(transparent)]
    Upstream(#[from] hyper::Error),
    /// The target sent nothing for this long (`idle_timeout`): the answer is cut.
    #[error("the upstream sent nothing for {0:?} (idle_timeout): answer cut")]
    Idle(Duration),
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

    /// The target has nothing for the body now: waits, and fails the answer once the wait exceeds `read_timeout`.
    /// The clock starts at the first poll that finds nothing, not at the last byte: the difference is the time the
    /// client took to ask for more, which a slow client must not be cut for.
    fn wait(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, AnswerError>>> {
        if !self.waiting {
            self.waiting = true;
            let deadline = tokio::time::Instant::now() + self.read_timeout;
            match &mut self.silence {
                Some(silence) => silence.as_mut().reset(deadline),
                None => self.silence = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        let Some(silence) = &mut self.silence else {
            return Poll::Pending;
        };
        if silence.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        if let Some(lease) = self.lease.take() {
            // The connection goes with the lease: a half-read answer leaves it unusable.
            lease.pool.health.failed(Failure::Idle, Instant::now());
        }
        Poll::Ready(Some(Err(AnswerError::Idle(self.read_timeout))))
    }
}

impl http_body::Body for PooledBody {
    type Data = Bytes;
    type Error = AnswerError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, AnswerError>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.release(),
            // A broken exchange leaves the connection in an unknown state: it is not reused.
            Poll::Ready(Some(Err(_))) => self.lease = None,
            Poll::Ready(Some(Ok(_))) => {}
            Poll::Pending => return self.wait(cx),
        }
        // Something came: the next silence is timed from the next wait (a timer left running may wake the task
        // once for nothing).
        self.waiting = false;
        polled.map(|frame| frame.map(|frame| frame.map_err(AnswerError::from)))
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
