//! One request through admission, from its reading to its answer, as every entry point runs it: decide, answer a
//! refusal, send on the caller's headers (never a client's copies), forward, add the rate-limit fields, and hand the
//! answer the work kept for after it. Entry points supply only how to forward, so none can skip a step.

use std::future::Future;
use std::net::IpAddr;

use axum::body::Body;
use axum::BoxError;
use bytes::Bytes;
use http::{Request, Response};

use super::after_answer::{AnswerGuard, Ending, GuardedBody};
use super::policy::{Admission, Policy};
use super::reserve::Reserve;
use super::responses::answer;
use crate::head_lines::HeadLines;
use crate::limiter::RateLimiter;
use crate::routing::CanonicalRequest;
use crate::trail::Trail;
use crate::tunnel::TunnelClosed;

// === impl Policy ===

impl Policy {
    /// Runs `request`, whose canonical reading is `canonical`, from `client_ip`, through this policy with `limiter`
    /// (admission reads it from those, see [`RequestFacts`](crate::key::RequestFacts)), reserving `reserve` on the
    /// token limits ([`NoReservation`](super::NoReservation) off a route with `usage:`; on one, the body already
    /// read and rewritten): a refusal is answered here; an admitted (or allowlisted) request is passed to
    /// `forward`, and its response comes back with the rate-limit fields (in its map, or in `lines` where the entry
    /// point's server writes the head itself) and, when its limits keep work for after
    /// the answer, a body that runs that work when it ends (and reads the answer's usage, which settles the
    /// reservation). An error from `forward` is returned as it is (its answer is the entry point's), after the
    /// work kept for the answer has been told the upstream failed.
    ///
    /// Not an `async fn`: one of those keeps a second copy of every argument (the request among them) in its
    /// future for as long as it lives, and hyper copies each request's future whole, so every byte of it costs.
    #[allow(clippy::manual_async_fn)]
    // Each argument is a different part of the request's serving, all moved or borrowed into the future; a struct of
    // them would be built by every caller and taken apart here once per request.
    #[allow(clippy::too_many_arguments)]
    pub fn serve<'a, B, R, E, F, Fut, V>(
        &'a self,
        limiter: &'a RateLimiter,
        canonical: &'a CanonicalRequest<'a>,
        client_ip: IpAddr,
        mut request: Request<B>,
        reserve: V,
        forward: F,
        lines: Option<&'a mut HeadLines>,
    ) -> impl Future<Output = Result<Response<Body>, E>> + use<'a, B, R, E, F, Fut, V>
    where
        F: FnOnce(Request<B>) -> Fut,
        Fut: Future<Output = Result<Response<R>, E>>,
        R: http_body::Body<Data = Bytes> + Send + 'static,
        R::Error: Into<BoxError>,
        V: Reserve + 'a,
    {
        async move {
            // A route without limits or consumers has nothing to decide, add or keep: the request goes straight on
            // (as an allowlisted client's does), paying nothing for the steps below.
            if self.decides_nothing() {
                return forward(request)
                    .await
                    .map(|response| response.map(Body::new));
            }
            let admission = {
                let facts = self.facts(canonical, client_ip, &request);
                self.admit(limiter, &facts, reserve, Trail::of(&request))
                    .await
            };
            let mut admitted = match admission {
                Admission::Refused(refusal) => {
                    if let Some(trail) = Trail::of(&request) {
                        self.note_refusal(trail, &refusal);
                    }
                    return Ok(answer(refusal, Some(self)));
                }
                Admission::Exempt => None,
                Admission::Admitted(admitted) => {
                    if let Some(trail) = Trail::of(&request) {
                        self.note_admitted(trail, &admitted);
                    }
                    Some(admitted)
                }
            };
            self.forward_caller(admitted.as_ref(), &mut request);
            let mut after = admitted.as_mut().and_then(|admitted| admitted.after.take());
            let mut response = match forward(request).await {
                Ok(response) => response,
                Err(error) => {
                    if let Some(after) = &mut after {
                        after.end(Ending::Failed);
                    }
                    return Err(error);
                }
            };
            self.decorate(admitted.as_ref(), &mut response, lines);
            Ok(match after {
                None => response.map(Body::new),
                Some(mut after) => {
                    after.status(response.status());
                    if response.status() == http::StatusCode::SWITCHING_PROTOCOLS {
                        return Ok(after_tunnel(response, after));
                    }
                    reserve.guard(response, after)
                }
            })
        }
    }
}

/// A switch of protocols: the request lasts as long as the tunnel its answer opened (when what answered says so with
/// a [`TunnelClosed`]), and its work ends with it, in a task of its own. Out of line: upgrades are rare.
#[cold]
#[inline(never)]
fn after_tunnel<R>(mut response: Response<R>, after: AnswerGuard) -> Response<Body>
where
    R: http_body::Body<Data = Bytes> + Send + 'static,
    R::Error: Into<BoxError>,
{
    match response.extensions_mut().remove::<TunnelClosed>() {
        Some(closed) => {
            tokio::spawn(async move {
                closed.closed().await;
                // The tunnel closed: the request's answer is over, whichever side ended it.
                let mut after = after;
                after.end(Ending::Complete);
            });
            response.map(Body::new)
        }
        None => response.map(|body| Body::new(GuardedBody::new(body, after))),
    }
}
