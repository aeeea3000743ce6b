//! Sending a request on a pooled connection, and once more on a new one when a reused connection closed under it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use http::{Method, Request, Response, Uri};
use http_body::Body as _;
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;
use thiserror::Error;
use tokio::time::{timeout_at, Instant, Sleep};

use super::connect::{open_upgradable, Connection, Dialed};
use super::idle::Shared;
use super::lease::{Lease, PooledBody};
use crate::proxy::body::ClientBodyError;
use crate::proxy::health::{Failure, TargetHealth};
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

/// How many idle connections a pool keeps and for how long, how long an answer may be silent, and whether a
/// request may go to another target.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// Idle connections kept; beyond it the longest idle is closed.
    pub max_idle: usize,
    /// An idle connection is closed after this long unused.
    pub idle_timeout: Duration,
    /// The longest silence between an answer's bytes (the upstream's `idle_timeout`).
    pub read_timeout: Duration,
    /// Whether a request a new connection failed under may go to another target: a bodiless idempotent request is
    /// then copied before it is sent on a new connection (never on a reused one, the request path's usual case).
    pub retry_elsewhere: bool,
}

/// A request the target did not answer: why, whether the target is to blame, and the request itself when it may
/// go to another target.
#[derive(Debug)]
pub struct Unanswered {
    pub error: SendError,
    /// The target failed (no connection, or one that closed before any byte of an answer); `None` when the client's
    /// body failed, or the target had begun an answer.
    pub failure: Option<Failure>,
    /// The request, when sending it elsewhere is harmless: it was never written (any method, its body untouched),
    /// or it is a copy of a bodiless idempotent request whose new connection closed before any byte of an answer.
    /// Boxed: only failures carry one.
    pub again: Option<Box<Request<Body>>>,
}

/// What one try came to: an answer, no answer, or no answer by its deadline.
pub type Sent = Result<Result<Response<Body>, Unanswered>, TimedOut>;

/// No response head by the deadline: the request may have been written, and is never sent again.
#[derive(Debug)]
pub struct TimedOut;

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
        health: TargetHealth,
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
                health,
            }),
        }
    }

    /// Sends `request` (origin-form URI, `Host` set) on an idle connection, or a new one when none is idle, and
    /// waits for its answer's head until `deadline` (a new connection included).
    ///
    /// A request that a reused connection refused before writing a byte (the target closed it while it was idle)
    /// goes on the next connection. One that was written is sent again, once and on a new connection, only if the
    /// reused connection failed before any byte of an answer came back and sending it twice is harmless: an
    /// idempotent method (GET, HEAD, OPTIONS, PUT, DELETE, TRACE) without a body. A target that closes idle connections,
    /// or closes after each response without saying so, closes some just as a request is written on them.
    ///
    /// Sending again needs a copy of the request made before it is sent, a visible share of a proxied request's
    /// cost (BENCHMARKS.md), so a copy is made only where a close is possible: on a connection's first reuse
    /// (a target closing after every response), after 100 ms idle (a target's idle timeout), and on every reuse
    /// once a target has closed a reused connection under a request. A busy pool to a well-behaved target makes
    /// none.
    ///
    /// A request that fails is handed back ([`Unanswered::again`]) when the upstream may send it to another target:
    /// one never written (no connection, or one that closed first), and, with `retry_elsewhere`, a bodiless
    /// idempotent one whose new connection closed before any byte of an answer.
    ///
    /// Not an `async fn`, which would keep a second copy of the request in its future (see `Policy::serve`).
    #[allow(clippy::manual_async_fn)]
    pub fn send(
        &self,
        mut request: Request<Body>,
        deadline: Instant,
    ) -> impl Future<Output = Sent> + Send + use<'_> {
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
                    None => match timeout_at(deadline, self.shared.connect_out_of_line()).await {
                        Ok(Ok(connection)) => (connection, false, false),
                        Ok(Err(error)) => return Ok(Err(Unanswered::unsent(error, request))),
                        Err(_) => return Err(TimedOut),
                    },
                };
                let mut timer = head_timer(&mut connection.head_timer, deadline);
                // A connection handed back as its response ended may still be finishing that exchange.
                match before(timer.as_mut(), deadline, connection.sender.ready()).await {
                    Some(Ok(())) => {}
                    Some(Err(_)) if reused => continue,
                    Some(Err(error)) => return Ok(Err(Unanswered::unsent(error.into(), request))),
                    None => return Err(TimedOut),
                }
                // Boxed: held across the send, unboxed it would add a whole request to the future of every request
                // (and to the bytes copied each time that future moves), for a copy made on few of them.
                let copy = suspect || (!reused && self.shared.settings.retry_elsewhere);
                let replay =
                    (copy && replayable(&request)).then(|| Box::new(replay_copy(&request)));
                let read_before = connection.read.load(Ordering::Relaxed);
                let sending = connection.sender.try_send_request(request);
                let Some(sent) = before(timer, deadline, sending).await else {
                    return Err(TimedOut);
                };
                match sent {
                    Ok(response) => return Ok(Ok(self.leased(response, connection))),
                    Err(mut failed) => {
                        let unsent = failed.take_message();
                        let silent = connection.read.load(Ordering::Relaxed) == read_before;
                        let error = SendError::from(failed.into_error());
                        match (unsent, reused) {
                            (Some(unsent), true) => request = unsent,
                            (Some(unsent), false) => {
                                return Ok(Err(Unanswered::unsent(error, unsent)))
                            }
                            (None, true) if silent && !error.is_client_body() => {
                                self.shared
                                    .closes_unannounced
                                    .store(true, Ordering::Relaxed);
                                // A reused connection closed under the request: the target may have closed it while
                                // idle, which says nothing of its health.
                                let Some(copy) = replay else {
                                    return Ok(Err(Unanswered::written(error, None, None)));
                                };
                                tracing::debug!(
                                    %error,
                                    "reused upstream connection closed under a request, sending it again on a new one"
                                );
                                request = *copy;
                                fresh = true;
                            }
                            (None, false) if silent && !error.is_client_body() => {
                                return Ok(Err(Unanswered::written(
                                    error,
                                    Some(Failure::Reset),
                                    replay,
                                )))
                            }
                            _ => return Ok(Err(Unanswered::written(error, None, None))),
                        }
                    }
                }
            }
        }
    }

    /// The response of `connection`, whose body hands the connection back when it ends.
    #[inline]
    fn leased(&self, response: Response<Incoming>, connection: Connection) -> Response<Body> {
        let pool = self.shared.clone();
        let read_timeout = self.shared.settings.read_timeout;
        response.map(|body| {
            Body::new(PooledBody {
                body,
                lease: Some(Lease { connection, pool }),
                read_timeout,
                silence: None,
                waiting: false,
            })
        })
    }

    /// The target's passive health.
    pub(crate) fn health(&self) -> &TargetHealth {
        &self.shared.health
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

// === impl Unanswered ===

impl Unanswered {
    /// `request` was never written: it may go anywhere. No connection, or one that closed first, is the target's
    /// failure.
    #[cold]
    fn unsent(error: SendError, request: Request<Body>) -> Self {
        let failure = match error {
            SendError::ClientBody(_) => None,
            SendError::Connect(_) | SendError::Tls(_) => Some(Failure::Connect),
            SendError::Http(_) => Some(Failure::Reset),
        };
        // A body that failed is the client's, and gone: nothing to send again.
        let again = failure.is_some().then(|| Box::new(request));
        Self {
            error,
            failure,
            again,
        }
    }

    /// The request was written (or failed as it was): `again` is a copy made beforehand, if any.
    #[cold]
    fn written(
        error: SendError,
        failure: Option<Failure>,
        again: Option<Box<Request<Body>>>,
    ) -> Self {
        Self {
            error,
            failure,
            again,
        }
    }
}

// === impl SendError ===

impl SendError {
    fn is_client_body(&self) -> bool {
        matches!(self, SendError::ClientBody(_))
    }
}

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

/// The connection's head timer, ending at `deadline` or earlier: one still running from an earlier request (at
/// most its head timeout before this one's deadline) is left as it is, since [`before`] sets it on when it ends
/// early. Moving a timer per request cost a visible share of a proxied request's instructions; this moves it about
/// once per head timeout.
fn head_timer(timer: &mut Option<Pin<Box<Sleep>>>, deadline: Instant) -> Pin<&mut Sleep> {
    match timer {
        Some(timer) => {
            if timer.is_elapsed() || timer.deadline() > deadline {
                timer.as_mut().reset(deadline);
            }
            timer.as_mut()
        }
        slot @ None => slot
            .insert(Box::pin(tokio::time::sleep_until(deadline)))
            .as_mut(),
    }
}

/// The output of `future`, or `None` when `deadline` passes first. `timer` ends at `deadline` or earlier (see
/// [`head_timer`]): ending earlier, it is set on to `deadline`.
async fn before<F: Future>(
    mut timer: Pin<&mut Sleep>,
    deadline: Instant,
    future: F,
) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    std::future::poll_fn(|cx| {
        if let Poll::Ready(output) = future.as_mut().poll(cx) {
            return Poll::Ready(Some(output));
        }
        while timer.as_mut().poll(cx).is_ready() {
            if timer.deadline() >= deadline {
                return Poll::Ready(None);
            }
            timer.as_mut().reset(deadline);
        }
        Poll::Pending
    })
    .await
}

/// Whether a request may be sent a second time after a reused connection failed under it: an idempotent method
/// (RFC 9110 §9.2.2) and no body byte to send, so none was sent and none is lost.
fn replayable(request: &Request<Body>) -> bool {
    let method = request.method();
    (method == Method::GET
        || method == Method::HEAD
        || method == Method::OPTIONS
        || method == Method::PUT
        || method == Method::DELETE
        || method == Method::TRACE)
        && request.body().is_end_stream()
}

/// A copy of a bodiless request to send again (without its extensions, which the client does not send, but its
/// trail, where the access log reads which target answered).
fn replay_copy(request: &Request<Body>) -> Request<Body> {
    let mut copy = Request::new(Body::empty());
    if let Some(trail) = crate::trail::Trail::of(request) {
        copy.extensions_mut().insert(trail.clone());
    }
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.version_mut() = request.version();
    *copy.headers_mut() = request.headers().clone();
    copy
}
