//! Keep-alive HTTP/1.1 connections (over TLS for `https`) to one upstream target: newest idle first, returned when
//! the response ends.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use http::{Method, Request, Response, Uri};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::rt::{Read, Write};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tower::ServiceExt;

use super::body::ClientBodyError;
use super::tls::TlsDialer;

/// The connections to one target.
///
/// One pool per target, built with the upstream, so finding a request's pool is an index, not a lookup: a general
/// client keyed by origin hashes the authority several times per request and spawns a task per response to notice
/// when the connection is free again. Here the response body gives the connection back itself when it ends.
#[derive(Debug)]
pub struct ConnectionPool {
    shared: Arc<Shared>,
}

/// A connection idle at least this long may have reached the target's idle timeout: a request sent on it is ready
/// to be sent again (targets close idle connections after seconds, not milliseconds).
const SUSPECT_IDLE: Duration = Duration::from_millis(100);

/// How many idle connections a pool keeps, and for how long.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// Idle connections kept; beyond it the longest idle is closed.
    pub max_idle: usize,
    /// An idle connection is closed after this long unused.
    pub idle_timeout: Duration,
}

/// Why a request got no response head.
#[derive(Debug, Error)]
pub enum SendError {
    /// No TCP connection to the target.
    #[error("cannot connect: {0}")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The TLS handshake with an `https` target failed (untrusted certificate, wrong name...) or took longer than
    /// the connect timeout.
    #[error("TLS handshake failed: {0}")]
    Tls(#[source] std::io::Error),
    /// The HTTP exchange failed (handshake, write, or a connection closed before the response head).
    #[error(transparent)]
    Http(hyper::Error),
    /// The client's request body failed while it was being sent (malformed framing, cut short): the client's
    /// fault, not the target's.
    #[error("request body: {0}")]
    ClientBody(#[source] hyper::Error),
}

#[derive(Debug)]
struct Shared {
    /// `http[s]://host:port` of the target, what the connector dials.
    address: Uri,
    connector: HttpConnector,
    /// For `https` targets: the handshake after the TCP connection, bounded by `connect_timeout`.
    tls: Option<TlsDialer>,
    connect_timeout: Duration,
    settings: PoolSettings,
    /// Idle connections, the most recently used at the back.
    idle: Mutex<VecDeque<IdleConnection>>,
    reaper_started: AtomicBool,
    /// A reused connection has closed under a request: the target closes connections without saying so, and
    /// every request on a reused connection is ready to be sent again.
    closes_unannounced: AtomicBool,
}

#[derive(Debug)]
struct IdleConnection {
    connection: Connection,
    since: Instant,
}

/// A pooled connection: its request sender and the count of bytes it has read from the target, which tells a
/// request that failed before any byte of an answer from one that failed mid-response.
#[derive(Debug)]
struct Connection {
    sender: SendRequest<Body>,
    read: Arc<AtomicU64>,
    /// Responses it has carried to their end.
    served: u32,
}

/// A connection's transport, counting the bytes read (written only by the connection's task).
#[derive(Debug)]
struct CountingIo<T> {
    io: T,
    read: Arc<AtomicU64>,
}

/// A response body that hands its connection back to the pool once read to the end.
struct PooledBody {
    body: Incoming,
    lease: Option<Lease>,
}

struct Lease {
    connection: Connection,
    pool: Arc<Shared>,
}

// === impl ConnectionPool ===

impl ConnectionPool {
    /// A pool for the target at `address` (`http[s]://host:port`), dialled with `connector` and, for `https`,
    /// `tls`. `connect_timeout` bounds the TLS handshake (the connector bounds the TCP connection itself).
    pub(crate) fn new(
        address: Uri,
        connector: HttpConnector,
        tls: Option<TlsDialer>,
        connect_timeout: Duration,
        settings: PoolSettings,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                address,
                connector,
                tls,
                connect_timeout,
                settings,
                idle: Mutex::new(VecDeque::new()),
                reaper_started: AtomicBool::new(false),
                closes_unannounced: AtomicBool::new(false),
            }),
        }
    }

    /// Sends `request` (origin-form URI, `Host` set) on an idle connection, or a new one when none is idle.
    ///
    /// A request that a reused connection refused before writing a byte (the target closed it while it was idle)
    /// goes on the next connection. One that was written is sent again, once and on a new connection, only if the
    /// reused connection failed before any byte of an answer came back and sending it twice is harmless: an
    /// idempotent method (GET, HEAD, OPTIONS, PUT, DELETE) without a body. A target that closes idle connections,
    /// or closes after each response without saying so, closes some just as a request is written on them.
    ///
    /// Sending again needs a copy of the request made before it is sent, a visible share of a proxied request's
    /// cost (BENCHMARKS.md), so a copy is made only where a close is possible: on a connection's first reuse
    /// (a target closing after every response), after 100 ms idle (a target's idle timeout), and on every reuse
    /// once a target has closed a reused connection under a request. A busy pool to a well-behaved target makes
    /// none.
    pub async fn send(&self, mut request: Request<Body>) -> Result<Response<Body>, SendError> {
        let mut fresh = false;
        loop {
            let checked_out = if fresh { None } else { self.shared.checkout() };
            let (mut connection, suspect, reused) = match checked_out {
                Some((connection, idle)) => {
                    let suspect = connection.served == 1
                        || idle >= SUSPECT_IDLE
                        || self.shared.closes_unannounced.load(Ordering::Relaxed);
                    (connection, suspect, true)
                }
                None => (self.shared.connect_out_of_line().await?, false, false),
            };
            // A connection handed back as its response ended may still be finishing that exchange.
            if let Err(error) = connection.sender.ready().await {
                if reused {
                    continue;
                }
                return Err(error.into());
            }
            // Boxed: held across the send, unboxed it would add a whole request to the future of every request
            // (and to the bytes copied each time that future moves), for a copy made on few of them.
            let replay = (suspect && replayable(&request)).then(|| Box::new(replay_copy(&request)));
            let read_before = connection.read.load(Ordering::Relaxed);
            match connection.sender.try_send_request(request).await {
                Ok(response) => {
                    let pool = self.shared.clone();
                    return Ok(response.map(|body| {
                        Body::new(PooledBody {
                            body,
                            lease: Some(Lease { connection, pool }),
                        })
                    }));
                }
                Err(mut failed) => match (failed.take_message(), replay) {
                    (Some(unsent), _) if reused => request = unsent,
                    (None, replay)
                        if reused && connection.read.load(Ordering::Relaxed) == read_before =>
                    {
                        self.shared
                            .closes_unannounced
                            .store(true, Ordering::Relaxed);
                        let Some(copy) = replay else {
                            return Err(failed.into_error().into());
                        };
                        tracing::debug!(
                            error = %failed.error(),
                            "reused upstream connection closed under a request, sending it again on a new one"
                        );
                        request = *copy;
                        fresh = true;
                    }
                    _ => return Err(failed.into_error().into()),
                },
            }
        }
    }

    /// Sends a WebSocket handshake on a connection of its own, never pooled: after a `101` the connection carries
    /// the tunnel (the response's `hyper::upgrade::on` yields it); after any other answer it closes once the
    /// response has been read. Boxed for the same reason as `connect_out_of_line`: upgrades are rare.
    #[inline(never)]
    #[cold]
    pub fn send_upgrade(
        &self,
        request: Request<Body>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Incoming>, SendError>> + Send + '_>> {
        Box::pin(async move {
            let mut sender = match self.shared.dial().await? {
                Dialed::Plain(io) => open_upgradable(io).await?,
                Dialed::Tls(io) => open_upgradable(io).await?,
            };
            Ok(sender.send_request(request).await?)
        })
    }

    /// Idle connections held now.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.shared.lock_idle().len()
    }
}

// === impl SendError ===

impl From<hyper::Error> for SendError {
    fn from(error: hyper::Error) -> Self {
        // Only the body being written can make the client report a cause of ours; the walk runs on failures only.
        if error.is_user() && ClientBodyError::caused(&error) {
            Self::ClientBody(error)
        } else {
            Self::Http(error)
        }
    }
}

// === impl Shared ===

impl Shared {
    fn lock_idle(&self) -> MutexGuard<'_, VecDeque<IdleConnection>> {
        // The queue stays consistent even if a holder panicked: every operation on it is a single push or pop.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The most recently used idle connection that is still open, if any, and how long it was idle.
    fn checkout(&self) -> Option<(Connection, Duration)> {
        let mut idle = self.lock_idle();
        while let Some(connection) = idle.pop_back() {
            let idle_for = connection.since.elapsed();
            if idle_for >= self.settings.idle_timeout {
                // Everything before it has been idle even longer.
                let expired = std::mem::take(&mut *idle);
                drop(idle);
                drop(expired);
                return None;
            }
            if !connection.connection.sender.is_closed() {
                return Some((connection.connection, idle_for));
            }
        }
        None
    }

    fn checkin(self: &Arc<Self>, mut connection: Connection) {
        if connection.sender.is_closed() {
            return;
        }
        connection.served = connection.served.saturating_add(1);
        let surplus = {
            let mut idle = self.lock_idle();
            idle.push_back(IdleConnection {
                connection,
                since: Instant::now(),
            });
            (idle.len() > self.settings.max_idle).then(|| idle.pop_front())
        };
        drop(surplus);
        if !self.reaper_started.load(Ordering::Relaxed) {
            self.start_reaper();
        }
    }

    /// Closes the connections idle past the timeout, oldest first.
    fn evict_expired(&self) {
        let mut expired = Vec::new();
        {
            let mut idle = self.lock_idle();
            while idle.front().is_some_and(|connection| {
                connection.since.elapsed() >= self.settings.idle_timeout
                    || connection.connection.sender.is_closed()
            }) {
                expired.extend(idle.pop_front());
            }
        }
        drop(expired);
    }

    /// Once per pool, a task that closes expired idle connections even when no request comes to find them. It
    /// holds the pool weakly, so it ends with the pool (a reload builds new ones).
    fn start_reaper(self: &Arc<Self>) {
        if self.reaper_started.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool: Weak<Self> = Arc::downgrade(self);
        let period = (self.settings.idle_timeout / 2).max(Duration::from_millis(10));
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                match pool.upgrade() {
                    Some(pool) => pool.evict_expired(),
                    None => return,
                }
            }
        });
    }

    /// `connect` behind a pointer: a new connection is the rare case under load, and its futures (the connector's,
    /// the handshake's, the task it spawns) inlined into the request path would reserve their size in the stack
    /// frame of every request's poll.
    #[inline(never)]
    #[cold]
    fn connect_out_of_line(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Connection, SendError>> + Send + '_>> {
        Box::pin(self.connect())
    }

    /// A new connection to the target: TCP, then TLS for an `https` target.
    async fn dial(&self) -> Result<Dialed, SendError> {
        let tcp = self
            .connector
            .clone()
            .oneshot(self.address.clone())
            .await
            .map_err(|error| SendError::Connect(error.into()))?;
        let tls = match &self.tls {
            Some(tls) => tls,
            None if self.address.scheme_str() != Some("https") => return Ok(Dialed::Plain(tcp)),
            // Never plain text to a target that was meant to be reached over TLS.
            None => {
                return Err(SendError::Tls(std::io::Error::other(
                    "no TLS settings for this https target",
                )))
            }
        };
        let handshake = tls.handshake(tcp.into_inner());
        match tokio::time::timeout(self.connect_timeout, handshake).await {
            Ok(Ok(stream)) => Ok(Dialed::Tls(TokioIo::new(Box::new(stream)))),
            Ok(Err(error)) => Err(SendError::Tls(error)),
            Err(_) => Err(SendError::Tls(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no handshake within {:?}", self.connect_timeout),
            ))),
        }
    }

    async fn connect(&self) -> Result<Connection, SendError> {
        let read = Arc::new(AtomicU64::new(0));
        let sender = match self.dial().await? {
            Dialed::Plain(io) => open(CountingIo::wrap(io.into_inner(), &read)).await?,
            Dialed::Tls(io) => open(CountingIo::wrap(io.into_inner(), &read)).await?,
        };
        Ok(Connection {
            sender,
            read,
            served: 0,
        })
    }
}

/// A new connection, before HTTP.
enum Dialed {
    Plain(TokioIo<TcpStream>),
    /// Boxed: the TLS state is over a kilobyte, and this travels through the futures of new connections.
    Tls(TokioIo<Box<TlsStream<TcpStream>>>),
}

/// The HTTP/1.1 handshake on a new pooled connection, whose task is spawned to run until the connection closes.
///
/// Pooled connections and upgradable ones (`open_upgradable`) have tasks of different types: a pooled connection's
/// task is polled twice per request, and one task covering both kinds made its stack frame 2 KB instead of 168
/// bytes, which every poll paid for.
async fn open<T>(io: T) -> Result<SendRequest<Body>, SendError>
where
    T: Read + Write + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(io).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "upstream connection closed with an error");
        }
    });
    Ok(sender)
}

/// The HTTP/1.1 handshake on a WebSocket handshake's connection, which the tunnel takes over after a `101`.
async fn open_upgradable<T>(io: T) -> Result<SendRequest<Body>, SendError>
where
    T: Read + Write + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(io).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.with_upgrades().await {
            tracing::debug!(%error, "upstream upgrade connection closed with an error");
        }
    });
    Ok(sender)
}

/// Whether a request may be sent a second time after a reused connection failed under it: an idempotent method
/// (RFC 9110 §9.2.2) and no body byte to send, so none was sent and none is lost.
fn replayable(request: &Request<Body>) -> bool {
    let method = request.method();
    (method == Method::GET
        || method == Method::HEAD
        || method == Method::OPTIONS
        || method == Method::PUT
        || method == Method::DELETE)
        && request.body().is_end_stream()
}

/// A copy of a bodiless request to send again (without its extensions, which the client does not send).
fn replay_copy(request: &Request<Body>) -> Request<Body> {
    let mut copy = Request::new(Body::empty());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    copy
}

// === impl CountingIo ===

impl<T> CountingIo<T> {
    fn wrap(io: T, read: &Arc<AtomicU64>) -> TokioIo<Self> {
        TokioIo::new(Self {
            io,
            read: read.clone(),
        })
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CountingIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        if read > 0 {
            // Only this connection's task reads: a plain load and store, no read-modify-write.
            let total = self.read.load(Ordering::Relaxed);
            self.read.store(total + read, Ordering::Relaxed);
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CountingIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    /// What the test upstream does after writing a response.
    #[derive(Clone, Copy)]
    enum Then {
        KeepOpen,
        Close,
    }

    /// A keep-alive HTTP/1.1 server on loopback answering each request head with a fixed reply, counting the
    /// connections it accepted and the ones the client closed.
    struct RawUpstream {
        address: Uri,
        accepted: Arc<AtomicUsize>,
        closed_by_client: Arc<AtomicUsize>,
    }

    impl RawUpstream {
        async fn start(reply: fn(&str) -> (&'static [u8], Then)) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let address = format!("http://{}", listener.local_addr().expect("address"))
                .parse()
                .expect("uri");
            let accepted = Arc::new(AtomicUsize::new(0));
            let closed_by_client = Arc::new(AtomicUsize::new(0));
            let (counted, closed) = (accepted.clone(), closed_by_client.clone());
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    counted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(serve(stream, reply, closed.clone()));
                }
            });
            Self {
                address,
                accepted,
                closed_by_client,
            }
        }

        fn pool(&self, settings: PoolSettings) -> ConnectionPool {
            ConnectionPool::new(
                self.address.clone(),
                HttpConnector::new(),
                None,
                Duration::from_secs(1),
                settings,
            )
        }

        fn accepted(&self) -> usize {
            self.accepted.load(Ordering::SeqCst)
        }

        fn closed_by_client(&self) -> usize {
            self.closed_by_client.load(Ordering::SeqCst)
        }
    }

    async fn serve(
        mut stream: TcpStream,
        reply: fn(&str) -> (&'static [u8], Then),
        closed_by_client: Arc<AtomicUsize>,
    ) {
        let mut pending = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let head_end = loop {
                if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                    break end + 4;
                }
                match stream.read(&mut buffer).await {
                    Ok(0) | Err(_) => {
                        closed_by_client.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    Ok(n) => pending.extend_from_slice(&buffer[..n]),
                }
            };
            let head = String::from_utf8_lossy(&pending[..head_end]).into_owned();
            pending.drain(..head_end);
            let (bytes, then) = reply(&head);
            if stream.write_all(bytes).await.is_err() {
                return;
            }
            if let Then::Close = then {
                return;
            }
        }
    }

    const SETTINGS: PoolSettings = PoolSettings {
        max_idle: 16,
        idle_timeout: Duration::from_secs(60),
    };

    fn request(method: &str) -> Request<Body> {
        Request::builder()
            .method(method)
            .uri("/x")
            .header(http::header::HOST, "upstream.test")
            .body(Body::empty())
            .expect("request")
    }

    async fn read_all(response: Response<Body>) -> Bytes {
        response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes()
    }

    const OK: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";

    /// An upstream answering `ok` on keep-alive connections, and a pool to it.
    async fn keep_alive_pool(
        max_idle: usize,
        idle_timeout: Duration,
    ) -> (RawUpstream, ConnectionPool) {
        let upstream = RawUpstream::start(|_| (OK, Then::KeepOpen)).await;
        let pool = upstream.pool(PoolSettings {
            max_idle,
            idle_timeout,
        });
        (upstream, pool)
    }

    #[tokio::test]
    async fn sequential_requests_reuse_one_connection() {
        let upstream = RawUpstream::start(|_| (OK, Then::KeepOpen)).await;
        let pool = upstream.pool(SETTINGS);
        for _ in 0..5 {
            let response = pool.send(request("GET")).await.expect("response");
            assert_eq!(read_all(response).await, "ok");
        }
        assert_eq!(upstream.accepted(), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn bodiless_responses_give_their_connection_back_unpolled() {
        let upstream = RawUpstream::start(|head| {
            if head.starts_with("HEAD") {
                (
                    b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n",
                    Then::KeepOpen,
                )
            } else {
                (b"HTTP/1.1 204 No Content\r\n\r\n", Then::KeepOpen)
            }
        })
        .await;
        let pool = upstream.pool(SETTINGS);
        for method in ["HEAD", "GET", "HEAD"] {
            // Dropped without a poll, as the server does with a body that has ended before it starts.
            drop(pool.send(request(method)).await.expect("response"));
        }
        assert_eq!(upstream.accepted(), 1);
        assert_eq!(pool.idle_count(), 1);
    }

    #[tokio::test]
    async fn a_body_dropped_half_read_takes_its_connection_with_it() {
        let upstream = RawUpstream::start(|_| {
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf",
                Then::KeepOpen,
            )
        })
        .await;
        let pool = upstream.pool(SETTINGS);
        let response = pool.send(request("GET")).await.expect("response");
        let mut body = response.into_body();
        let first = body.frame().await.expect("a frame").expect("data");
        assert_eq!(first.into_data().expect("data frame"), "half");
        drop(body);
        assert_eq!(pool.idle_count(), 0);
        let _next = pool.send(request("GET")).await.expect("response");
        assert_eq!(upstream.accepted(), 2);
    }

    #[tokio::test]
    async fn a_connection_the_target_closed_while_idle_is_not_used() {
        // No `Connection: close`: the target just drops the connection after answering, as on its idle timeout.
        let upstream = RawUpstream::start(|_| (OK, Then::Close)).await;
        let pool = upstream.pool(SETTINGS);
        for _ in 0..3 {
            let response = pool.send(request("GET")).await.expect("response");
            assert_eq!(read_all(response).await, "ok");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(upstream.accepted(), 3);
    }

    #[tokio::test]
    async fn idle_connections_are_closed_after_the_idle_timeout() {
        let (upstream, pool) = keep_alive_pool(16, Duration::from_millis(100)).await;
        read_all(pool.send(request("GET")).await.expect("response")).await;
        assert_eq!(pool.idle_count(), 1);
        // No further request comes to find it expired: the reaper closes it.
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(pool.idle_count(), 0);
        assert_eq!(upstream.closed_by_client(), 1);
    }

    #[tokio::test]
    async fn at_most_max_idle_connections_are_kept() {
        let (upstream, pool) = keep_alive_pool(2, Duration::from_secs(60)).await;
        // Four responses held at once need four connections.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(pool.send(request("GET")).await.expect("response"));
        }
        assert_eq!(upstream.accepted(), 4);
        for response in held {
            read_all(response).await;
        }
        assert_eq!(pool.idle_count(), 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(upstream.closed_by_client(), 2);
    }

    #[tokio::test]
    async fn an_https_target_without_tls_settings_is_never_sent_plain_text() {
        let upstream = RawUpstream::start(|_| (OK, Then::KeepOpen)).await;
        let https: Uri = format!(
            "https://{}",
            upstream.address.authority().expect("authority")
        )
        .parse()
        .expect("uri");
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        let pool = ConnectionPool::new(https, connector, None, Duration::from_secs(1), SETTINGS);
        let refused = pool.send(request("GET")).await;
        assert!(matches!(refused, Err(SendError::Tls(_))), "{refused:?}");
        // The TCP connection was made, then closed without a byte sent (the server saw no request head).
        for _ in 0..100 {
            if upstream.closed_by_client() == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!((upstream.accepted(), upstream.closed_by_client()), (1, 1));
    }
}
