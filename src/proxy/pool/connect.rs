//! A connection to the target: dialled (TCP, TLS for `https`), then carrying one exchange at a time in the task of
//! the request that holds it (`Connection::exchange`), counting the bytes it reads.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll, Waker};

use axum::body::Body;
use bytes::BytesMut;
use http::{Method, Request};
use hyper::client::conn::http1::{self, SendRequest};
use hyper::rt::{Read, Write};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::io::poll_read_buf;
use tower::ServiceExt;

use super::idle::Shared;
use super::send::SendError;
use super::wire::{
    parse_response_head, write_request_head, ResponseHead, Upload, UploadError, WireError,
};
use crate::proxy::headers::HopFields;

/// A pooled connection: its transport, what it has read and not yet handed on, and the count of bytes read, which
/// tells a request that failed before any byte of an answer from one that failed mid-response.
pub(super) struct Connection {
    io: Transport,
    /// What the target sent that the exchange has not taken yet.
    pub(super) buffer: BytesMut,
    /// The request head being written; its allocation serves the connection's next requests.
    out: Vec<u8>,
    /// Bytes read from the target.
    pub(super) read: u64,
    /// The room the next read gets when the buffer needs more.
    read_size: usize,
    /// The wait for each answer's head on this connection: one timer, made with the first request and kept, where a
    /// timer per request was registered and removed again (a visible share of a proxied request's instructions);
    /// each request waits on it until its own deadline (`send::head_timer`).
    pub(super) head_timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

/// A connection's byte stream: TCP, or TLS over it for `https` targets.
pub(super) enum Transport {
    Plain(TcpStream),
    /// Boxed: the TLS state is over a kilobyte, and connections move in and out of the pool.
    Tls(Box<TlsStream<TcpStream>>),
}

/// A request the target answered: the answer's head, and whether the whole request was written (a target may
/// answer before reading all of a body, and then the connection cannot carry another request).
pub(super) struct Exchanged {
    pub(super) head: ResponseHead,
    pub(super) uploaded: bool,
}

/// A request the target did not answer.
pub(super) struct Failed {
    pub(super) error: SendError,
    /// Whether any of the request went out or any of its body was taken: it cannot go elsewhere whole.
    pub(super) committed: bool,
}

/// Bytes asked of the transport per read at first, and at most: a read that fills the room it had doubles the next
/// one's (a large answer in fewer reads, as hyper's adaptive buffer does), and a rest starts over.
const READ_SIZE: usize = 8 * 1024;
const MAX_READ_SIZE: usize = 64 * 1024;
/// The least room left in the buffer before it grows.
const MIN_READ_ROOM: usize = 1024;

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
        let io = match self.dial().await? {
            Dialed::Plain(io) => Transport::Plain(io.into_inner()),
            Dialed::Tls(io) => Transport::Tls(io.into_inner()),
        };
        Ok(Connection {
            io,
            buffer: BytesMut::with_capacity(READ_SIZE),
            out: Vec::new(),
            read: 0,
            read_size: READ_SIZE,
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

/// The HTTP/1.1 handshake on a WebSocket handshake's connection, which the tunnel takes over after a `101`: hyper's
/// client, in a task of its own, since the connection outlives the request that opened it.
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

// === impl Connection ===

impl Connection {
    /// Writes `request` and reads its answer's head, both at once: a target may answer before it has read the
    /// whole body. The request is borrowed, not consumed, so that one nothing of which went out can go elsewhere.
    /// Once it is answered its fields are gone: their map holds the answer's (see `parse_response_head`).
    pub(super) async fn exchange(
        &mut self,
        request: &mut Request<Body>,
        hop: &HopFields,
    ) -> Result<Exchanged, Failed> {
        let framing = write_request_head(request, hop, &mut self.out);
        let head_request = request.method() == Method::HEAD;
        let mut upload = Upload::new(framing);
        std::future::poll_fn(|cx| {
            if !upload.is_finished() {
                let polled = upload.poll(&mut self.io, &mut self.out, request.body_mut(), cx);
                if let Poll::Ready(Err(error)) = polled {
                    let error = match error {
                        UploadError::Body(error) => SendError::ClientBody(error),
                        UploadError::Io(error) => SendError::Wire(WireError::Io(error)),
                    };
                    return Poll::Ready(Err(Failed {
                        error,
                        committed: upload.committed,
                    }));
                }
            }
            loop {
                if !self.buffer.is_empty() {
                    match parse_response_head(&mut self.buffer, head_request, request.headers_mut())
                    {
                        Ok(Some(head)) => {
                            return Poll::Ready(Ok(Exchanged {
                                head,
                                uploaded: upload.is_finished(),
                            }))
                        }
                        Ok(None) => {}
                        Err(error) => {
                            return Poll::Ready(Err(Failed {
                                error: SendError::Wire(error),
                                committed: true,
                            }))
                        }
                    }
                }
                let error = match self.poll_fill(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Ok(0)) => WireError::Closed,
                    Poll::Ready(Ok(_)) => continue,
                    Poll::Ready(Err(error)) => WireError::Io(error),
                };
                return Poll::Ready(Err(Failed {
                    error: SendError::Wire(error),
                    committed: upload.committed,
                }));
            }
        })
        .await
    }

    /// Reads more of what the target sent into the buffer: the bytes read, 0 at the close.
    pub(super) fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<std::io::Result<usize>> {
        if self.buffer.capacity() - self.buffer.len() < MIN_READ_ROOM {
            // Reuses the allocation when nothing else holds a part of it (the last answer's head and body are
            // usually written to the client and dropped by now).
            self.buffer.reserve(self.read_size);
        }
        let room = self.buffer.capacity() - self.buffer.len();
        let read = ready!(poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buffer))?;
        if read == room {
            self.read_size = (self.read_size * 2).min(MAX_READ_SIZE);
        }
        self.read += read as u64;
        Poll::Ready(Ok(read))
    }

    /// Gives back the connection's buffers and head timer while it is idle (its next request makes them again): an
    /// idle pooled connection is then its socket and a few words, not 8 KB and more.
    pub(super) fn rest(&mut self) {
        self.head_timer = None;
        if self.buffer.is_empty() && self.buffer.capacity() > 0 {
            self.buffer = BytesMut::new();
            self.read_size = READ_SIZE;
        }
        self.out = Vec::new();
    }

    /// The bytes its buffers hold room for.
    #[cfg(test)]
    pub(super) fn buffered_capacity(&self) -> usize {
        self.buffer.capacity() + self.out.capacity()
    }

    /// Whether the target closed the connection, or sent something unasked, while it was idle: a look at what the
    /// reactor has seen, with no system call unless the socket is readable.
    pub(super) fn closed_while_idle(&mut self) -> bool {
        if !self.buffer.is_empty() {
            return true;
        }
        let mut quiet = Context::from_waker(Waker::noop());
        !matches!(self.poll_fill(&mut quiet), Poll::Pending)
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Connection")
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

// === impl Transport ===

impl AsyncRead for Transport {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Transport::Tls(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Transport {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_write(cx, buf),
            Transport::Tls(io) => Pin::new(io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_flush(cx),
            Transport::Tls(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Transport::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Transport::Tls(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}
