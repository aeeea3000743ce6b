//! The answers admission gives itself, with a short JSON body: the refusals of requests that have no single
//! reading (design §7). Shared by the gateway and the tower layer, which must refuse alike.

use axum::body::Body;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use serde_json::json;

use crate::routing::Refusal;

/// The answer to a request refused before any limit was asked (design §7): 400 (405 for CONNECT) with a JSON body
/// naming the reason. Shared by the gateway and the tower layer, which must refuse alike.
pub fn refused(refusal: Refusal) -> Response<Body> {
    tracing::debug!(%refusal, "request refused");
    json_response(
        refusal.status(),
        &json!({"error": refusal.code(), "message": refusal.to_string()}),
    )
}

/// A response with a JSON body.
pub(crate) fn json_response(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
