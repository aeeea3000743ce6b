//! One upstream: its targets (round robin), each with its connection pool, and the forwarding of one request.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::Body;
use http::uri::{PathAndQuery, Uri};
use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use thiserror::Error;

use super::headers::{self, ForwardedFacts};
use super::pool::{ConnectionPool, PoolSettings, SendError};
use super::settings::UpstreamSettings;
use super::upgrade;

/// Idle keep-alive connections kept per target, and how long each is kept unused.
const POOL: PoolSettings = PoolSettings {
    max_idle: 1024,
    idle_timeout: Duration::from_secs(60),
};

/// A named upstream with a connection pool per target.
#[derive(Debug)]
pub struct Upstream {
    name: String,
    targets: Vec<Target>,
    next: AtomicUsize,
    timeout: Duration,
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
    ClientBody(#[source] hyper::Error),
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
                Target {
                    host: HeaderValue::from_str(authority)
                        .unwrap_or_else(|_| HeaderValue::from_static("127.0.0.1")),
                    base_path: uri.path().trim_end_matches('/').to_owned(),
                    pool: ConnectionPool::new(
                        address,
                        connector.clone(),
                        tls,
                        settings.connect_timeout,
                        POOL,
                    ),
                }
            })
            .collect();
        Self {
            name: settings.name.clone(),
            targets,
            next: AtomicUsize::new(0),
            timeout: settings.timeout,
            pass_host_header: settings.pass_host_header,
        }
    }

    /// The upstream's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Forwards `request` (whose path is already normalised into `path`) to the next target.
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
    ) -> impl Future<Output = Result<Response<Body>, ProxyError>> + Send + use<'a> {
        async move {
            let target =
                &self.targets[self.next.fetch_add(1, Ordering::Relaxed) % self.targets.len()];
            if let Some(trail) = crate::trail::Trail::of(&request) {
                trail.note_upstream(&target.host);
            }
            let uri = upstream_uri(request.uri(), &target.base_path, path)?;
            // Read before the hop-by-hop fields go: `Upgrade` is one of them.
            let websocket = upgrade::websocket_upgrade(&request);

            if !self.pass_host_header {
                request
                    .headers_mut()
                    .insert(header::HOST, target.host.clone());
            } else if !request.headers().contains_key(header::HOST) {
                // HTTP/2 clients send the host as :authority; HTTP/1.1 upstreams need it as Host.
                let host = facts
                    .host
                    .and_then(|h| HeaderValue::from_str(h).ok())
                    .unwrap_or_else(|| target.host.clone());
                request.headers_mut().insert(header::HOST, host);
            }
            headers::prepare_request(request.headers_mut(), facts);
            if let Some(uri) = uri {
                *request.uri_mut() = uri;
            }
            *request.version_mut() = http::Version::HTTP_11;
            if let Some(protocol) = websocket {
                return self.forward_upgrade(target, request, protocol).await;
            }

            let response =
                self.answered(tokio::time::timeout(self.timeout, target.pool.send(request)).await)?;
            // Streamed through, never buffered whole.
            let (mut parts, body) = response.into_parts();
            headers::prepare_response(&mut parts.headers, parts.version);
            // A proxy answers in its own version (RFC 9110 §6.2); the upstream's is told by `Via`. Left as 1.0, it
            // would be the status line an HTTP/1.1 client reads.
            parts.version = http::Version::HTTP_11;
            Ok(Response::from_parts(parts, body))
        }
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
            let sent = tokio::time::timeout(self.timeout, target.pool.send_upgrade(request)).await;
            let mut response = self.answered(sent)?;
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

    /// The response head, or why none came within the upstream's timeout. A plain function of the outcome rather
    /// than an async one taking the send future: that would move the whole future once more per request.
    fn answered<B>(
        &self,
        outcome: Result<Result<Response<B>, SendError>, tokio::time::error::Elapsed>,
    ) -> Result<Response<B>, ProxyError> {
        match outcome {
            Err(_) => Err(ProxyError::Timeout {
                upstream: self.name.clone(),
                timeout: self.timeout,
            }),
            Ok(Err(SendError::ClientBody(source))) => Err(ProxyError::ClientBody(source)),
            Ok(Err(source)) => Err(ProxyError::Unreachable {
                upstream: self.name.clone(),
                source,
            }),
            Ok(Ok(response)) => Ok(response),
        }
    }
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
