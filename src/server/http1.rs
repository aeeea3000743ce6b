//! An HTTP/1.1 connection served in turns: directly while its requests are plain, by a hyper connection for any
//! other, by the socket alone while it rests between requests.
//!
//! Plain requests (no body, nothing to negotiate: `direct.rs`) are read and answered by the connection itself.
//! The first request that is not goes to a hyper connection with the bytes read, and hyper serves the connection
//! until it has waited [`REST_AFTER`](super::idle::REST_AFTER) for a next request.
//!
//! hyper's connection keeps an 8 KB read buffer, an 8 KB write buffer and a box the size of a request's future for
//! as long as it lives, idle or not: 24 KB per idle keep-alive connection. Once a connection has waited
//! `REST_AFTER` for its next request with nothing of it come, its hyper connection (or its direct turn) is
//! closed without closing the socket (hyper is between requests: nothing is lost) and dropped with its buffers; the
//! socket waits for readability, which needs no buffer, until the next request's bytes come (a direct turn serves
//! it) or `keepalive_timeout` closes it. Bytes hyper had read and not parsed are read first by the next turn.

use std::error::Error as StdError;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1::{Builder, UpgradeableConnection};
use hyper::service::HttpService;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::direct::{Answer, DirectTurn, Ended};
use super::handler::BoxError;
use super::idle::{ConnectionClock, MarkedStream};

/// One HTTP/1.1 connection, for as long as it is open.
pub(super) struct Http1Connection<S: HttpService<Incoming>, D: Answer, B> {
    turn: Turn<S, D::Future, B>,
    /// What answers the requests served directly.
    direct: D,
    /// The server's HTTP/1 settings, with this connection's clock as hyper's timer.
    builder: Builder,
    clock: ConnectionClock,
    /// The server's limits, for the direct turns.
    limits: Limits,
    /// Shutdown began: a request being served is finished, then the connection closes instead of resting; a
    /// resting one closes at once.
    draining: bool,
}

/// What a direct turn holds its requests to.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) max_header_bytes: usize,
    pub(super) keepalive_timeout: Duration,
    pub(super) header_read_timeout: Duration,
}

/// Who serves the connection now.
enum Turn<S: HttpService<Incoming>, F, B> {
    /// The connection itself, while requests are plain (boxed: a resting connection holds only the pointer).
    Direct {
        stream: MarkedStream<TcpStream>,
        service: S,
        turn: Pin<Box<DirectTurn<F, B>>>,
    },
    /// A hyper connection (boxed, as above).
    Serving(Box<UpgradeableConnection<TokioIo<MarkedStream<TcpStream>>, S>>),
    /// Nobody: the socket waits for the next request's bytes, or for `closes` (`keepalive_timeout`).
    Resting {
        stream: MarkedStream<TcpStream>,
        service: S,
        closes: Pin<Box<tokio::time::Sleep>>,
    },
    /// Between two turns.
    Ended,
}

// === impl Http1Connection ===

impl<S, D, B> Http1Connection<S, D, B>
where
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    D: Answer<Body = B> + Unpin,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    /// Serves `stream` (with `clock` watching it): plain requests with `direct`, any other with `service` on hyper
    /// connections made by `builder`.
    pub(super) fn new(
        stream: MarkedStream<TcpStream>,
        service: S,
        direct: D,
        mut builder: Builder,
        clock: ConnectionClock,
        limits: Limits,
    ) -> Self {
        builder.timer(clock.clone());
        let mut connection = Self {
            turn: Turn::Ended,
            direct,
            builder,
            clock,
            limits,
            draining: false,
        };
        connection.serve_directly(stream, service, Bytes::new());
        connection
    }

    /// Asks the connection to finish the request it serves and close; a resting one closes at once.
    pub(super) fn graceful_shutdown(self: Pin<&mut Self>) {
        let this = self.get_mut();
        this.draining = true;
        if let Turn::Serving(connection) = &mut this.turn {
            Pin::new(connection.as_mut()).graceful_shutdown();
        }
    }

    /// A direct turn, starting with the bytes `read` (read by a hyper connection and not parsed, or none).
    fn serve_directly(&mut self, stream: MarkedStream<TcpStream>, service: S, read: Bytes) {
        let turn = DirectTurn::new(
            read,
            self.limits.keepalive_timeout,
            self.limits.header_read_timeout,
        );
        self.turn = Turn::Direct {
            stream,
            service,
            turn: Box::pin(turn),
        };
    }

    /// A hyper connection's turn, with upgrades: a WebSocket handshake the upstream accepts hands the connection to
    /// its tunnel.
    fn serve(&mut self, stream: MarkedStream<TcpStream>, service: S) {
        let connection = self
            .builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        self.turn = Turn::Serving(Box::new(connection));
    }

    /// Ends the direct turn: hyper serves the bytes it read (a request that is not plain), or the connection rests
    /// until `closes_at`.
    fn end_direct(&mut self, ended: Ended) -> bool {
        let Turn::Direct {
            mut stream,
            service,
            ..
        } = mem::replace(&mut self.turn, Turn::Ended)
        else {
            return false;
        };
        match ended {
            Ended::Closed => false,
            Ended::HandOff(read) => {
                stream.rewind(read);
                // hyper's wait for this head starts now, whatever the direct turn waited before.
                self.clock.hand_over();
                self.serve(stream, service);
                true
            }
            Ended::Rest { closes_at } => {
                self.clock.drop_spare();
                self.turn = Turn::Resting {
                    stream,
                    service,
                    closes: Box::pin(tokio::time::sleep_until(closes_at.into())),
                };
                true
            }
        }
    }

    /// Ends the hyper connection put aside, and rests, or serves at once what it had read and not parsed. False
    /// when there is nothing left to serve (the connection was upgraded).
    fn rest(&mut self) -> bool {
        self.clock.set_aside(false);
        let Turn::Serving(connection) = mem::replace(&mut self.turn, Turn::Ended) else {
            return false;
        };
        let Some(parts) = connection.into_parts() else {
            return false;
        };
        let stream = parts.io.into_inner();
        if !parts.read_buf.is_empty() {
            // A pipelined request's first bytes: copied out of hyper's 8 KB buffer, which goes with it.
            let read = Bytes::copy_from_slice(&parts.read_buf);
            self.serve_directly(stream, parts.service, read);
            return true;
        }
        // A resting connection holds no timer but the one that closes it.
        self.clock.drop_spare();
        let closes = tokio::time::sleep_until(self.clock.rest_deadline().into());
        self.turn = Turn::Resting {
            stream,
            service: parts.service,
            closes: Box::pin(closes),
        };
        true
    }

    /// Ends a rest: a direct turn serves the bytes that came.
    fn resume(&mut self) {
        if let Turn::Resting {
            stream, service, ..
        } = mem::replace(&mut self.turn, Turn::Ended)
        {
            self.serve_directly(stream, service, Bytes::new());
        }
    }
}

impl<S, D, B> Future for Http1Connection<S, D, B>
where
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    D: Answer<Body = B> + Unpin,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    type Output = Result<(), BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.turn {
                Turn::Direct { stream, turn, .. } => {
                    let ended = match turn.as_mut().poll_turn(
                        cx,
                        stream,
                        &mut this.direct,
                        this.limits.max_header_bytes,
                        this.draining,
                    ) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(Err(error)) => return Poll::Ready(Err(error.into())),
                        Poll::Ready(Ok(ended)) => ended,
                    };
                    // Once shutdown has begun, a request that is not plain is not begun with hyper either.
                    if this.draining || !this.end_direct(ended) {
                        return Poll::Ready(Ok(()));
                    }
                }
                Turn::Serving(connection) => match Pin::new(connection.as_mut()).poll(cx) {
                    Poll::Pending => {
                        // One load per wake-up: hyper is pending, so its connection is put aside only when its
                        // clock said it has waited long enough for a head and none came.
                        if !this.clock.rest_due() || this.clock.setting_aside() || this.draining {
                            return Poll::Pending;
                        }
                        // hyper is between requests: asked to close, it does at once, writing nothing; polled
                        // again, it gives the socket back.
                        this.clock.set_aside(true);
                        Pin::new(connection.as_mut()).graceful_shutdown();
                    }
                    Poll::Ready(result) => {
                        if !this.clock.setting_aside() || this.draining || result.is_err() {
                            return Poll::Ready(result.map_err(BoxError::from));
                        }
                        if !this.rest() {
                            return Poll::Ready(Ok(()));
                        }
                    }
                },
                Turn::Resting { stream, closes, .. } => {
                    if this.draining {
                        return Poll::Ready(Ok(()));
                    }
                    // Readable: the next request's bytes (or the client's close, which the direct turn reads as
                    // such).
                    if stream.get_ref().poll_read_ready(cx).is_ready() {
                        this.resume();
                        continue;
                    }
                    if closes.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Ok(()));
                    }
                    return Poll::Pending;
                }
                Turn::Ended => return Poll::Ready(Ok(())),
            }
        }
    }
}
