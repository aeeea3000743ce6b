//! Sending a request on a pooled connection, and once more on a new one when a reused connection closed under it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use http::{Method, Request, Response, Uri};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use thiserror::Error;

use super::connect::{open_upgradable, Dialed};
use super::idle::Shared;
use super::lease::{Lease, PooledBody};
use crate::proxy::body::ClientBodyError;
use crate::proxy::tls::TlsDialer;

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
    ///
    /// Not an `async fn`, which would keep a second copy of the request in its future (see `Policy::serve`).
    #[allow(clippy::manual_async_fn)]
    pub fn send(
        &self,
        mut request: Request<Body>,
    ) -> impl Future<Output = Result<Response<Body>, SendError>> + Send + use<'_> {
        async move {
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
                let replay =
                    (suspect && replayable(&request)).then(|| Box::new(replay_copy(&request)));
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
    pub(super) fn idle_count(&self) -> usize {
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
