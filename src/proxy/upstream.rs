//! One upstream: its targets (round robin, skipping those that failed), each with its connection pool and health,
//! and the forwarding of one request, tried again on another target where that is harmless.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::uri::{PathAndQuery, Uri};
use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use thiserror::Error;

use super::headers::{self, ForwardedFacts, HopFields};
use super::health::{Failure, HealthView, TargetHealth};
use super::pool::{ConnectionPool, PoolSettings, SendError, Sent};
use super::settings::UpstreamSettings;
use super::upgrade;

/// Idle keep-alive connections kept per target, and how long each is kept unused.
const MAX_IDLE: usize = 1024;
const IDLE_KEPT: Duration = Duration::from_secs(60);

/// A named upstream with a connection pool per target.
#[derive(Debug)]
pub struct Upstream {
    name: String,
    targets: Vec<Target>,
    next: AtomicUsize,
    /// The wait for a response head: the smaller of `timeout` and `idle_timeout`.
    head_timeout: Duration,
    /// Tries in all for one request, each on another target: `retry.attempts`, at most one per target.
    attempts: usize,
    /// `false`: every request gets its target's `host` as `Host`.
    pass_host_header: bool,
}

#[derive(Debug)]
struct Target {
    /// The target's authority: the `Host` of a request that arrived without one, or of every request when the
    /// upstream does not pass the client's on.
    host: HeaderValue,
    /// Path prefix of the target URL without trailing slash, e.g. `/base` for `http://host/base/`.
    base_path: String,
    pool: ConnectionPool,
}

/// What aims a request at one target or another: its normalised path, and whether its `Host` is the target's.
struct Aim<'a> {
    path: &'a str,
    host_from_target: bool,
}

/// Why a request could not be forwarded.
#[derive(Debug, Error)]
pub enum ProxyError {
    /// No connection could be made, or it broke before a response head arrived.
    #[error("upstream {upstream} unreachable: {source}")]
    Unreachable {
        /// The upstream's name.
        upstream: String,
        /// The client error.
        #[source]
        source: SendError,
    },
    /// No response head within the upstream's timeout.
    #[error("upstream {upstream} did not answer within {timeout:?}")]
    Timeout {
        /// The upstream's name.
        upstream: String,
        /// Its timeout.
        timeout: Duration,
    },
    /// The request could not be turned into an upstream request.
    #[error("cannot build the upstream request: {0}")]
    BadRequest(#[from] http::Error),
    /// The client's body failed while it was streamed upstream (malformed chunked framing, cut short): a 400, not
    /// an upstream failure.
    #[error("bad request body: {0}")]
    ClientBody(#[source] axum::Error),
}

// === impl Upstream ===

impl Upstream {
    /// Builds the upstream and its pools from validated settings.
    pub fn new(settings: &UpstreamSettings) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(settings.connect_timeout));
        // The TLS of `https` targets is the pool's, over the connector's TCP connection.
        connector.enforce_http(false);
        let attempts = settings
            .attempts
            .map_or(settings.targets.len(), |n| n.get() as usize)
            .clamp(1, settings.targets.len().max(1));
        let pool = PoolSettings {
            max_idle: MAX_IDLE,
            idle_timeout: IDLE_KEPT,
            read_timeout: settings.idle_timeout,
            retry_elsewhere: attempts > 1,
        };
        let targets = settings
            .targets
            .iter()
            .map(|uri| {
                let authority = uri.authority().map_or("127.0.0.1", |a| a.as_str());
                // Validation made sure every https target has one; the pool refuses an https target without.
                let tls = match (uri.scheme_str(), &settings.tls) {
                    (Some("https"), Some(tls)) => tls.dialer(uri.host().unwrap_or_default()).ok(),
                    _ => None,
                };
                let address = Uri::builder()
                    .scheme(uri.scheme_str().unwrap_or("http"))
                    .authority(authority)
                    .path_and_query("/")
                    .build()
                    .unwrap_or_default();
                // Named as written, without the `/` a bare authority gets as its path.
                let name = format!(
                    "{}://{authority}{}",
                    uri.scheme_str().unwrap_or("http"),
                    uri.path().trim_end_matches('/')
                );
                let health = TargetHealth::new(settings.health, &settings.name, &name);
                Target {
                    host: HeaderValue::from_str(authority)
                        .unwrap_or_else(|_| HeaderValue::from_static("127.0.0.1")),
                    base_path: uri.path().trim_end_matches('/').to_owned(),
                    pool: ConnectionPool::new(
                        address,
                        connector.clone(),
                        tls,
                        settings.connect_timeout,
                        pool,
                        health,
                    ),
                }
            })
            .collect();
        Self {
            name: settings.name.clone(),
            targets,
            next: AtomicUsize::new(0),
            head_timeout: settings.timeout.min(settings.idle_timeout),
            attempts,
            pass_host_header: settings.pass_host_header,
        }
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Each target's name (its URL) and where it stands now, in the config's order.
    pub(crate) fn health(&self) -> Vec<(&str, HealthView)> {
        let now = Instant::now();
        self.targets
            .iter()
            .map(|target| {
                (
                    target.pool.health().target(),
                    target.pool.health().view(now),
                )
            })
            .collect()
    }

    /// Forwards `request` (whose path is already normalised into `path`) to the next target that is up (round
    /// robin), and on to others as `retry.attempts` allows when it could not be sent or, for an idempotent bodiless
    /// request, when a new connection closed before any byte of an answer.
    ///
    /// Only the configured target is ever contacted: the scheme and authority of the request target are ignored,
    /// so an absolute-form request (`GET http://elsewhere/`) cannot turn the gateway into an open proxy.
    ///
    /// Not an `async fn`, which would keep a second copy of the request in its future (see `Policy::serve`).
    #[allow(clippy::manual_async_fn)]
    pub fn forward<'a>(
        &'a self,
        mut request: Request<Body>,
        path: &'a str,
        facts: &'a ForwardedFacts<'a>,
        sent_at: tokio::time::Instant,
    ) -> impl Future<Output = Result<Response<Body>, ProxyError>> + Send + use<'a> {
        async move {
            let index = self.first_target();
            let target = &self.targets[index];
            note_target(&request, target);
            // Read before the hop-by-hop fields go: `Upgrade` is one of them.
            let websocket = upgrade::websocket_upgrade(&request);

            let mut host_from_target = !self.pass_host_header;
            // The request's `Host` field was read with the rest of its canonical reading (`facts.host_field`).
            if self.pass_host_header && facts.host_field.is_none() {
                // HTTP/2 clients send the host as :authority; HTTP/1.1 upstreams need it as Host.
                match facts.host.and_then(|h| HeaderValue::from_str(h).ok()) {
                    Some(host) => drop(request.headers_mut().insert(header::HOST, host)),
                    None => host_from_target = true,
                }
            }
            let aim = Aim {
                path,
                host_from_target,
            };
            target.aim(&mut request, &aim)?;
            // Tollgate's own fields about the hop go into the head as it is written, not into the map.
            let hop = headers::prepare_request_fields(request.headers_mut(), facts);
            *request.version_mut() = http::Version::HTTP_11;
            if let Some(protocol) = websocket {
                hop.insert_into(request.headers_mut());
                return self.forward_upgrade(target, request, protocol).await;
            }

            // The caller's reading of the clock as it handed the request over: the same instant, read once.
            let deadline = sent_at + self.head_timeout;
            let sent = target.pool.send(request, &hop, deadline).await;
            match sent {
                Ok(Ok(response)) => {
                    target.pool.health().succeeded();
                    Ok(answer(response))
                }
                failed => self.retry(index, failed, aim, &hop).await,
            }
        }
    }

    /// The index of the request's first target: the next in turn, or when that one is skipped the next one
    /// available after it (none: the next in turn, tried anyway). While every target is up: an atomic increment
    /// and one atomic load.
    #[inline]
    fn first_target(&self) -> usize {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.targets.len();
        if self.targets[index].pool.health().is_up() {
            return index;
        }
        self.next_available(index, &[]).unwrap_or(index)
    }

    /// The first target from `from` on (in turn) that is available now and not in `tried`; `None` when none is.
    #[cold]
    #[inline(never)]
    fn next_available(&self, from: usize, tried: &[usize]) -> Option<usize> {
        let now = Instant::now();
        self.in_turn(from, tried)
            .find(|&index| self.targets[index].pool.health().is_available(now))
    }

    /// The targets from `from` on, in turn, without those in `tried`.
    fn in_turn<'a>(&self, from: usize, tried: &'a [usize]) -> impl Iterator<Item = usize> + 'a {
        let count = self.targets.len();
        (0..count)
            .map(move |step| (from + step) % count)
            .filter(move |index| !tried.contains(index))
    }

    /// After the try on target `first` came to `outcome`: a failure counted against its target, and the request
    /// sent to another target while `retry.attempts` and the failure allow (one available first; none available:
    /// any not tried yet). Out of line and boxed: failures are rare, and the request path's future should not hold
    /// room for them.
    #[cold]
    #[inline(never)]
    fn retry<'a>(
        &'a self,
        first: usize,
        mut outcome: Sent,
        aim: Aim<'a>,
        hop: &'a HopFields,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Body>, ProxyError>> + Send + 'a>> {
        Box::pin(async move {
            let mut tried = vec![first];
            loop {
                let current = tried[tried.len() - 1];
                let health = self.targets[current].pool.health();
                let (mut request, error) = match outcome {
                    Ok(Ok(response)) => {
                        health.succeeded();
                        return Ok(answer(response));
                    }
                    Err(_) => {
                        // Sent, and no answer in time: never sent again.
                        health.failed(Failure::Timeout, Instant::now());
                        return Err(self.timed_out());
                    }
                    Ok(Err(unanswered)) => {
                        if let Some(failure) = unanswered.failure {
                            health.failed(failure, Instant::now());
                        }
                        match unanswered.again {
                            Some(request) if tried.len() < self.attempts => {
                                (request, unanswered.error)
                            }
                            _ => return Err(self.unanswered(unanswered.error)),
                        }
                    }
                };
                let next = self
                    .next_available(current + 1, &tried)
                    .or_else(|| self.in_turn(current + 1, &tried).next());
                let Some(next) = next else {
                    return Err(self.unanswered(error));
                };
                tracing::debug!(upstream = %self.name, %error, "upstream target failed, trying another");
                let target = &self.targets[next];
                note_target(&request, target);
                target.aim(&mut request, &aim)?;
                tried.push(next);
                let deadline = tokio::time::Instant::now() + self.head_timeout;
                outcome = target.pool.send(*request, hop, deadline).await;
            }
        })
    }

    /// Forwards a WebSocket handshake on a connection of its own. When the upstream switches protocols (`101`), the
    /// response goes back with its `Upgrade` and the two connections are spliced by a task of their own; any other
    /// answer is proxied as usual and the connection closes with it. Boxed and out of line: upgrades are rare, and
    /// the request path's frame should not hold room for them.
    #[inline(never)]
    #[cold]
    fn forward_upgrade<'a>(
        &'a self,
        target: &'a Target,
        mut request: Request<Body>,
        protocol: HeaderValue,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Body>, ProxyError>> + Send + 'a>> {
        Box::pin(async move {
            let client_side = hyper::upgrade::on(&mut request);
            let hold = request.extensions_mut().remove::<upgrade::TunnelHold>();
            upgrade::keep_upgrade_fields(request.headers_mut(), protocol.clone());
            let sent =
                tokio::time::timeout(self.head_timeout, target.pool.send_upgrade(request)).await;
            let mut response = match sent {
                Err(_) => return Err(self.timed_out()),
                Ok(Err(error)) => {
                    // No connection is the target's failure here too; a handshake is never sent twice.
                    if matches!(error, SendError::Connect(_) | SendError::Tls(_)) {
                        target
                            .pool
                            .health()
                            .failed(Failure::Connect, Instant::now());
                    }
                    return Err(self.unanswered(error));
                }
                Ok(Ok(response)) => response,
            };
            let switched = (response.status() == StatusCode::SWITCHING_PROTOCOLS)
                .then(|| hyper::upgrade::on(&mut response));
            let (mut parts, body) = response.into_parts();
            let accepted = parts.headers.get(header::UPGRADE).cloned();
            headers::prepare_response(&mut parts.headers, parts.version);
            if let Some(upstream_side) = switched {
                upgrade::keep_upgrade_fields(&mut parts.headers, accepted.unwrap_or(protocol));
                // Admission's work for after the answer (a concurrency slot) waits for the tunnel to close.
                let (open, closed) = crate::tunnel::tunnel();
                parts.extensions.insert(closed);
                tokio::spawn(upgrade::splice(
                    client_side,
                    upstream_side,
                    self.name.clone(),
                    (hold, open),
                ));
            }
            Ok(Response::from_parts(parts, Body::new(body)))
        })
    }

    fn timed_out(&self) -> ProxyError {
        ProxyError::Timeout {
            upstream: self.name.clone(),
            timeout: self.head_timeout,
        }
    }

    fn unanswered(&self, error: SendError) -> ProxyError {
        match error {
            SendError::ClientBody(source) => ProxyError::ClientBody(source),
            source => ProxyError::Unreachable {
                upstream: self.name.clone(),
                source,
            },
        }
    }
}

// === impl Target ===

impl Target {
    /// Points `request` at this target: its path (under the target's base path) and, where the target gives it,
    /// its `Host`. Run again for each target a request is tried on.
    #[inline]
    fn aim(&self, request: &mut Request<Body>, aim: &Aim<'_>) -> Result<(), http::Error> {
        if let Some(uri) = upstream_uri(request.uri(), &self.base_path, aim.path)? {
            *request.uri_mut() = uri;
        }
        if aim.host_from_target {
            request
                .headers_mut()
                .insert(header::HOST, self.host.clone());
        }
        Ok(())
    }
}

/// Notes on the request's trail (for its access log line) the target it is sent to.
fn note_target(request: &Request<Body>, target: &Target) {
    if let Some(trail) = crate::trail::Trail::of(request) {
        trail.note_upstream(&target.host);
    }
}

/// The response to send on: streamed through, never buffered whole.
#[inline]
fn answer(response: Response<Body>) -> Response<Body> {
    let (mut parts, body) = response.into_parts();
    headers::prepare_response(&mut parts.headers, parts.version);
    // A proxy answers in its own version (RFC 9110 §6.2); the upstream's is told by `Via`. Left as 1.0, it would be
    // the status line an HTTP/1.1 client reads.
    parts.version = http::Version::HTTP_11;
    Response::from_parts(parts, body)
}

/// The origin-form target to send upstream for a request whose normalised path is `path`, or `None` when the
/// request's own target is already it (origin form, path unchanged, no base path): the usual case, which then costs
/// no copy and no second parse. Only the path and query are ever sent: the target's address is the connection's,
/// not the request line's.
fn upstream_uri(original: &Uri, base_path: &str, path: &str) -> Result<Option<Uri>, http::Error> {
    let origin_form = original.scheme().is_none() && original.authority().is_none();
    if base_path.is_empty() && original.path() == path {
        if origin_form {
            return Ok(None);
        }
        if let Some(path_and_query) = original.path_and_query() {
            return Ok(Some(Uri::from(path_and_query.clone())));
        }
    }
    let mut path_and_query = String::with_capacity(base_path.len() + path.len() + 32);
    path_and_query.push_str(base_path);
    path_and_query.push_str(path);
    if let Some(query) = original.query() {
        path_and_query.push('?');
        path_and_query.push_str(query);
    }
    Ok(Some(Uri::from(PathAndQuery::try_from(path_and_query)?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(original: &str, base_path: &str, path: &str) -> String {
        let original: Uri = original.parse().expect("uri");
        match upstream_uri(&original, base_path, path).expect("valid") {
            Some(uri) => uri.to_string(),
            None => original.to_string(),
        }
    }

    #[test]
    fn only_the_path_and_query_go_upstream() {
        assert_eq!(sent("/a/b?x=1", "", "/a/b"), "/a/b?x=1");
        assert_eq!(sent("/a/./b?x=1", "", "/a/b"), "/a/b?x=1");
        assert_eq!(sent("/a/b?x=1", "/base", "/a/b"), "/base/a/b?x=1");
        assert_eq!(sent("http://elsewhere.test/a?x=1", "", "/a"), "/a?x=1");
        assert_eq!(sent("http://elsewhere.test", "", "/"), "/");
        assert_eq!(sent("http://elsewhere.test/%2e%2e/a", "/v2", "/a"), "/v2/a");
    }
}
