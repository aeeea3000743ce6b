//! An HTTP/1.1 connection served in turns: by a hyper connection while requests come, by the socket alone while it
//! rests between them.
//!
//! hyper's connection keeps an 8 KB read buffer, an 8 KB write buffer and a box the size of a request's future for
//! as long as it lives, idle or not: 24 KB per idle keep-alive connection. Once a connection has waited
//! [`REST_AFTER`](super::idle::REST_AFTER) for its next request with nothing of it come, its hyper connection is
//! closed without closing the socket (hyper is between requests: nothing is lost) and dropped with its buffers; the
//! socket waits for readability, which needs no buffer, until the next request's bytes come (a new hyper
//! connection serves it) or `keepalive_timeout` closes it. Bytes hyper had read and not parsed are read again
//! first by the next hyper connection.

use std::error::Error as StdError;
use std::future::Future;
use std::mem;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::body::{Body, Incoming};
use hyper::server::conn::http1::{Builder, UpgradeableConnection};
use hyper::service::HttpService;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::idle::{ConnectionClock, MarkedStream};

/// One HTTP/1.1 connection, for as long as it is open.
pub(super) struct Http1Connection<S: HttpService<Incoming>> {
    turn: Turn<S>,
    /// The server's HTTP/1 settings, with this connection's clock as hyper's timer.
    builder: Builder,
    clock: ConnectionClock,
    /// Shutdown began: a request being served is finished, then the connection closes instead of resting; a
    /// resting one closes at once.
    draining: bool,
}

/// Who serves the connection now.
enum Turn<S: HttpService<Incoming>> {
    /// A hyper connection (boxed: a resting connection holds only the pointer).
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

impl<S, B> Http1Connection<S>
where
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    /// Serves `stream` (with `clock` watching it) with `service`, on hyper connections made by `builder`.
    pub(super) fn new(
        stream: MarkedStream<TcpStream>,
        service: S,
        mut builder: Builder,
        clock: ConnectionClock,
    ) -> Self {
        builder.timer(clock.clone());
        let mut connection = Self {
            turn: Turn::Ended,
            builder,
            clock,
            draining: false,
        };
        connection.serve(stream, service);
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

    /// A hyper connection's turn, with upgrades: a WebSocket handshake the upstream accepts hands the connection to
    /// its tunnel.
    fn serve(&mut self, stream: MarkedStream<TcpStream>, service: S) {
        let connection = self
            .builder
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        self.turn = Turn::Serving(Box::new(connection));
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
        let mut stream = parts.io.into_inner();
        if !parts.read_buf.is_empty() {
            // A pipelined request's first bytes: copied out of hyper's 8 KB buffer, which goes with it.
            stream.rewind(Bytes::copy_from_slice(&parts.read_buf));
            self.serve(stream, parts.service);
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

    /// Ends a rest: a new hyper connection serves the bytes that came.
    fn resume(&mut self) {
        if let Turn::Resting {
            stream, service, ..
        } = mem::replace(&mut self.turn, Turn::Ended)
        {
            self.clock.resume();
            self.serve(stream, service);
        }
    }
}

impl<S, B> Future for Http1Connection<S>
where
    S: HttpService<Incoming, ResBody = B> + Unpin,
    S::Error: Into<Box<dyn StdError + Send + Sync>>,
    B: Body + Send + 'static,
    B::Error: Into<Box<dyn StdError + Send + Sync>>,
{
    type Output = hyper::Result<()>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.turn {
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
                            return Poll::Ready(result);
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
                    // Readable: the next request's bytes (or the client's close, which hyper reads as such).
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
