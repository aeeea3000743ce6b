//! Sending a request on a pooled connection, and once more on a new one when a reused connection closed under it.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
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

use super::connect::{open_upgradable, Connection, Dialed, Exchanged, Failed};
use super::idle::Shared;
use super::lease::{Lease, PooledBody};
use super::wire::WireError;
use crate::proxy::headers::HopFields;
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
    /// or it is a bodiless idempotent request whose new connection closed before any byte of an answer.
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
    /// The exchange failed: a write, or a connection closed before the answer's head or with a malformed one.
    #[error(transparent)]
    Wire(#[from] WireError),
    /// A WebSocket handshake's exchange failed (hyper's client carries those).
    #[error(transparent)]
    Http(hyper::Error),
    /// The client's request body failed while it was being sent (malformed framing, cut short): the client's
    /// fault, not the target's.
    #[error("request body: {0}")]
    ClientBody(#[source] axum::Error),
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
                health,
            }),
        }
    }

    /// Sends `request` (origin-form URI, `Host` set) on an idle connection, or a new one when none is idle, and
    /// waits for its answer's head until `deadline` (a new connection included).
    ///
    /// A request that a reused connection refused before any of it went out (the target closed it while it was
    /// idle) goes on the next connection. One that went out is sent again, once and on a new connection, only if the
    /// reused connection failed before any byte of an answer came back and sending it twice is harmless: an
    /// idempotent method (GET, HEAD, OPTIONS, PUT, DELETE, TRACE) without a body. A target that closes idle
    /// connections, or closes after each response without saying so, closes some just as a request is written on
    /// them. The exchange borrows the request rather than consuming it, so sending it again needs no copy.
    ///
    /// A request that fails is handed back ([`Unanswered::again`]) when the upstream may send it to another target:
    /// one never written (no connection, or one that closed first), and, with `retry_elsewhere`, a bodiless
    /// idempotent one whose new connection closed before any byte of an answer.
    ///
    /// Not an `async fn`, which would keep a second copy of the request in its future (see `Policy::serve`).
    #[allow(clippy::manual_async_fn)]
    pub fn send<'a>(
        &'a self,
        mut request: Request<Body>,
        hop: &'a HopFields,
        deadline: Instant,
    ) -> impl Future<Output = Sent> + Send + use<'a> {
        async move {
            let mut fresh = false;
            loop {
                let checked_out = if fresh { None } else { self.shared.checkout() };
                let (mut connection, reused) = match checked_out {
                    Some(connection) => (connection, true),
                    None => match timeout_at(deadline, self.shared.connect_out_of_line()).await {
                        Ok(Ok(connection)) => (connection, false),
                        Ok(Err(error)) => return Ok(Err(Unanswered::unsent(error, request))),
                        Err(_) => return Err(TimedOut),
                    },
                };
                let mut timer = take_head_timer(&mut connection.head_timer, deadline);
                let read_before = connection.read;
                let exchanged = before(
                    timer.as_mut(),
                    deadline,
                    connection.exchange(&mut request, hop),
                )
                .await;
                connection.head_timer = Some(timer);
                let failed = match exchanged {
                    None => return Err(TimedOut),
                    Some(Ok(exchanged)) => return Ok(Ok(self.leased(exchanged, connection))),
                    Some(Err(failed)) => failed,
                };
                let silent = connection.read == read_before;
                let Failed { error, committed } = failed;
                if error.is_client_body() {
                    return Ok(Err(Unanswered::written(error, None, None)));
                }
                match (committed, reused) {
                    // The target closed a reused connection while it was idle.
                    (false, true) => {}
                    (false, false) => return Ok(Err(Unanswered::unsent(error, request))),
                    (true, true) if silent && replayable(&request) => {
                        // A reused connection closed under the request: the target may have closed it while
                        // idle, which says nothing of its health.
                        tracing::debug!(
                            %error,
                            "reused upstream connection closed under a request, sending it again on a new one"
                        );
                        fresh = true;
                    }
                    (true, false) if silent => {
                        let again = (self.shared.settings.retry_elsewhere && replayable(&request))
                            .then(|| Box::new(request));
                        return Ok(Err(Unanswered::written(error, Some(Failure::Reset), again)));
                    }
                    _ => return Ok(Err(Unanswered::written(error, None, None))),
                }
            }
        }
    }

    /// The answer on `connection`, whose body hands the connection back when it ends.
    #[inline]
    fn leased(&self, exchanged: Exchanged, connection: Connection) -> Response<Body> {
        let Exchanged { head, uploaded } = exchanged;
        let body = PooledBody {
            decoder: head.body,
            lease: Some(Lease {
                connection,
                pool: self.shared.clone(),
            }),
            reusable: head.keep_alive && uploaded,
            read_timeout: self.shared.settings.read_timeout,
            silence: None,
            waiting: false,
        };
        let mut response = Response::new(Body::new(body));
        *response.status_mut() = head.status;
        *response.version_mut() = head.version;
        *response.headers_mut() = head.headers;
        response
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

    /// The buffer bytes its idle connections hold.
    #[cfg(test)]
    pub(super) fn idle_buffered(&self) -> usize {
        self.shared
            .lock_idle()
            .iter()
            .map(|idle| idle.buffered_capacity())
            .sum()
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
            SendError::Http(_) | SendError::Wire(_) => Some(Failure::Reset),
        };
        // A body that failed is the client's, and gone: nothing to send again.
        let again = failure.is_some().then(|| Box::new(request));
        Self {
            error,
            failure,
            again,
        }
    }

    /// The request was written (or failed as it was): `again` is the request when it may still go elsewhere.
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
        Self::Http(error)
    }
}

/// The connection's head timer (taken out while the exchange borrows the connection), ending at `deadline` or
/// earlier: one still running from an earlier request (at most its head timeout before this one's deadline) is
/// left as it is, since [`before`] sets it on when it ends early. Moving a timer per request cost a visible share
/// of a proxied request's instructions; this moves it about once per head timeout.
fn take_head_timer(timer: &mut Option<Pin<Box<Sleep>>>, deadline: Instant) -> Pin<Box<Sleep>> {
    match timer.take() {
        Some(mut timer) => {
            if timer.is_elapsed() || timer.deadline() > deadline {
                timer.as_mut().reset(deadline);
            }
            timer
        }
        None => Box::pin(tokio::time::sleep_until(deadline)),
    }
}

/// The output of `future`, or `None` when `deadline` passes first. `timer` ends at `deadline` or earlier (see
/// [`take_head_timer`]): ending earlier, it is set on to `deadline`.
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
