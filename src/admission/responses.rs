//! Every refusal as an HTTP answer, with a short JSON body naming the reason (in the provider's error shape on an LLM
//! API's route): the one place a [`Refusal`] becomes a response, for the gateway and the tower layer alike (which
//! must refuse alike).

use std::time::Duration;

use axum::body::Body;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use serde_json::json;

#[cfg(feature = "llm")]
use super::dialect::provider_shaped;
use super::limits::{Checked, LimitSet};
use super::policy::Policy;
use super::refusal::Refusal;
use crate::consumers::CallerRefusal;
use crate::limiter::Unavailable;
use crate::routing;

/// The `WWW-Authenticate` of a 401 given where no consumers are configured (none is, in practice: only routes
/// that identify callers refuse them).
static DEFAULT_CHALLENGE: HeaderValue = HeaderValue::from_static("ApiKey realm=\"tollgate\"");

/// The HTTP answer to `refusal`. `policy` is the one that refused it (a route's, the layer's); a request refused
/// before any route has none. On a route whose `usage.format` names a provider, the body is in that provider's error
/// shape (see `dialect.rs`), so that its SDKs show it; elsewhere it is tollgate's own.
pub fn answer(refusal: Refusal, policy: Option<&Policy>) -> Response<Body> {
    let scope = policy.map_or("", |p| p.limits().scope());
    let refused = match refusal {
        Refusal::Unreadable(refusal) => unreadable(refusal),
        Refusal::NoRoute { path } => no_route(&path),
        Refusal::AmbiguousKey => unreadable(routing::Refusal::AmbiguousKey),
        Refusal::Invalid(reason) => refused(
            StatusCode::BAD_REQUEST,
            json!({"error": "bad_request", "message": reason}),
        ),
        Refusal::Caller(refusal) => caller_refused(
            &refusal,
            policy
                .and_then(Policy::challenges)
                .unwrap_or(&DEFAULT_CHALLENGE),
        ),
        Refusal::TooManyFailedCredentials { wait } => too_many_failed_credentials(wait),
        Refusal::RateLimited { checked, plan } => match policy {
            Some(policy) => rate_limited(policy.limits_for_plan(plan), &checked),
            None => rate_limited_unexplained(),
        },
        Refusal::Unavailable(error) => unavailable(scope, &error),
        Refusal::ReservationTooLarge {
            limit,
            reserved,
            capacity,
        } => refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({
                "error": "reservation_too_large",
                "route": scope,
                "limit": limit,
                "reserved": reserved,
                "capacity": capacity,
                "message": "the request may spend more tokens than the limit ever holds: lower max_tokens or send a shorter prompt",
            }),
        ),
        Refusal::BodyTooLarge => refused(
            StatusCode::PAYLOAD_TOO_LARGE,
            json!({"error": "body_too_large", "message": "the request body is larger than usage.max_request_bytes"}),
        ),
        #[cfg(feature = "llm")]
        Refusal::BodyUnreadable(error) => refused(
            StatusCode::BAD_REQUEST,
            json!({"error": "bad_request", "message": error.to_string()}),
        ),
    };
    #[cfg(feature = "llm")]
    let refused = provider_shaped(policy, refused);
    let (parts, body) = refused.into_parts();
    Response::from_parts(parts, Body::from(body.to_string()))
}

/// A refusal's answer with `status` and tollgate's JSON `body`, not yet written.
fn refused(status: StatusCode, body: serde_json::Value) -> Response<serde_json::Value> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// 404 when no route matches.
fn no_route(path: &str) -> Response<serde_json::Value> {
    refused(
        StatusCode::NOT_FOUND,
        json!({"error": "no_route", "path": path}),
    )
}

/// The answer to a denied request: `deny_status` (429 by default) with `Retry-After`, the rate-limit fields and a
/// JSON body naming the limit.
fn rate_limited(limits: &LimitSet, checked: &Checked) -> Response<serde_json::Value> {
    let (limit, retry_after_ms) = limits.denial(checked);
    tracing::debug!(scope = %limits.scope(), limit, retry_after_ms, "rate limited");
    let body = json!({
        "error": "rate_limited",
        "route": limits.scope(),
        "limit": limit,
        "retry_after_ms": retry_after_ms,
    });
    let mut response = refused(limits.deny_status(), body);
    limits.decorate_refusal(response.headers_mut(), checked);
    response
}

/// A denial whose limits are not at hand: 429 with `Retry-After: 1` and no fields.
fn rate_limited_unexplained() -> Response<serde_json::Value> {
    let mut response = refused(
        StatusCode::TOO_MANY_REQUESTS,
        json!({"error": "rate_limited"}),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The answer when the store failed and the policy is `on_error: deny`: 503 with `Retry-After: 1`.
fn unavailable(scope: &str, error: &Unavailable) -> Response<serde_json::Value> {
    // The limiter logs the outage, once per reason: a line per refused request would flood the log.
    tracing::debug!(scope, %error, "refusing: limiter unavailable");
    let body = json!({"error": "limiter_unavailable", "route": scope});
    let mut response = refused(StatusCode::SERVICE_UNAVAILABLE, body);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The answer to a request refused before any limit was asked (see the README's security model): 400 (405 for
/// CONNECT) with a JSON body naming the reason.
fn unreadable(refusal: routing::Refusal) -> Response<serde_json::Value> {
    tracing::debug!(%refusal, "request refused");
    refused(
        refusal.status(),
        json!({"error": refusal.code(), "message": refusal.to_string()}),
    )
}

/// A response with a JSON body (the gateway's own answers: its errors and health).
#[cfg(feature = "gateway")]
pub(crate) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// The answer to a caller refused before any limit was asked (see docs/configuration.md, "Consumers and plans"): 401 with `WWW-Authenticate` for a
/// credential missing or not verified (RFC 6750's `invalid_token` for a bearer token), 403 for a blocked
/// consumer, 400 for a credential sent twice, 503 (`Retry-After: 1`) when the directory in Redis, still being read
/// at start, cannot be asked about the credential. The body names the reason's class, never the credential.
fn caller_refused(
    refusal: &CallerRefusal,
    challenges: &HeaderValue,
) -> Response<serde_json::Value> {
    tracing::debug!(%refusal, "caller refused");
    let (status, body, challenge) = match refusal {
        CallerRefusal::Missing => (
            StatusCode::UNAUTHORIZED,
            json!({"error": "unauthorized", "reason": "credential_required"}),
            Some(challenges.clone()),
        ),
        CallerRefusal::Invalid { scheme, reason } => {
            let challenge = match *scheme {
                "Bearer" => format!(
                    "Bearer realm=\"tollgate\", error=\"invalid_token\", error_description=\"{reason}\""
                ),
                scheme => format!("{scheme} realm=\"tollgate\", error=\"{reason}\""),
            };
            (
                StatusCode::UNAUTHORIZED,
                json!({"error": "unauthorized", "reason": reason}),
                HeaderValue::from_str(&challenge).ok(),
            )
        }
        CallerRefusal::Blocked => (
            StatusCode::FORBIDDEN,
            json!({"error": "forbidden", "reason": "consumer_blocked"}),
            None,
        ),
        CallerRefusal::Ambiguous => return unreadable(routing::Refusal::AmbiguousKey),
        CallerRefusal::DirectoryUnavailable => {
            let body = json!({"error": "consumer_directory_unavailable"});
            let mut response = refused(StatusCode::SERVICE_UNAVAILABLE, body);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return response;
        }
    };
    let mut response = refused(status, body);
    if let Some(challenge) = challenge {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, challenge);
    }
    response
}

/// The answer to a request from an address past `consumers.failed_credentials`: 429 with `Retry-After`, its
/// credential not checked.
fn too_many_failed_credentials(wait: Duration) -> Response<serde_json::Value> {
    let retry_after_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX);
    tracing::debug!(retry_after_ms, "credentials refused: too many failed");
    let body = json!({"error": "too_many_failed_credentials", "retry_after_ms": retry_after_ms});
    let mut response = refused(StatusCode::TOO_MANY_REQUESTS, body);
    let seconds = retry_after_ms.div_ceil(1000).max(1);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}
