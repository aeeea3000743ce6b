//! The response body that reads its answer from its connection, hands the connection back to the pool when the
//! answer ends, and ends the answer when the target goes silent for longer than its read timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use thiserror::Error;
use tokio::time::Sleep;

use super::connect::Connection;
use super::idle::Shared;
use super::wire::{Decoder, Step, WireError};
use crate::proxy::health::Failure;

/// A response body that reads its answer from its connection, hands the connection back to the pool once read to
/// the end, and fails once its target stays silent for `read_timeout`.
pub(super) struct PooledBody {
    pub(super) decoder: Decoder,
    /// The connection, until the answer ends or breaks.
    pub(super) lease: Option<Lease>,
    /// Whether the connection may carry another request after this answer (the target keeps it open, and the
    /// whole request was written).
    pub(super) reusable: bool,
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
    /// The target's connection failed mid-answer, or framed the body wrongly.
    #[error(transparent)]
    Upstream(#[from] WireError),
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
    /// The answer has ended: its connection goes back to the pool if it can carry another request (nothing of the
    /// target's left unread), else it closes.
    fn release(&mut self) {
        if let Some(Lease { connection, pool }) = self.lease.take() {
            if self.reusable && connection.buffer.is_empty() {
                pool.checkin(connection);
            }
        }
    }

    /// The answer broke: its connection, in an unknown state, closes.
    fn broken(&mut self, error: WireError) -> Poll<Option<Result<Frame<Bytes>, AnswerError>>> {
        self.lease = None;
        Poll::Ready(Some(Err(AnswerError::Upstream(error))))
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
        let this = &mut *self;
        loop {
            // No lease: the answer ended (or broke, and said so).
            let Some(lease) = &mut this.lease else {
                return Poll::Ready(None);
            };
            let frame = match this.decoder.decode(&mut lease.connection.buffer) {
                Ok(Step::Data(data)) => Frame::data(data),
                Ok(Step::Trailers(trailers)) => Frame::trailers(trailers),
                Ok(Step::End) => {
                    this.release();
                    return Poll::Ready(None);
                }
                Ok(Step::More) => match lease.connection.poll_fill(cx) {
                    Poll::Ready(Ok(0)) => match this.decoder.closed() {
                        // Read until the close: the end, and the connection goes (`reusable` is false).
                        Ok(_) => {
                            this.release();
                            return Poll::Ready(None);
                        }
                        Err(error) => return this.broken(error),
                    },
                    Poll::Ready(Ok(_)) => continue,
                    Poll::Ready(Err(error)) => return this.broken(WireError::Io(error)),
                    Poll::Pending => return this.wait(cx),
                },
                Err(error) => return this.broken(error),
            };
            // Something came: the next silence is timed from the next wait (a timer left running may wake the task
            // once for nothing). The last frame hands the connection back at once.
            this.waiting = false;
            if this.decoder.is_done() {
                this.release();
            }
            return Poll::Ready(Some(Ok(frame)));
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(left) => SizeHint::with_exact(left),
            None => SizeHint::default(),
        }
    }
}

impl Drop for PooledBody {
    fn drop(&mut self) {
        // The server stops polling a body that says it has ended (and never polls one for HEAD or 204), so the
        // end is also recognised here. A body dropped half read takes its connection with it.
        if self.decoder.is_done() {
            self.release();
        }
    }
}
