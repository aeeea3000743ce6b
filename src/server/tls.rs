//! An HTTPS connection: its TLS handshake, held to the header read timeout and its failures counted by reason (never
//! logged one by one), then served as a clear-text connection is, HTTP/2 or HTTP/1.1 as ALPN chose.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hyper::body::Incoming;
use hyper::service::{service_fn, HttpService};
use hyper_util::rt::TokioIo;
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use super::connection::{requests, serve_auto, Builders};
use super::drain::DrainWatcher;
use super::h2_clock::HeaderClock;
use super::handler::BoxError;
use super::idle::ConnectionClock;
use super::Handler;

/// Where an HTTPS listener's handshakes take their TLS settings from, read at each handshake: settings replaced on
/// a reload reach the connections that open after it, and those open keep theirs.
pub trait TlsConfig: Send + Sync + 'static {
    /// The settings for the handshake about to begin.
    fn current(&self) -> Arc<ServerConfig>;

    /// How each request of a connection whose client showed `certificate` (its verified leaf, DER) is marked: asked
    /// once per connection, so that what the certificate says is read once; `None` leaves the requests as they are.
    fn client_mark(&self, _certificate: &[u8]) -> Option<ClientMark> {
        None
    }
}

/// Marks a request (its extensions) with what its connection's client certificate says.
pub type ClientMark = Arc<dyn Fn(&mut http::Extensions) + Send + Sync>;

/// Serves one accepted HTTPS connection until it closes (or shutdown closes it). The handshake is held to the
/// header read timeout, as a clear-text connection's opening is. A client that asked for `h2` by ALPN is served
/// HTTP/2; any other, HTTP/1.1.
pub(super) async fn serve_tls_connection<H: Handler>(
    stream: TcpStream,
    peer: SocketAddr,
    handler: H,
    builders: Arc<Builders>,
    watcher: DrainWatcher,
    header_read_timeout: Duration,
    tls: Arc<dyn TlsConfig>,
) {
    let accepted = Instant::now();
    let acceptor = TlsAcceptor::from(tls.current());
    let reason = match tokio::time::timeout(header_read_timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let max_header_bytes = builders.max_header_bytes;
            // Read once per connection: with `client_ca`, each request of the connection carries it; a connection
            // without one pays a test of `None` a request.
            let mark = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| tls.client_mark(leaf));
            let requests = requests!(handler, peer, max_header_bytes);
            let service = service_fn(move |mut request: hyper::Request<Incoming>| {
                if let Some(mark) = &mark {
                    mark(request.extensions_mut());
                }
                requests(request)
            });
            let served = serve_tls_stream(
                &builders,
                stream,
                service,
                watcher,
                accepted,
                header_read_timeout,
            )
            .await;
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
            return;
        }
        Ok(Err(error)) => failure_reason(&error),
        Err(_) => "timeout",
    };
    metrics::counter!("tollgate_tls_handshake_failures_total", "reason" => reason).increment(1);
}

/// Serves an HTTPS connection after its handshake: HTTP/2 when its client asked for `h2` by ALPN, HTTP/1.1 otherwise.
async fn serve_tls_stream<S, B>(
    builders: &Builders,
    stream: TlsStream<TcpStream>,
    service: S,
    watcher: DrainWatcher,
    accepted: Instant,
    header_read_timeout: Duration,
) -> Result<(), BoxError>
where
    S: hyper::service::Service<
            hyper::Request<Incoming>,
            Response = http::Response<B>,
            Error = Infallible,
            Future: Send + 'static,
        > + Unpin
        + Send
        + 'static,
    B: http_body::Body<Data = bytes::Bytes, Error: Into<BoxError>> + Send + Unpin + 'static,
{
    // HTTP/2 over TLS is chosen by ALPN alone (RFC 9113 §3.2): a client that named no protocol (wrk,
    // `openssl s_client`, many libraries) speaks HTTP/1.1, and takes its own path, not the one that reads
    // the opening to find out (which costs every request a second move of its future).
    if stream.get_ref().1.alpn_protocol() != Some(b"h2") {
        serve_http1(builders, stream, service, watcher).await
    } else {
        let stream = HeaderClock::new(stream, accepted, header_read_timeout);
        serve_auto(builders, stream, service, watcher).await
    }
}

/// Serves an HTTPS connection whose client chose HTTP/1.1 (or named no protocol) under the clear-text connections' clock: idle between
/// requests for up to `keepalive_timeout`, `header_read_timeout` from a head's first byte, and the gateway's JSON
/// refusals of malformed heads. It never rests its hyper connection as a clear-text one does: whether the socket is
/// readable says nothing of what TLS has already read and buffered.
async fn serve_http1<S, B>(
    builders: &Builders,
    stream: TlsStream<TcpStream>,
    service: S,
    watcher: DrainWatcher,
) -> Result<(), BoxError>
where
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<BoxError>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let (clock, stream) = ConnectionClock::new(
        stream,
        builders.keepalive_timeout,
        builders.header_read_timeout,
    );
    let mut builder = builders.http1.clone();
    builder.timer(clock);
    let connection = builder
        .serve_connection(TokioIo::new(stream), service)
        .with_upgrades();
    let connection = std::pin::pin!(connection);
    watcher
        .watch(connection, |connection| connection.graceful_shutdown())
        .await
        .map_err(BoxError::from)
}

/// The metric's `reason` for a failed handshake: what an operator can act on (clients on old versions, clients
/// without a certificate, clients that distrust ours, port scanners), not rustls's every variant.
fn failure_reason(error: &io::Error) -> &'static str {
    let Some(tls) = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    else {
        return match error.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe => "closed",
            _ => "io",
        };
    };
    match tls {
        rustls::Error::PeerIncompatible(_) => "incompatible",
        rustls::Error::NoCertificatesPresented => "no_client_certificate",
        rustls::Error::InvalidCertificate(_) => "bad_client_certificate",
        rustls::Error::AlertReceived(_) => "alert_received",
        rustls::Error::InvalidMessage(_)
        | rustls::Error::InappropriateMessage { .. }
        | rustls::Error::InappropriateHandshakeMessage { .. } => "not_tls",
        _ => "other",
    }
}
