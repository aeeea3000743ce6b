//! The gateway's own answers (no route, rate limited, store or upstream failure), each with a short JSON body.

use axum::body::Body;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use serde_json::json;

/// A response with a JSON body.
pub(super) fn json(status: StatusCode, body: serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

/// 404 when no route matches.
pub(super) fn no_route(path: &str) -> Response<Body> {
    json(
        StatusCode::NOT_FOUND,
        json!({"error": "no_route", "path": path}),
    )
}

/// 400 for a request target that is not a path (`*`, authority-form).
pub(super) fn bad_target() -> Response<Body> {
    json(
        StatusCode::BAD_REQUEST,
        json!({"error": "bad_request", "message": "the request target must be a path"}),
    )
}

/// 503 when the store failed and the policy is `on_error: deny`.
pub(super) fn store_unavailable(route: &str) -> Response<Body> {
    let mut response = json(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"error": "limiter_unavailable", "route": route}),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// 429 (or the route's `deny_status`) for a denied request.
pub(super) fn rate_limited(
    status: StatusCode,
    route: &str,
    limit: &str,
    retry_after_ms: u64,
) -> Response<Body> {
    let mut response = json(
        status,
        json!({"error": "rate_limited", "route": route, "limit": limit, "retry_after_ms": retry_after_ms}),
    );
    // At least 1: `Retry-After: 0` would invite an immediate retry that is still refused.
    let seconds = retry_after_ms.div_ceil(1000).max(1);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// 502 when the upstream cannot be reached.
pub(super) fn bad_gateway(route: &str) -> Response<Body> {
    json(
        StatusCode::BAD_GATEWAY,
        json!({"error": "upstream_unreachable", "route": route}),
    )
}

/// 504 when the upstream does not answer in time.
pub(super) fn gateway_timeout(route: &str) -> Response<Body> {
    json(
        StatusCode::GATEWAY_TIMEOUT,
        json!({"error": "upstream_timeout", "route": route}),
    )
}
