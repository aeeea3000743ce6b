//! An HTTP/1.1 connection's two clocks between requests: `keepalive_timeout` while it is idle, then
//! `header_read_timeout` from the first byte of the next request head.
//!
//! hyper has one clock for both: its header read timer starts as soon as it waits for a head, so an idle
//! keep-alive connection is closed after `header_read_timeout`. Load balancers keep idle connections to their
//! backends for 60 seconds or more and race that close, which their clients see as 502s. hyper asks its `Timer`
//! for that one sleep each time it starts waiting for a head; the sleep given here looks at the connection's
//! reads to tell which deadline applies.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The clock of one HTTP/1.1 connection, handed to hyper as its `Timer`.
#[derive(Debug, Clone)]
pub(super) struct ConnectionClock {
    marks: Arc<Marks>,
}

/// The connection's stream, marking when the bytes of a head start to arrive.
#[derive(Debug)]
pub(super) struct MarkedStream<S> {
    inner: S,
    marks: Arc<Marks>,
}

/// When the connection started waiting for a head, and when that head's first byte came.
#[derive(Debug)]
struct Marks {
    /// The instant the offsets below count from.
    base: Instant,
    /// Microseconds from `base` to the start of the current wait for a head.
    waiting_since: AtomicU64,
    /// Microseconds from `base` to the first byte read since then, plus one; 0 while none came.
    head_since: AtomicU64,
    keepalive_timeout: Duration,
    header_read_timeout: Duration,
}

/// The sleep hyper polls while it waits for a head: it ends at the deadline that applies now.
struct HeadDeadline {
    marks: Arc<Marks>,
    sleep: Pin<Box<tokio::time::Sleep>>,
}

// === impl ConnectionClock ===

impl ConnectionClock {
    /// A clock for a new connection and the stream it watches.
    pub(super) fn new<S>(
        stream: S,
        keepalive_timeout: Duration,
        header_read_timeout: Duration,
    ) -> (Self, MarkedStream<S>) {
        let marks = Arc::new(Marks {
            base: Instant::now(),
            waiting_since: AtomicU64::new(0),
            head_since: AtomicU64::new(0),
            keepalive_timeout,
            header_read_timeout,
        });
        (
            Self {
                marks: marks.clone(),
            },
            MarkedStream {
                inner: stream,
                marks,
            },
        )
    }
}

impl hyper::rt::Timer for ConnectionClock {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until(Instant::now() + duration)
    }

    /// Called when hyper starts waiting for a request head (its deadline, `header_read_timeout` from now, is
    /// replaced by the two clocks').
    fn sleep_until(&self, _deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.marks.start_waiting();
        let deadline = self.marks.deadline();
        Box::pin(HeadDeadline {
            marks: self.marks.clone(),
            sleep: Box::pin(tokio::time::sleep_until(deadline.into())),
        })
    }
}

// === impl Marks ===

impl Marks {
    fn micros_since_base(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX - 1)
    }

    fn start_waiting(&self) {
        self.waiting_since
            .store(self.micros_since_base(Instant::now()), Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
    }

    /// A read of `read` bytes: the first since the wait began starts the head's clock. (Bytes of a pipelined head
    /// read with the previous request's body count from the next byte that comes.)
    fn on_read(&self, read: usize) {
        if read > 0 && self.head_since.load(Ordering::Relaxed) == 0 {
            let now = self.micros_since_base(Instant::now());
            self.head_since.store(now + 1, Ordering::Relaxed);
        }
    }

    /// `header_read_timeout` after a head's first byte, `keepalive_timeout` after the wait began without one.
    fn deadline(&self) -> Instant {
        match self.head_since.load(Ordering::Relaxed) {
            0 => {
                self.base
                    + Duration::from_micros(self.waiting_since.load(Ordering::Relaxed))
                    + self.keepalive_timeout
            }
            since => self.base + Duration::from_micros(since - 1) + self.header_read_timeout,
        }
    }
}

// === impl HeadDeadline ===

impl Future for HeadDeadline {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        // Polled by hyper after every read that left the head incomplete: the deadline moves when its first byte
        // has come since the last poll.
        let deadline = tokio::time::Instant::from_std(self.marks.deadline());
        if self.sleep.deadline() != deadline {
            self.sleep.as_mut().reset(deadline);
        }
        self.sleep.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for HeadDeadline {}

// === impl MarkedStream ===

impl<S: AsyncRead + Unpin> AsyncRead for MarkedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.marks.on_read(buf.filled().len() - before);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for MarkedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
