//! New connections to the target: TCP, TLS for `https`, the HTTP/1.1 handshake, and the count of bytes read.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::rt::{Read, Write};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tower::ServiceExt;

use super::idle::Shared;
use super::send::SendError;

/// A pooled connection: its request sender and the count of bytes it has read from the target, which tells a
/// request that failed before any byte of an answer from one that failed mid-response.
#[derive(Debug)]
pub(super) struct Connection {
    pub(super) sender: SendRequest<Body>,
    pub(super) read: Arc<AtomicU64>,
    /// Responses it has carried to their end.
    pub(super) served: u32,
    /// The wait for each answer's head on this connection: one timer, made with the first request and kept, where a
    /// timer per request was registered and removed again (a visible share of a proxied request's instructions);
    /// each request waits on it until its own deadline (`send::head_timer`).
    pub(super) head_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// A connection's transport, counting the bytes read (written only by the connection's task).
#[derive(Debug)]
struct CountingIo<T> {
    io: T,
    read: Arc<AtomicU64>,
}

// === impl Shared ===

impl Shared {
    /// `connect` behind a pointer: a new connection is the rare case under load, and its futures (the connector's,
    /// the handshake's, the task it spawns) inlined into the request path would reserve their size in the stack
    /// frame of every request's poll.
    #[inline(never)]
    #[cold]
    pub(super) fn connect_out_of_line(
        &self,
    ) -> Pin<Box<dyn Future<Output = Result<Connection, SendError>> + Send + '_>> {
        Box::pin(self.connect())
    }

    /// A new connection to the target: TCP, then TLS for an `https` target.
    pub(super) async fn dial(&self) -> Result<Dialed, SendError> {
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

    pub(super) async fn connect(&self) -> Result<Connection, SendError> {
        let read = Arc::new(AtomicU64::new(0));
        let sender = match self.dial().await? {
            Dialed::Plain(io) => open(CountingIo::wrap(io.into_inner(), &read)).await?,
            Dialed::Tls(io) => open(CountingIo::wrap(io.into_inner(), &read)).await?,
        };
        Ok(Connection {
            sender,
            read,
            served: 0,
            head_timer: None,
        })
    }
}

/// A new connection, before HTTP.
pub(super) enum Dialed {
    Plain(TokioIo<TcpStream>),
    /// Boxed: the TLS state is over a kilobyte, and this travels through the futures of new connections.
    Tls(TokioIo<Box<TlsStream<TcpStream>>>),
}

/// The HTTP/1.1 handshake on a new pooled connection, whose task is spawned to run until the connection closes.
///
/// Pooled connections and upgradable ones (`open_upgradable`) have tasks of different types: a pooled connection's
/// task is polled twice per request, and one task covering both kinds made its stack frame 2 KB instead of 168
/// bytes, which every poll paid for.
pub(super) async fn open<T>(io: T) -> Result<SendRequest<Body>, SendError>
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
pub(super) async fn open_upgradable<T>(io: T) -> Result<SendRequest<Body>, SendError>
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
