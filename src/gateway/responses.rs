//! The answers only the gateway gives, each with a short JSON body: a request head or body it will not read (400,
//! 408, 413, 431), an upstream unreachable or late (502, 504), and readiness (`/readyz`, also on
//! `server.health_path`). Refusals (no route, rate limited, limiter unavailable, the caller's 401 / 403, requests
//! without a single reading) are admission's typed values, answered by `crate::admission::answer`.

use axum::body::Body;
use http::{header, HeaderValue, Response, StatusCode, Version};
use serde_json::json;

use crate::admission::json_response;
use crate::proxy::ClientBodyError;

/// 400 for a request body that cannot be read: malformed chunked framing, or cut short by the client.
pub(super) fn bad_body() -> Response<Body> {
    json_response(
        StatusCode::BAD_REQUEST,
        &json!({"error": "bad_request", "message": "the request body is malformed or incomplete"}),
    )
}

/// The answer to a request whose body failed as the client's: 413 past `server.max_body_bytes`, 408 when it stalled
/// for `server.body_read_timeout`, else 400. The connection is closed after the first two (HTTP/1.x): the rest of
/// the body is not read.
pub(super) fn client_body_failed(error: &(dyn std::error::Error + 'static)) -> Response<Body> {
    match ClientBodyError::find(error) {
        Some(ClientBodyError::TooLarge) => body_too_large(Version::HTTP_11),
        Some(ClientBodyError::Stalled) => {
            let mut response = json_response(
                StatusCode::REQUEST_TIMEOUT,
                &json!({"error": "body_timeout", "message": "no part of the request body came for server.body_read_timeout"}),
            );
            response
                .headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            response
        }
        _ => bad_body(),
    }
}

/// 431 for a request head larger than `server.max_header_bytes`. The connection is closed after it (HTTP/1.x): the
/// client that wrote such a head is not trusted to frame what follows.
pub(super) fn head_too_large(version: Version) -> Response<Body> {
    let mut response = json_response(
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        &json!({"error": "header_too_large", "message": "the request head is larger than server.max_header_bytes"}),
    );
    if version < Version::HTTP_2 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// 502 when the upstream cannot be reached.
pub(super) fn bad_gateway(route: &str) -> Response<Body> {
    json_response(
        StatusCode::BAD_GATEWAY,
        &json!({"error": "upstream_unreachable", "route": route}),
    )
}

/// 504 when the upstream does not answer in time.
pub(super) fn gateway_timeout(route: &str) -> Response<Body> {
    json_response(
        StatusCode::GATEWAY_TIMEOUT,
        &json!({"error": "upstream_timeout", "route": route}),
    )
}

/// 413 for a request body larger than `server.max_body_bytes`. The connection is closed after it (HTTP/1.x): the
/// rest of the body is not read.
pub(super) fn body_too_large(version: Version) -> Response<Body> {
    let mut response = json_response(
        StatusCode::PAYLOAD_TOO_LARGE,
        &json!({"error": "body_too_large", "message": "the request body is larger than server.max_body_bytes"}),
    );
    if version < Version::HTTP_2 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// What the admin listener's `/readyz` answers, also on `server.health_path`: the store's readiness (see
/// [`crate::limiter::RateLimiter::readiness`]), with `degraded_status` while it is not ready. While the consumer
/// directory in a Redis that answers is still being read whole (at start), 503 `{"status":"starting"}`. Once
/// shutdown begins, 503 `{"status":"draining"}` whatever the store says: a balancer must stop sending new requests
/// before the listener closes.
pub fn readiness(
    gateway: &super::Gateway,
    degraded_status: StatusCode,
) -> (StatusCode, serde_json::Value) {
    if gateway.shutdown().is_draining() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "draining"}),
        );
    }
    let limiter = gateway.limiter();
    let readiness = limiter.readiness();
    let reading_directory = gateway
        .consumers()
        .is_some_and(|consumers| !consumers.directory().synced());
    if reading_directory && readiness.ready {
        // Redis answers, and the directory is still being read whole: keys are looked up one by one meanwhile,
        // and a balancer should wait for the instance that can answer them all from memory. (While Redis does
        // not answer, the instance is degraded, as below.)
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "starting", "reason": "reading the consumer directory from redis"}),
        );
    }
    let mut body = json!({
        "status": if readiness.ready { "ready" } else { "degraded" },
        "store": limiter.backend().name(),
        "fallback_active": limiter.fallback_active(),
        "on_error": limiter.on_error().to_string(),
    });
    if let Some(reason) = readiness.reason {
        body["reason"] = json!(reason);
    }
    if !readiness.warnings.is_empty() {
        body["warnings"] = json!(readiness.warnings);
    }
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        degraded_status
    };
    (status, body)
}
