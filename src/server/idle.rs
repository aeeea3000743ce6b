//! An HTTP/1.1 connection's two clocks between requests: `keepalive_timeout` while it is idle, then
//! `header_read_timeout` from the first byte of the next request head; when an idle connection rests (its hyper
//! connection is put aside, see `http1.rs`); and the JSON bodies of the refusals hyper writes itself while reading a
//! head.
//!
//! hyper has one clock for both: its header read timer starts as soon as it waits for a head, so an idle
//! keep-alive connection is closed after `header_read_timeout`. Load balancers keep idle connections to their
//! backends for 60 seconds or more and race that close, which their clients see as 502s. hyper asks its `Timer`
//! for that one sleep each time it starts waiting for a head; the sleep given here looks at the connection's
//! reads to tell which deadline applies.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// How long a connection waits for its next request with hyper's connection (and its 16 KB of buffers) before it
/// rests with the socket alone. Back-to-back requests come sooner and pay nothing for resting; a connection that
/// rests pays for a new hyper connection (a few allocations) when its next request comes.
pub(super) const REST_AFTER: Duration = Duration::from_secs(1);

/// The clock of one HTTP/1.1 connection, handed to hyper as its `Timer`.
#[derive(Debug, Clone)]
pub(super) struct ConnectionClock {
    marks: Arc<Marks>,
}

/// The connection's stream, marking when the bytes of a head start to arrive, writing the gateway's JSON
/// refusal in place of hyper's empty one, and reading first the bytes a hyper connection put aside had read.
#[derive(Debug)]
pub(super) struct MarkedStream<S> {
    inner: S,
    marks: Arc<Marks>,
    /// A refusal being written instead of hyper's, and how much of it is written.
    replacing: Option<(&'static [u8], usize)>,
    /// Bytes read by the hyper connection put aside and not parsed by it (the start of a pipelined request).
    rewound: Bytes,
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
    /// Sleeps handed to hyper and not dropped yet: hyper drops its sleep once it has parsed a head, so while one
    /// lives, hyper is reading a head and whatever it writes is its own refusal of one.
    reading_head: AtomicUsize,
    /// Set when the connection has waited `REST_AFTER` for a head without a byte of it: time to rest.
    rest_due: AtomicBool,
    /// Set while hyper's connection is closed to be put aside: its shutdown of the stream is not done.
    setting_aside: AtomicBool,
    /// The two timeouts and `REST_AFTER`, in microseconds: the deadlines are worked out in whole microseconds from
    /// `base` and made an `Instant` once, as they are every request.
    keepalive_micros: u64,
    header_read_micros: u64,
    /// `header_read_timeout` as given, which hyper's deadlines are that long after the start of a wait.
    header_read_timeout: Duration,
    rest_micros: u64,
    /// The sleep of the last wait for a head, handed back when hyper dropped it (its head came): the next wait
    /// moves it to its deadline instead of making, registering and dropping a timer of its own per request.
    spare: parking_lot::Mutex<Option<Pin<Box<tokio::time::Sleep>>>>,
}

/// The sleep hyper polls while it waits for a head: it ends at the deadline that applies now.
struct HeadDeadline {
    marks: Arc<Marks>,
    /// Always there until it is dropped, and then handed back as the connection's spare.
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether `sleep` was set for the time to rest (as `Marks::next_wake` said when it was made).
    rest: bool,
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
            reading_head: AtomicUsize::new(0),
            rest_due: AtomicBool::new(false),
            setting_aside: AtomicBool::new(false),
            keepalive_micros: micros(keepalive_timeout),
            header_read_micros: micros(header_read_timeout),
            header_read_timeout,
            rest_micros: micros(REST_AFTER),
            spare: parking_lot::Mutex::new(None),
        });
        (
            Self {
                marks: marks.clone(),
            },
            MarkedStream {
                inner: stream,
                marks,
                replacing: None,
                rewound: Bytes::new(),
            },
        )
    }

    /// Whether the connection has waited `REST_AFTER` for a head with nothing of it come: hyper is between
    /// requests, and its connection can be put aside.
    pub(super) fn rest_due(&self) -> bool {
        self.marks.rest_due.load(Ordering::Relaxed)
    }

    /// Whether hyper's connection is being closed to be put aside.
    pub(super) fn setting_aside(&self) -> bool {
        self.marks.setting_aside.load(Ordering::Relaxed)
    }

    /// Starts (or ends) putting hyper's connection aside: until it ends, the stream ignores hyper's shutdown.
    pub(super) fn set_aside(&self, setting_aside: bool) {
        self.marks
            .setting_aside
            .store(setting_aside, Ordering::Relaxed);
    }

    /// When a resting connection closes: `keepalive_timeout` after it began to wait for a head.
    pub(super) fn rest_deadline(&self) -> Instant {
        self.marks.deadline()
    }

    /// Drops the spare sleep: a resting connection holds no timer.
    pub(super) fn drop_spare(&self) {
        self.marks.spare.lock().take();
    }

    /// A hyper connection takes over a head the connection read directly: its wait for the head starts now.
    pub(super) fn hand_over(&self) {
        self.marks.start_waiting(Instant::now());
    }

    /// The sleep of a wait for a request head that began at `now`.
    fn wait_for_head(&self, now: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.marks.start_waiting(now);
        self.marks.reading_head.fetch_add(1, Ordering::Relaxed);
        // Made to wake when its first poll will want it to: a reset there would cost every request.
        let (wake, rest) = self.marks.next_wake();
        let wake = tokio::time::Instant::from_std(wake);
        // The spare's deadline was the last wait's, earlier than this one: moving it later costs tokio a store.
        let sleep = match self.marks.spare.lock().take() {
            Some(mut sleep) => {
                sleep.as_mut().reset(wake);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(wake)),
        };
        Box::pin(HeadDeadline {
            marks: self.marks.clone(),
            sleep: Some(sleep),
            rest,
        })
    }
}

impl hyper::rt::Timer for ConnectionClock {
    fn sleep(&self, _duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.wait_for_head(Instant::now())
    }

    /// Called when hyper starts waiting for a request head, with its deadline `header_read_timeout` after the
    /// instant it read for it (`Timer::now`): the wait began then, and the clock is not read a second time. The
    /// deadline is replaced by the two clocks', and the time to rest comes first.
    fn sleep_until(&self, deadline: Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        let began = deadline
            .checked_sub(self.marks.header_read_timeout)
            .unwrap_or_else(Instant::now);
        self.wait_for_head(began)
    }
}

// === impl Marks ===

impl Marks {
    fn micros_since_base(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.base).as_micros()).unwrap_or(u64::MAX - 1)
    }

    /// A wait for a head begins at `now`.
    fn start_waiting(&self, now: Instant) {
        self.waiting_since
            .store(self.micros_since_base(now), Ordering::Relaxed);
        self.head_since.store(0, Ordering::Relaxed);
        self.rest_due.store(false, Ordering::Relaxed);
    }

    /// A read of `read` bytes: the first since the wait began starts the head's clock. (Bytes of a pipelined head
    /// read with the previous request's body count from the next byte that comes.)
    fn on_read(&self, read: usize) {
        if read > 0 && self.head_since.load(Ordering::Relaxed) == 0 {
            let now = self.micros_since_base(Instant::now());
            self.head_since.store(now + 1, Ordering::Relaxed);
            self.rest_due.store(false, Ordering::Relaxed);
        }
    }

    /// When hyper's sleep should wake next, and whether that is the time to rest rather than a deadline: the rest
    /// comes first while nothing of a head has come and the connection is not resting already.
    fn next_wake(&self) -> (Instant, bool) {
        let deadline = self.deadline_micros();
        if self.head_since.load(Ordering::Relaxed) != 0 || self.rest_due.load(Ordering::Relaxed) {
            return (self.instant(deadline), false);
        }
        let rest = self
            .waiting_since
            .load(Ordering::Relaxed)
            .saturating_add(self.rest_micros);
        if rest < deadline {
            (self.instant(rest), true)
        } else {
            (self.instant(deadline), false)
        }
    }

    /// `header_read_timeout` after a head's first byte, `keepalive_timeout` after the wait began without one.
    fn deadline(&self) -> Instant {
        self.instant(self.deadline_micros())
    }

    /// [`deadline`](Self::deadline) in microseconds from `base`.
    fn deadline_micros(&self) -> u64 {
        match self.head_since.load(Ordering::Relaxed) {
            0 => self
                .waiting_since
                .load(Ordering::Relaxed)
                .saturating_add(self.keepalive_micros),
            since => (since - 1).saturating_add(self.header_read_micros),
        }
    }

    /// The instant `micros` microseconds after `base` (far in the future when that overflows).
    fn instant(&self, micros: u64) -> Instant {
        self.base
            .checked_add(Duration::from_micros(micros))
            .unwrap_or_else(|| self.base + Duration::from_secs(86_400 * 365))
    }
}

/// `duration` in whole microseconds, saturating.
fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

// === impl HeadDeadline ===

impl Future for HeadDeadline {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let Some(sleep) = this.sleep.as_mut() else {
            return Poll::Ready(());
        };
        // Polled by hyper after every read that left the head incomplete: the deadline moves when its first byte
        // has come since the sleep was made (until then the sleep is what `next_wake` said when it was made).
        let unchanged = this.marks.head_since.load(Ordering::Relaxed) == 0
            && !this.marks.rest_due.load(Ordering::Relaxed);
        let rest = if unchanged {
            this.rest
        } else {
            let (wake, rest) = this.marks.next_wake();
            let wake = tokio::time::Instant::from_std(wake);
            if sleep.deadline() != wake {
                sleep.as_mut().reset(wake);
            }
            this.rest = rest;
            rest
        };
        ready!(sleep.as_mut().poll(cx));
        if !rest {
            return Poll::Ready(());
        }
        // Time to rest: the connection's future sees it once hyper is pending, and puts hyper's connection aside.
        // Until it does, the sleep waits for the deadline.
        this.marks.rest_due.store(true, Ordering::Relaxed);
        let deadline = tokio::time::Instant::from_std(this.marks.deadline());
        sleep.as_mut().reset(deadline);
        sleep.as_mut().poll(cx)
    }
}

impl hyper::rt::Sleep for HeadDeadline {}

impl Drop for HeadDeadline {
    fn drop(&mut self) {
        self.marks.reading_head.fetch_sub(1, Ordering::Relaxed);
        // Kept for the connection's next wait (hyper drops its sleep once a head has come).
        if let Some(sleep) = self.sleep.take() {
            *self.marks.spare.lock() = Some(sleep);
        }
    }
}

// === refusals ===

/// hyper's own answers to a head it cannot take (`HTTP/1.1 400 Bad Request` or `431 Request Header Fields Too
/// Large`, a head alone with an empty body), and the gateway's answers in their place, with the JSON bodies its
/// other refusals have. hyper writes them before any service sees a request: conflicting `Content-Length`s or
/// another malformed field or request line (400), a head still incomplete when the read buffer is full or with
/// more fields than it parses (431).
fn refusal_for(written: &[u8]) -> Option<&'static [u8]> {
    const BAD_REQUEST: &[u8] = b"HTTP/1.1 400 Bad Request\r\n";
    const TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\n";
    // A head alone, as hyper writes it: short, with `content-length: 0` and nothing after its blank line.
    let head_alone = written.len() < 512
        && written.ends_with(b"\r\n\r\n")
        && written
            .windows(b"content-length: 0\r\n".len())
            .any(|line| line.eq_ignore_ascii_case(b"content-length: 0\r\n"));
    if !head_alone {
        return None;
    }
    if written.starts_with(BAD_REQUEST) {
        Some(concat!(
            "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 115\r\n",
            "connection: close\r\n\r\n",
            r#"{"error":"bad_request","message":"the request head is malformed: conflicting lengths, a bad field or request line"}"#,
        ).as_bytes())
    } else if written.starts_with(TOO_LARGE) {
        Some(concat!(
            "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n",
            "content-length: 96\r\nconnection: close\r\n\r\n",
            r#"{"error":"header_too_large","message":"the request head is larger than server.max_header_bytes"}"#,
        ).as_bytes())
    } else {
        None
    }
}

// === impl MarkedStream ===

impl<S> MarkedStream<S> {
    /// The stream itself.
    pub(super) fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Has `bytes` read again first: what a hyper connection put aside had read and not parsed.
    pub(super) fn rewind(&mut self, bytes: Bytes) {
        self.rewound = bytes;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for MarkedStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        if !self.rewound.is_empty() {
            let take = self.rewound.len().min(buf.remaining());
            buf.put_slice(&self.rewound[..take]);
            self.rewound.advance(take);
            self.marks.on_read(take);
            return Poll::Ready(Ok(()));
        }
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            self.marks.on_read(buf.filled().len() - before);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> MarkedStream<S> {
    /// Writes the refusal in place of `written` (hyper's, whole in one write), then says `written` is written.
    fn poll_replace(&mut self, cx: &mut Context<'_>, written: usize) -> Poll<io::Result<usize>> {
        while let Some((refusal, done)) = self.replacing {
            if done == refusal.len() {
                self.replacing = None;
                return Poll::Ready(Ok(written));
            }
            match Pin::new(&mut self.inner).poll_write(cx, &refusal[done..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(more)) => self.replacing = Some((refusal, done + more)),
                Poll::Ready(Err(error)) => return Poll::Ready(Err(error)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(written))
    }

    /// Whether `buf` is hyper's refusal of a head: starts replacing it if so.
    fn replaces(&mut self, buf: &[u8]) -> bool {
        if self.replacing.is_some() {
            return true;
        }
        if self.marks.reading_head.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let Some(refusal) = refusal_for(buf) else {
            return false;
        };
        self.replacing = Some((refusal, 0));
        true
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for MarkedStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.replaces(buf) {
            return self.poll_replace(cx, buf.len());
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper's refusal is a head alone: one slice.
        if let [only] = bufs {
            if self.replaces(only) {
                return self.poll_replace(cx, only.len());
            }
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // hyper shuts the stream down as its connection ends; one put aside ends, the stream goes on.
        if self.marks.setting_aside.load(Ordering::Relaxed) {
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_rests_only_while_nothing_of_a_head_has_come_and_a_hand_over_starts_a_new_wait()
    {
        let keepalive = Duration::from_secs(75);
        let (clock, _stream) = ConnectionClock::new((), keepalive, Duration::from_secs(10));
        let marks = &clock.marks;
        marks.start_waiting(Instant::now());
        let waiting = marks.deadline() - keepalive;
        assert_eq!(marks.next_wake(), (waiting + REST_AFTER, true));
        // The rest came: the sleep waits for keepalive_timeout, and the connection's rest closes then.
        marks.rest_due.store(true, Ordering::Relaxed);
        assert_eq!(marks.next_wake(), (waiting + keepalive, false));
        assert_eq!(clock.rest_deadline(), waiting + keepalive);

        // A hyper connection takes over a head read directly: its wait starts then, not at the last answer.
        std::thread::sleep(Duration::from_millis(5));
        clock.hand_over();
        assert!(!clock.rest_due());
        let (wake, rest) = marks.next_wake();
        assert!(rest);
        assert!(
            wake >= waiting + REST_AFTER + Duration::from_millis(5),
            "{wake:?}"
        );
        // Its first byte: header_read_timeout from then, and no rest while the head comes.
        marks.rest_due.store(true, Ordering::Relaxed);
        marks.on_read(1);
        assert!(!clock.rest_due());
        let (wake, rest) = marks.next_wake();
        assert!(!rest);
        assert!(wake < waiting + Duration::from_secs(11), "{wake:?}");

        // A keepalive_timeout shorter than REST_AFTER closes the connection before it would rest.
        let (short, _stream) =
            ConnectionClock::new((), Duration::from_millis(500), Duration::from_secs(10));
        short.marks.start_waiting(Instant::now());
        assert!(!short.marks.next_wake().1);
    }

    #[tokio::test]
    async fn a_wait_for_a_head_begins_when_hyper_read_the_clock_for_its_deadline() {
        use hyper::rt::Timer;
        let (keepalive, header_read) = (Duration::from_secs(75), Duration::from_secs(10));
        let (clock, _stream) = ConnectionClock::new((), keepalive, header_read);
        // hyper's reading, later than any the clock would make itself here.
        let hyper_now = Instant::now() + Duration::from_secs(3);
        let _sleep = clock.sleep_until(hyper_now + header_read);
        let closes = clock.rest_deadline();
        // Kept in whole microseconds.
        assert!(closes <= hyper_now + keepalive, "{closes:?}");
        assert!(
            closes + Duration::from_micros(1) > hyper_now + keepalive,
            "{closes:?}"
        );
    }

    #[test]
    fn refusals_replace_hyper_s_empty_answers_with_their_json_bodies() {
        for (hyper, status, error) in [
            (
                &b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x\r\n\r\n"[..],
                "400",
                "bad_request",
            ),
            (
                b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n",
                "431",
                "header_too_large",
            ),
        ] {
            let refusal = std::str::from_utf8(refusal_for(hyper).expect("replaced")).expect("text");
            let (head, body) = refusal.split_once("\r\n\r\n").expect("head and body");
            assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
            assert!(
                head.contains(&format!("content-length: {}\r\n", body.len())),
                "{refusal}"
            );
            let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
            assert_eq!(json["error"], error);
        }
        // Anything with a body, or another status, is not hyper's refusal.
        assert_eq!(
            refusal_for(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}"),
            None
        );
        assert_eq!(
            refusal_for(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"),
            None
        );
    }
}
