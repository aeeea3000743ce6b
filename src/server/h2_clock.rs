//! An HTTP/2 connection's clocks, as HTTP/1.1 has them: `header_read_timeout` bounds its opening (preface, settings
//! and first request head) and each later header block; `keepalive_timeout` bounds the time it stays open with no
//! request in flight.
//!
//! hyper's HTTP/2 server has neither: a connection that sent one byte, the preface alone, or a HEADERS frame without
//! END_HEADERS is kept for as long as the client likes, and so is one that made a request and went quiet. The stream
//! handed to hyper follows the frames the client sends (their 9-byte headers; payloads are only counted) and fails its
//! pending read with `TimedOut` once the header deadline that applies has passed, which ends the connection. While a
//! header block is open HTTP/2 lets the client send nothing else on the connection (only its CONTINUATION frames), so
//! closing the connection costs no other stream anything it could still have had. An idle connection is closed
//! gracefully instead (GOAWAY), so that a client whose next request crosses the close knows it was not processed.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface every HTTP/2 connection opens with.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Frame types and the flag that matter here.
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;

/// A connection's stream under the header clock.
#[derive(Debug)]
pub(super) struct HeaderClock<S> {
    inner: S,
    frames: Frames,
    header_read_timeout: Duration,
    /// The sleep polled while a deadline applies and a read is pending; made at the first such wait.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// Where the client's bytes are in the frame sequence, and what it has sent so far.
#[derive(Debug)]
struct Frames {
    reading: Reading,
    /// When the connection was accepted: its opening is bounded from here.
    accepted: Instant,
    /// Whether a first header block has been read whole: the connection's opening is over.
    opened: bool,
    /// When the header block being read began (its HEADERS frame's header), while one is.
    block_since: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
enum Reading {
    /// This many bytes of the preface so far.
    Preface(usize),
    /// A frame header, this much of it so far.
    FrameHeader { bytes: [u8; 9], filled: usize },
    /// A frame's payload, this much of it left; whether its end completes a header block.
    Payload { left: usize, ends_block: bool },
    /// Not the preface after all: an HTTP/1.1 connection, under HTTP/1.1's own clocks.
    NotHttp2,
}

/// What a connection has in flight, shared by its requests and the future serving it.
#[derive(Debug)]
pub(super) struct Activity {
    /// The instant `idle_since` counts from, on tokio's clock as the sleeps are.
    base: tokio::time::Instant,
    /// Requests whose answer is not finished: from the service's call to the end (or drop) of the response body.
    in_flight: AtomicUsize,
    /// Microseconds from `base` to when `in_flight` last fell to zero, or the graceful close began.
    idle_since: AtomicU64,
}

/// One request in flight; dropped with its response body (or with the call, if that is given up).
#[derive(Debug)]
pub(super) struct InFlight(Arc<Activity>);

/// A response body holding its request's place in [`Activity`] until it ends or is dropped.
#[derive(Debug)]
pub(super) struct Tracked<B> {
    inner: B,
    _in_flight: InFlight,
}

/// A connection future closed gracefully (`close`, hyper's `graceful_shutdown`) once it has had no request in flight
/// for `keepalive_timeout`, and dropped if, closing, it stays so for another `keepalive_timeout`: HTTP/2's graceful
/// close waits for the client to answer a PING, which a client holding connections open need never do.
pub(super) struct IdleClosing<C> {
    connection: Pin<Box<C>>,
    close: fn(Pin<&mut C>),
    activity: Arc<Activity>,
    keepalive_timeout: Duration,
    sleep: Pin<Box<tokio::time::Sleep>>,
    closing: bool,
}

// === impl HeaderClock ===

impl<S> HeaderClock<S> {
    /// Watches `stream`, a connection accepted at `accepted` whose opening looked like HTTP/2's.
    pub(super) fn new(stream: S, accepted: Instant, header_read_timeout: Duration) -> Self {
        Self {
            inner: stream,
            frames: Frames {
                reading: Reading::Preface(0),
                accepted,
                opened: false,
                block_since: None,
            },
            header_read_timeout,
            sleep: None,
        }
    }

    /// Whether the deadline that applies now has passed, registering for a wake-up at it if not.
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(since) = self.frames.clock_since() else {
            return false;
        };
        let deadline = tokio::time::Instant::from_std(since + self.header_read_timeout);
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if sleep.deadline() != deadline {
            sleep.as_mut().reset(deadline);
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for HeaderClock<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                self.frames.read(&buf.filled()[before..]);
                Poll::Ready(Ok(()))
            }
            Poll::Pending if self.expired(cx) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "HTTP/2 opening or header block not finished within server.header_read_timeout",
            ))),
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for HeaderClock<S> {
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

// === impl Frames ===

impl Frames {
    /// Where the clock that applies now started: the accept until the opening is over, then the open header block's
    /// first frame; none between header blocks (the request bodies have their own clock) or for HTTP/1.1.
    fn clock_since(&self) -> Option<Instant> {
        match self.reading {
            Reading::NotHttp2 => None,
            _ if !self.opened => Some(self.accepted),
            _ => self.block_since,
        }
    }

    /// Follows `bytes`, the next the client sent.
    fn read(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            match &mut self.reading {
                Reading::NotHttp2 => return,
                Reading::Preface(matched) => {
                    let take = bytes.len().min(PREFACE.len() - *matched);
                    if bytes[..take] != PREFACE[*matched..*matched + take] {
                        self.reading = Reading::NotHttp2;
                        return;
                    }
                    *matched += take;
                    if *matched == PREFACE.len() {
                        self.reading = Reading::FrameHeader {
                            bytes: [0; 9],
                            filled: 0,
                        };
                    }
                    bytes = &bytes[take..];
                }
                Reading::FrameHeader {
                    bytes: header,
                    filled,
                } => {
                    let take = bytes.len().min(9 - *filled);
                    header[*filled..*filled + take].copy_from_slice(&bytes[..take]);
                    *filled += take;
                    bytes = &bytes[take..];
                    if *filled == 9 {
                        let header = *header;
                        self.frame(&header);
                    }
                }
                Reading::Payload { left, ends_block } => {
                    let take = bytes.len().min(*left);
                    *left -= take;
                    bytes = &bytes[take..];
                    if *left == 0 {
                        let ends_block = *ends_block;
                        self.payload_read(ends_block);
                    }
                }
            }
        }
    }

    /// A frame's header, read whole.
    fn frame(&mut self, header: &[u8; 9]) {
        let length =
            usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
        let (kind, flags) = (header[3], header[4]);
        if kind == HEADERS {
            self.block_since = Some(Instant::now());
        }
        let ends_block = (kind == HEADERS || kind == CONTINUATION) && flags & END_HEADERS != 0;
        self.reading = Reading::Payload {
            left: length,
            ends_block,
        };
        if length == 0 {
            self.payload_read(ends_block);
        }
    }

    /// A frame's payload, read whole.
    fn payload_read(&mut self, ends_block: bool) {
        if ends_block {
            self.opened = true;
            self.block_since = None;
        }
        self.reading = Reading::FrameHeader {
            bytes: [0; 9],
            filled: 0,
        };
    }
}

// === impl Activity ===

impl Activity {
    /// A connection's activity, idle from now.
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            base: tokio::time::Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
        })
    }

    /// A request begins.
    pub(super) fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }

    /// Counts the connection idle from now (if nothing is in flight).
    fn restart_idle(&self) {
        let now = u64::try_from(self.base.elapsed().as_micros()).unwrap_or(u64::MAX / 2);
        self.idle_since.fetch_max(now, Ordering::Release);
    }

    /// When the connection will have been idle for `keepalive_timeout`, if nothing is in flight now.
    fn idle_deadline(&self, keepalive_timeout: Duration) -> Option<tokio::time::Instant> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = Duration::from_micros(self.idle_since.load(Ordering::Acquire));
        Some(self.base + since + keepalive_timeout)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Written by every request's end, before its count falls: whoever sees the count at zero sees the time the
        // last request ended (or a moment later), never an older one.
        self.0.restart_idle();
        self.0.in_flight.fetch_sub(1, Ordering::Release);
    }
}

// === impl Tracked ===

impl<B> Tracked<B> {
    pub(super) fn new(inner: B, in_flight: InFlight) -> Self {
        Self {
            inner,
            _in_flight: in_flight,
        }
    }
}

impl<B: http_body::Body<Data = Bytes> + Unpin> http_body::Body for Tracked<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

// === impl IdleClosing ===

impl<C: Future> IdleClosing<C> {
    /// Serves `connection`, closing it with `close` after `keepalive_timeout` without a request in flight.
    pub(super) fn new(
        connection: C,
        close: fn(Pin<&mut C>),
        activity: Arc<Activity>,
        keepalive_timeout: Duration,
    ) -> Self {
        let first = tokio::time::Instant::now() + keepalive_timeout;
        Self {
            connection: Box::pin(connection),
            close,
            activity,
            keepalive_timeout,
            sleep: Box::pin(tokio::time::sleep_until(first)),
            closing: false,
        }
    }

    /// Asks the connection to finish what it serves and close (shutdown's drain, or idleness).
    pub(super) fn graceful_shutdown(mut self: Pin<&mut Self>) {
        if !self.closing {
            self.closing = true;
            (self.close)(self.connection.as_mut());
            // Idle from here: a close that has nothing to finish and does not end is cut a keepalive_timeout later.
            self.activity.restart_idle();
        }
    }

    /// Whether the connection has been idle for `keepalive_timeout`; if not, the sleep wakes the task when it may
    /// have been (or, while requests are in flight, a `keepalive_timeout` later, to look again).
    fn idle(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            match self.activity.idle_deadline(self.keepalive_timeout) {
                Some(deadline) => {
                    if deadline <= tokio::time::Instant::now() {
                        return true;
                    }
                    if self.sleep.deadline() != deadline {
                        self.sleep.as_mut().reset(deadline);
                    }
                }
                None if self.sleep.is_elapsed() => {
                    let later = tokio::time::Instant::now() + self.keepalive_timeout;
                    self.sleep.as_mut().reset(later);
                }
                None => {}
            }
            if self.sleep.as_mut().poll(cx).is_pending() {
                return false;
            }
        }
    }
}

impl<C, E> Future for IdleClosing<C>
where
    C: Future<Output = Result<(), E>>,
{
    type Output = Result<(), E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), E>> {
        if let Poll::Ready(output) = self.connection.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        if !self.idle(cx) {
            return Poll::Pending;
        }
        if self.closing {
            // Closing, and idle all along since: dropping the connection closes it.
            return Poll::Ready(Ok(()));
        }
        self.as_mut().graceful_shutdown();
        if let Poll::Ready(output) = self.connection.as_mut().poll(cx) {
            return Poll::Ready(output);
        }
        // Wakes the task at the cut's deadline.
        let _ = self.idle(cx);
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, payload: &[u8]) -> Vec<u8> {
        let length = payload.len();
        let mut bytes = vec![
            (length >> 16) as u8,
            (length >> 8) as u8,
            length as u8,
            kind,
            flags,
            0,
            0,
            0,
            1,
        ];
        bytes.extend_from_slice(payload);
        bytes
    }

    fn frames() -> Frames {
        Frames {
            reading: Reading::Preface(0),
            accepted: Instant::now(),
            opened: false,
            block_since: None,
        }
    }

    #[test]
    fn the_opening_is_timed_until_a_first_header_block_is_read_whole_however_the_bytes_come() {
        let mut stream = PREFACE.to_vec();
        stream.extend(frame(0x4, 0, &[0; 6]));
        stream.extend(frame(HEADERS, 0x1, &[0x82, 0x86]));
        stream.extend(frame(CONTINUATION, END_HEADERS, &[0x84]));
        let end = stream.len();
        stream.extend(frame(0x0, 0x1, b"body"));
        for step in [1, 2, 5, 9, 100] {
            let mut frames = frames();
            for (at, chunk) in stream.chunks(step).enumerate() {
                frames.read(chunk);
                let read = (at + 1) * step;
                if read < end {
                    assert_eq!(frames.clock_since(), Some(frames.accepted), "{step} {read}");
                }
            }
            assert_eq!(frames.clock_since(), None, "{step}");
        }
    }

    #[test]
    fn a_later_header_block_is_timed_from_its_headers_frame_until_end_headers() {
        let mut frames = frames();
        frames.read(PREFACE);
        frames.read(&frame(HEADERS, END_HEADERS, &[0x82]));
        assert_eq!(frames.clock_since(), None);
        frames.read(&frame(HEADERS, 0, &[0x82]));
        assert!(frames.clock_since().is_some());
        frames.read(&frame(CONTINUATION, 0, &[0x86]));
        assert!(frames.clock_since().is_some());
        frames.read(&frame(CONTINUATION, END_HEADERS, &[]));
        assert_eq!(frames.clock_since(), None);
        // A HEADERS frame with END_HEADERS whose payload has not all come is still being read.
        let whole = frame(HEADERS, END_HEADERS, &[0x82, 0x86, 0x84]);
        frames.read(&whole[..10]);
        assert!(frames.clock_since().is_some());
        frames.read(&whole[10..]);
        assert_eq!(frames.clock_since(), None);
    }

    /// Generated frames: HEADERS, CONTINUATION and other kinds, with or without END_HEADERS, short payloads.
    fn generated_frames() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        prop::collection::vec(
            (
                prop::sample::select(vec![0x0u8, HEADERS, 0x4, 0x6, 0x8, CONTINUATION]),
                prop::sample::select(vec![0u8, END_HEADERS, 0x1, 0x1 | END_HEADERS]),
                prop::collection::vec(any::<u8>(), 0..40),
            ),
            0..8,
        )
        .prop_map(|frames| {
            let mut bytes = PREFACE.to_vec();
            for (kind, flags, payload) in frames {
                bytes.extend(frame(kind, flags, &payload));
            }
            bytes
        })
    }

    proptest::proptest! {
        /// The clock's reading of a connection does not depend on how its bytes are split into reads.
        #[test]
        fn the_frames_read_alike_however_the_bytes_are_split(
            bytes in generated_frames(),
            cuts in proptest::collection::vec(1usize..64, 1..64),
        ) {
            let mut whole = frames();
            whole.read(&bytes);
            let mut split = frames();
            let (mut at, mut cut) = (0, cuts.iter().cycle());
            while at < bytes.len() {
                let end = (at + cut.next().copied().unwrap_or(1)).min(bytes.len());
                split.read(&bytes[at..end]);
                at = end;
            }
            proptest::prop_assert_eq!(whole.opened, split.opened);
            proptest::prop_assert_eq!(whole.block_since.is_some(), split.block_since.is_some());
        }

        /// Any bytes at all are followed without a panic.
        #[test]
        fn any_bytes_are_followed(tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let mut frames = frames();
            frames.read(PREFACE);
            frames.read(&tail);
            let _ = frames.clock_since();
        }
    }

    #[test]
    fn an_opening_that_is_not_the_preface_is_left_to_http1() {
        let mut frames = frames();
        frames.read(b"PRI * HTTP/1.1\r\n");
        assert_eq!(frames.clock_since(), None);
    }

    /// A connection that never ends by itself; `close` marks it closing.
    struct Endless {
        closed: Arc<AtomicUsize>,
    }

    impl Future for Endless {
        type Output = Result<(), ()>;

        fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<(), ()>> {
            Poll::Pending
        }
    }

    fn close(connection: Pin<&mut Endless>) {
        connection.closed.fetch_add(1, Ordering::SeqCst);
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_connection_is_closed_after_keepalive_and_cut_if_it_stays_but_not_while_a_request_is_in_flight(
    ) {
        let closed = Arc::new(AtomicUsize::new(0));
        let activity = Activity::new();
        let request = activity.begin();
        let connection = IdleClosing::new(
            Endless {
                closed: closed.clone(),
            },
            close,
            activity.clone(),
            Duration::from_secs(10),
        );
        let served = tokio::spawn(connection);
        // A request in flight for three keepalive periods: nothing happens.
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(closed.load(Ordering::SeqCst), 0);
        assert!(!served.is_finished());
        // Its answer ends; 10 s later the close is asked for, once.
        drop(request);
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert_eq!(closed.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(closed.load(Ordering::SeqCst), 1);
        assert!(!served.is_finished());
        // Still open, idle, 10 s later: cut.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(served.is_finished());
        assert_eq!(served.await.expect("served"), Ok(()));
        assert_eq!(closed.load(Ordering::SeqCst), 1);
    }
}
