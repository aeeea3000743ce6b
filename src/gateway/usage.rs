//! The request side of a route with `usage:` (an LLM API): its body read whole, up to `usage.max_request_bytes`,
//! rewritten as the route says on an endpoint that takes a completion bound (the completion cap, the default limit,
//! the usage asked of a stream), and the tokens it may spend reserved from what the forwarded body says. Routes
//! without `usage:` never come here.

use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue, Request, Response, Version};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use super::responses;
use crate::admission::{answer, Policy, Refusal, Reservation, RouteUsage};
use crate::limiter::RateLimiter;
use crate::routing::CanonicalRequest;
use crate::usage::{rewrite_request, set_body_length};

/// Reads `request`'s body for `usage`, and makes the request forwarded and what it reserves; or the answer to a
/// body that cannot be read (413 past `usage.max_request_bytes`, 400 for a body that is not the API's JSON), which
/// `policy` refuses as the route speaks. `path` is the request's as routes match it: only an endpoint that takes a
/// completion bound (`usage.endpoints`) has its body read as the API's and rewritten, and reserves a completion.
pub(super) async fn read_request(
    policy: &Policy,
    usage: &Arc<RouteUsage>,
    path: &str,
    request: Request<Body>,
) -> Result<(Request<Body>, Reservation), Response<Body>> {
    let settings = usage.settings();
    let max = settings.max_request_bytes;
    let version = request.version();
    let declared = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max) {
        return Err(too_large(policy, version));
    }
    let (mut parts, body) = request.into_parts();
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    let bytes: Bytes = match Limited::new(body, limit).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) if error.is::<LengthLimitError>() => return Err(too_large(policy, version)),
        Err(error) => return Err(responses::client_body_failed(&*error)),
    };
    // A request without a body (a model list, a GET) asks for no completion: it reserves nothing.
    if bytes.is_empty() {
        let reservation = Reservation::nothing(usage);
        return Ok((Request::from_parts(parts, Body::empty()), reservation));
    }
    // Embeddings, moderations, a token count: no completion to bound, so nothing to rewrite (an API answers a
    // parameter it does not take with 400) and no completion to reserve. The body goes as it came.
    if !usage.takes_bound(path) {
        set_body_length(&mut parts.headers, bytes.len());
        usage.prepare_request(&mut parts.headers);
        let reservation = Reservation::prompt_only(usage, bytes.len());
        return Ok((Request::from_parts(parts, Body::from(bytes)), reservation));
    }
    // The body is judged by its bytes, not its label: an upstream that reads JSON whatever the `Content-Type`
    // (many OpenAI-compatible servers do) must never receive an unbounded JSON object labelled otherwise.
    let object = looks_like_json_object(&bytes);
    let (body, facts) = if usage.reads_body_fields() && (object || labelled_json(&parts.headers)) {
        match rewrite_request(usage.dialect(), &bytes, &settings.rewrites()) {
            Ok(rewritten) => (rewritten.body.unwrap_or(bytes), Some(rewritten.facts)),
            Err(error) => return Err(answer(Refusal::BodyUnreadable(error), Some(policy))),
        }
    } else {
        (bytes, None)
    };
    if facts.is_some() {
        // Read as JSON, forwarded as JSON: the upstream reads the body tollgate bounded.
        parts
            .headers
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    set_body_length(&mut parts.headers, body.len());
    usage.prepare_request(&mut parts.headers);
    let reservation = Reservation::new(usage, body.len(), facts.as_ref());
    Ok((Request::from_parts(parts, Body::from(body)), reservation))
}

/// Whether the `Content-Type` says JSON (or nothing of the type): such a body that is not a JSON object is refused.
fn labelled_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return true;
    };
    let media: String = value
        .to_str()
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect::<String>()
        .to_ascii_lowercase();
    media == "application/json" || media.ends_with("+json")
}

/// Whether the body starts as a JSON object would, in any encoding a lenient reader accepts: its first byte that is
/// not whitespace, a NUL or a byte-order mark's is `{` (UTF-16 and UTF-32 JSON, which such readers detect, read
/// so too, and are then refused as not UTF-8). A form (`name=...`) or a real multipart body (`--boundary`) does not.
fn looks_like_json_object(body: &[u8]) -> bool {
    body.iter().find(|byte| {
        !matches!(
            byte,
            b' ' | b'\t' | b'\n' | b'\r' | 0 | 0xEF | 0xBB | 0xBF | 0xFE | 0xFF
        )
    }) == Some(&b'{')
}

/// 413 for a body larger than `usage.max_request_bytes`, answered as the route refuses. The connection is closed
/// after it (HTTP/1.x), as after the gateway's other 413: the rest of the body is not read.
fn too_large(policy: &Policy, version: Version) -> Response<Body> {
    let mut response = answer(Refusal::BodyTooLarge, Some(policy));
    if version < Version::HTTP_2 {
        response.headers_mut().insert(
            http::header::CONNECTION,
            http::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The serving of one request on a route with `usage:`, boxed (routes without carry no room for it).
pub(super) type Serving<'a> = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response<Body>, Response<Body>>> + Send + 'a>,
>;

/// Serves `request` on a route with `usage:`: its body read and rewritten, then admission with its reservation,
/// then `forward`. A body that cannot be read is answered here (`Err`, the gateway's own answer).
pub(super) async fn serve<'a, F, Fut>(
    limiter: &'a RateLimiter,
    policy: &'a Policy,
    usage: &'a Arc<RouteUsage>,
    canonical: &'a CanonicalRequest<'a>,
    client_ip: std::net::IpAddr,
    request: Request<Body>,
    forward: F,
) -> Result<Response<Body>, Response<Body>>
where
    F: FnOnce(Request<Body>) -> Fut,
    Fut: std::future::Future<Output = Result<Response<Body>, Response<Body>>>,
{
    let path = canonical.route_path();
    let (request, reservation) = read_request(policy, usage, path, request).await?;
    policy
        .serve(
            limiter,
            canonical,
            client_ip,
            request,
            &reservation,
            forward,
            None,
        )
        .await
}
