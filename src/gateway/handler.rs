//! The request path: route, key, limiter, then the route's action or a refusal.

use std::net::SocketAddr;
use std::sync::Arc;

use arc_swap::ArcSwap;
use axum::body::Body;
use http::{header, Request, Response};

use super::responses;
use super::runtime::{Action, Route, Runtime};
use crate::config::Config;
use crate::key::RequestFacts;
use crate::limiter::RateLimiter;
use crate::proxy::{ForwardedFacts, ProxyError};
use crate::routing::{normalize_path, RequestTarget};

/// The gateway: a compiled config (replaced atomically on reload) and the limiter (kept across reloads, so
/// counters survive them).
#[derive(Debug)]
pub struct Gateway {
    runtime: ArcSwap<Runtime>,
    limiter: Arc<RateLimiter>,
}

// === impl Gateway ===

impl Gateway {
    /// A gateway running `config` with `limiter`.
    pub fn new(config: &Config, limiter: Arc<RateLimiter>) -> Self {
        Self {
            runtime: ArcSwap::from_pointee(Runtime::new(config)),
            limiter,
        }
    }

    /// Replaces the running config; requests in flight finish with the old one.
    pub fn reload(&self, config: &Config) {
        self.runtime.store(Arc::new(Runtime::new(config)));
    }

    /// The limiter.
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.limiter
    }

    /// Answers one request from `peer`.
    pub async fn handle(&self, request: Request<Body>, peer: SocketAddr) -> Response<Body> {
        let runtime = self.runtime.load_full();
        let Some(path) = normalize_path(request.uri().path()).map(|p| p.into_owned()) else {
            return responses::bad_target();
        };
        let host = request_host(&request);
        let target = RequestTarget {
            method: request.method(),
            host: host.as_deref(),
            path: &path,
        };
        let Some(route) = runtime.route_for(&target) else {
            return responses::no_route(&path);
        };

        let client_ip = runtime.client_ip.resolve(peer.ip(), request.headers());
        let facts = RequestFacts {
            client_ip,
            route: &route.name,
            method: request.method(),
            path: &path,
            host: host.as_deref(),
            headers: request.headers(),
            query: request.uri().query(),
        };
        let verdict = match route.limits.check(&self.limiter, &facts).await {
            Ok(verdict) => verdict,
            Err(unavailable) => return route.limits.unavailable(&unavailable),
        };
        let outcome = &verdict.outcome;
        if !outcome.allowed {
            return route.limits.refusal(&verdict);
        }
        // `leaky_bucket` in delay mode: admitted, but only once the request conforms to the rate.
        let delay_ms = outcome.delay_ms();
        if delay_ms > 0 {
            tokio::time::sleep(std::time::Duration::from_millis(delay_ms)).await;
        }
        let mut response = match &route.action {
            Action::Respond(direct) => {
                let mut response = Response::new(Body::from(direct.body.clone()));
                *response.status_mut() = direct.status;
                for (name, value) in &direct.headers {
                    response.headers_mut().append(name.clone(), value.clone());
                }
                response
            }
            Action::Upstream(upstream) => {
                let forwarded = ForwardedFacts {
                    peer: peer.ip(),
                    peer_trusted: runtime.client_ip.is_trusted(peer.ip()),
                    host: host.as_deref(),
                    version: request.version(),
                };
                match upstream.forward(request, &path, &forwarded).await {
                    Ok(response) => response,
                    Err(error) => return proxy_failure(route, &error),
                }
            }
        };
        if route.headers {
            route.limits.decorate(response.headers_mut(), &verdict);
        }
        response
    }
}

/// The host the client asked for, lower-cased and without port: the request target's authority (absolute form,
/// HTTP/2) or else the `Host` header.
fn request_host(request: &Request<Body>) -> Option<String> {
    let raw = match request.uri().authority() {
        Some(authority) => authority.host().to_owned(),
        None => {
            let value = request.headers().get(header::HOST)?.to_str().ok()?;
            let authority: http::uri::Authority = value.parse().ok()?;
            authority.host().to_owned()
        }
    };
    Some(raw.to_ascii_lowercase())
}

fn proxy_failure(route: &Route, error: &ProxyError) -> Response<Body> {
    tracing::warn!(route = %route.name, %error, "upstream failed");
    match error {
        ProxyError::Timeout { .. } => responses::gateway_timeout(&route.name),
        ProxyError::Unreachable { .. } | ProxyError::BadRequest(_) => {
            responses::bad_gateway(&route.name)
        }
    }
}
