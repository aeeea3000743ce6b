//! The [`Service`] a [`RateLimitLayer`] wraps around its inner service: check, then refuse, hold or forward.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::BoxError;
use bytes::Bytes;
use http::{Request, Response};
use tower::{Service, ServiceExt};

use super::future::ResponseFuture;
use super::rate_limit::{RateLimitLayer, Shared};
use crate::admission::{answer, set_request_id, Arrival, NoReservation, X_REQUEST_ID};
use crate::routing::CanonicalRequest;

/// The client address assumed when a request carries no `ConnectInfo<SocketAddr>` (see the module docs).
const UNKNOWN_PEER: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

/// A service limited by a [`RateLimitLayer`]; see the [module docs](super).
#[derive(Debug, Clone)]
pub struct RateLimit<S> {
    inner: S,
    shared: Arc<Shared>,
}

// === impl RateLimit ===

impl<S> RateLimit<S> {
    /// `inner`, limited by `layer` (what [`tower::Layer::layer`] does).
    pub fn new(inner: S, layer: &RateLimitLayer) -> Self {
        Self {
            inner,
            shared: layer.shared.clone(),
        }
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Send + 'static,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    /// Always ready. Waiting here for the inner service would make denied requests, which never reach it, wait
    /// too; the inner service's readiness is awaited for admitted requests only, once admitted.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = self.shared.clone();
        // The clone goes with the request, as with tower's `Oneshot`: it is made ready and called only if the
        // request is admitted.
        let inner = self.inner.clone();
        ResponseFuture::new(admit(shared, inner, request))
    }
}

/// Asks the limiter about `request`; answers the refusal, or holds the request as long as a `leaky_bucket` in
/// delay mode says and passes it to `inner`.
async fn admit<S, ReqBody, ResBody>(
    shared: Arc<Shared>,
    inner: S,
    request: Request<ReqBody>,
) -> Result<Response<Body>, S::Error>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    // As the gateway: the client's request id, or one made now, goes to the inner service and on a refusal.
    let mut request = request;
    let peer = peer_ip(&shared, &request);
    let Arrival {
        request_id,
        client_ip,
        ..
    } = Arrival::of(&mut request, peer, &shared.client_ip);
    let with_id = |mut response: Response<Body>| {
        set_request_id(response.headers_mut(), request_id);
        response
    };
    // Keys see the request as the gateway does (see the README's security model): `/a/../b` and `/b` share a key,
    // and a request with no single reading (two Hosts, `post`, a bad escape) is refused as the gateway refuses it.
    // The target is cloned (its bytes shared) so that the reading outlives the request handed on.
    let uri = request.uri().clone();
    let canonical = match CanonicalRequest::of_accepted(
        request.method(),
        request.version(),
        &uri,
        request.headers(),
    ) {
        Ok(canonical) => canonical,
        Err(refusal) => return Ok(with_id(answer(refusal.into(), None))),
    };
    let served = shared
        .policy
        .serve(
            &shared.limiter,
            &canonical,
            client_ip,
            request,
            NoReservation,
            |request| inner.oneshot(request),
            None,
        )
        .await?;
    // A refusal carries the request id; an admitted request's response is the inner service's own.
    Ok(if served.headers().contains_key(&X_REQUEST_ID) {
        served
    } else {
        with_id(served)
    })
}

/// The peer address from axum's `ConnectInfo`, or [`UNKNOWN_PEER`], warning once per layer.
fn peer_ip<B>(shared: &Shared, request: &Request<B>) -> IpAddr {
    if let Some(ConnectInfo(peer)) = request.extensions().get::<ConnectInfo<SocketAddr>>() {
        return peer.ip();
    }
    if !shared.warned_no_peer.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            scope = %shared.policy.limits().scope(),
            "request without ConnectInfo<SocketAddr>: every client is taken to be {UNKNOWN_PEER} (serve with \
             into_make_service_with_connect_info::<SocketAddr>())"
        );
    }
    UNKNOWN_PEER
}
