//! One connection, from its opening to its close: told HTTP/2 from HTTP/1.1 by its first bytes, served by hyper
//! under its clocks, each request held to the largest head and handed to the handler.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpStream;

use super::drain::DrainWatcher;
use super::h2_clock::{Activity, HeaderClock, IdleClosing, Tracked};
use super::handler::BoxError;
use super::http1::{Http1Connection, Limits};
use super::idle::ConnectionClock;
use super::{Handler, Settings};

/// The HTTP/2 connection preface, with which an h2c (prior knowledge) client opens its connection.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// What a connection from `peer` does with each request: hands it to `handler`, or to its refusal when its head is
/// over `max_header_bytes`. A macro, not a function: the closure's future (the handler's) cannot be named in a
/// function's return type.
macro_rules! requests {
    ($handler:expr, $peer:expr, $max_header_bytes:expr) => {{
        let (handler, peer, max_header_bytes) = ($handler, $peer, $max_header_bytes);
        // Nothing in this closure but what every request needs: the future it returns is built in place in the
        // connection only while the closure stays this small (a WebSocket handshake's drain hold is taken by the
        // handler; here it made every request copy its future once more).
        move |request: hyper::Request<hyper::body::Incoming>| {
            // No handler for a head over the limit. Nothing else is captured for it: the future is moved into the
            // connection once per request, and each byte more in it is copied every time.
            let handler =
                ($crate::server::connection::head_bytes(&request) <= max_header_bytes)
                    .then(|| handler.clone());
            H::handle(handler, request, peer)
        }
    }};
}
pub(super) use requests;

/// [`requests!`] for the plain requests a connection reads itself, bodies whole (their heads within the limit:
/// one over it is hyper's).
macro_rules! whole_requests {
    ($handler:expr, $peer:expr) => {{
        let (handler, peer) = ($handler, $peer);
        move |request: hyper::Request<bytes::Bytes>, lines: Vec<u8>| {
            H::handle_whole(handler.clone(), request, peer, lines)
        }
    }};
}

/// The two ways a connection is served, built once.
pub(super) struct Builders {
    /// The largest request head, held against every parsed one.
    pub(super) max_header_bytes: usize,
    /// For each connection's clocks.
    pub(super) keepalive_timeout: Duration,
    pub(super) header_read_timeout: Duration,
    /// For connections whose first bytes are not the HTTP/2 preface: nearly all of them. Its timer is each
    /// connection's own clock (`idle`).
    pub(super) http1: http1::Builder,
    /// For the rest: reads the opening itself and serves HTTP/2 (or HTTP/1.1, after a partial preface).
    auto: auto::Builder<TokioExecutor>,
}

impl Builders {
    /// Both with the server's limits; `auto` repeats the HTTP/1 ones for the connections it serves over HTTP/1.1.
    pub(super) fn new(settings: &Settings) -> Self {
        let mut http1 = http1::Builder::new();
        http1
            .header_read_timeout(settings.header_read_timeout)
            .max_buf_size(settings.max_header_bytes.max(8192));
        let mut auto = auto::Builder::new(TokioExecutor::new());
        auto.http1()
            .timer(TokioTimer::new())
            .header_read_timeout(settings.header_read_timeout)
            .max_buf_size(settings.max_header_bytes.max(8192));
        auto.http2()
            .timer(TokioTimer::new())
            .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
        Self {
            max_header_bytes: settings.max_header_bytes,
            keepalive_timeout: settings.keepalive_timeout,
            header_read_timeout: settings.header_read_timeout,
            http1,
            auto,
        }
    }
}

/// How a connection opens, seen without consuming its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Opening {
    /// Not the HTTP/2 preface: HTTP/1.1.
    Http1,
    /// The preface, or a part of it so far: `auto` decides.
    MaybeHttp2,
    /// Closed, failed or silent for the whole header read timeout: nothing to serve.
    Nothing,
}

/// Peeks at the first bytes of `stream`, waiting at most `within` for them.
async fn sniff(stream: &TcpStream, within: Duration) -> Opening {
    let mut first = [0u8; H2_PREFACE.len()];
    match tokio::time::timeout(within, stream.peek(&mut first)).await {
        Ok(Ok(read)) if read > 0 => {
            if first[..read] == H2_PREFACE[..read] {
                Opening::MaybeHttp2
            } else {
                Opening::Http1
            }
        }
        _ => Opening::Nothing,
    }
}

/// Serves one accepted connection until it closes (or shutdown closes it).
///
/// HTTP/1.1 connections are served by hyper's HTTP/1 connection directly rather than by `auto`, whose one future
/// holds both protocols: its poll, run at every wake-up of the connection, reserved a 23 KB stack frame for the
/// HTTP/2 side and touched every page of it. The opening is peeked at, not read, so nothing needs replaying.
pub(super) async fn serve_connection<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    handler: H,
    builders: Arc<Builders>,
    watcher: DrainWatcher,
    header_read_timeout: Duration,
) {
    let accepted = std::time::Instant::now();
    let opening = sniff(&stream, header_read_timeout).await;
    let service = service_fn(requests!(handler.clone(), peer, builders.max_header_bytes));
    let result = match opening {
        Opening::Http1 => {
            let (clock, stream) = ConnectionClock::new(
                stream,
                builders.keepalive_timeout,
                builders.header_read_timeout,
            );
            // Served directly while requests are plain, by hyper for any other, by the socket alone while it
            // rests between them.
            let direct = whole_requests!(handler, peer);
            let limits = Limits {
                max_header_bytes: builders.max_header_bytes,
                keepalive_timeout: builders.keepalive_timeout,
                header_read_timeout: builders.header_read_timeout,
            };
            let connection = Http1Connection::new(
                stream,
                service,
                direct,
                builders.http1.clone(),
                clock,
                limits,
            );
            let connection = std::pin::pin!(connection);
            watcher
                .watch(connection, Http1Connection::graceful_shutdown)
                .await
        }
        Opening::MaybeHttp2 => {
            let stream = HeaderClock::new(stream, accepted, header_read_timeout);
            serve_auto(&builders, stream, service, watcher).await
        }
        Opening::Nothing => {
            tracing::debug!(%peer, "connection closed before sending a request");
            return;
        }
    };
    if let Err(error) = result {
        tracing::debug!(%peer, %error, "connection ended with an error");
    }
}

/// The size of `request`'s head as HTTP/1.1 writes it: request line, then `name: value` and CRLF per field.
///
/// hyper holds `max_header_bytes` against its read buffer only while a head is incomplete, so a larger head that
/// arrives whole in one read is parsed; this holds the limit against every parsed head, however it arrived (and
/// against HTTP/2's too, whose own limit counts differently). A handful of additions per field, out of line: inlined
/// into the connection's poll it grew that frame, and the request future's copy into the connection took glibc's
/// slower path (the cost per request: BENCHMARKS.md).
#[inline(never)]
pub(super) fn head_bytes<B>(request: &hyper::Request<B>) -> usize {
    let uri = request.uri();
    // `METHOD SP target SP HTTP/1.1 CRLF`, the target in absolute form when it came so, and the blank line.
    let line = request.method().as_str().len()
        + uri.scheme_str().map_or(0, |scheme| scheme.len() + 3)
        + uri
            .authority()
            .map_or(0, |authority| authority.as_str().len())
        + uri
            .path_and_query()
            .map_or(0, |target| target.as_str().len())
        + 13;
    request.headers().iter().fold(line, |bytes, (name, value)| {
        bytes + name.as_str().len() + value.len() + 4
    })
}

/// Serves a connection that opened with (part of) the HTTP/2 preface, under its header clock, closed gracefully once
/// it has had no request in flight for `keepalive_timeout`. Boxed and out of line, so that its poll stays out of the
/// HTTP/1 connections' one.
#[inline(never)]
pub(super) fn serve_auto<T, S, B>(
    builders: &Builders,
    stream: HeaderClock<T>,
    service: S,
    watcher: DrainWatcher,
) -> Pin<Box<dyn Future<Output = Result<(), BoxError>> + Send>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<
            hyper::Request<Incoming>,
            Response = http::Response<B>,
            Error = Infallible,
        > + Send
        + 'static,
    B: http_body::Body<Data = bytes::Bytes, Error: Into<BoxError>> + Send + Unpin + 'static,
    S::Future: Send + 'static,
{
    let activity = Activity::new();
    let tracked = {
        let activity = activity.clone();
        service_fn(move |request| {
            let in_flight = activity.begin();
            let call = service.call(request);
            async move {
                call.await
                    .map(|response| response.map(|body| Tracked::new(body, in_flight)))
            }
        })
    };
    let connection = builders
        .auto
        .serve_connection_with_upgrades(TokioIo::new(stream), tracked)
        .into_owned();
    let connection = IdleClosing::new(
        connection,
        auto::UpgradeableConnection::graceful_shutdown,
        activity,
        builders.keepalive_timeout,
    );
    Box::pin(async move {
        let connection = std::pin::pin!(connection);
        watcher
            .watch(connection, IdleClosing::graceful_shutdown)
            .await
    })
}
