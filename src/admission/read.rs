//! Read: a request as admission takes it from every entry point: its id and its client as it arrives
//! ([`Arrival`]), then, on its route, the one view every later step reads ([`RequestFacts`]), or the view tools get
//! of it without deciding it ([`RequestView`]).

use std::net::IpAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::header::Entry;
use http::{HeaderMap, HeaderName, HeaderValue, Request};

use super::headers::is_rate_limit_field;
use super::policy::Policy;
use crate::head_lines::HeadLines;
use crate::key::{AmbiguousKey, ClientCertificate, ClientIpResolver, RequestFacts};
use crate::routing::CanonicalRequest;

/// `x-request-id`.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What admission reads of a request as it arrives, before any route: what the gateway and the layer both answer
/// and log with.
#[derive(Debug, Clone)]
pub struct Arrival {
    /// The request's `x-request-id`: the client's, or one made now (see [`ensure_request_id`]).
    pub request_id: HeaderValue,
    /// The client address, resolved through trusted proxies.
    pub client_ip: IpAddr,
    /// `request_id` was made here and is not among the request's fields ([`Arrival::leaving_id_out`]): what
    /// forwards the request writes it.
    pub id_left_out: bool,
}

/// How admission reads a request without deciding it (nothing is counted): what the gateway's `view` gives tools
/// and tests that check that a request and the request forwarded for it read the same. Owned, unlike
/// [`RequestFacts`]: made for a tool, never on the request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestView {
    /// The route that takes it, if any.
    pub route: Option<String>,
    /// The client address, resolved through trusted proxies.
    pub client_ip: IpAddr,
    /// Whether the client is on the route's allowlist (and so skips its limits).
    pub allowlisted: bool,
    /// The store key of each limit that applies (none when allowlisted).
    pub keys: Vec<String>,
}

// === impl Arrival ===

impl Arrival {
    /// Reads `request`, from a connection whose peer is `peer`, as it arrives: its id (set on it when made here)
    /// and its client, as `clients` resolves it.
    pub fn of<B>(request: &mut Request<B>, peer: IpAddr, clients: &ClientIpResolver) -> Self {
        let request_id = ensure_request_id(request.headers_mut());
        let client_ip = clients.resolve(peer, request.headers());
        Self {
            request_id,
            client_ip,
            id_left_out: false,
        }
    }

    /// [`of`](Self::of), but an id made here is left out of the request's fields (`id_left_out`), for a forwarder
    /// that writes it into the upstream head itself, as it writes `X-Forwarded-For`: a map insertion (a hash of
    /// the name, a probe) spared nearly every request, since few clients send one. A client's unusable id is taken
    /// out all the same.
    pub fn leaving_id_out<B>(
        request: &mut Request<B>,
        peer: IpAddr,
        clients: &ClientIpResolver,
    ) -> Self {
        let headers = request.headers_mut();
        // The name among a request's few fields, by comparison: a look-up would hash it first.
        let sent = if headers.len() <= 16 {
            headers
                .iter()
                .find(|(name, _)| **name == X_REQUEST_ID)
                .map(|(_, id)| id)
        } else {
            headers.get(&X_REQUEST_ID)
        };
        let (request_id, id_left_out) = match sent {
            Some(id) if usable_request_id(id) => (id.clone(), false),
            Some(_) => {
                headers.remove(&X_REQUEST_ID);
                (new_request_id(), true)
            }
            None => (new_request_id(), true),
        };
        let client_ip = clients.resolve(peer, request.headers());
        Self {
            request_id,
            client_ip,
            id_left_out,
        }
    }
}

// === impl RequestView ===

impl RequestView {
    /// The view of a request from `client_ip` that no route takes.
    pub fn unrouted(client_ip: IpAddr) -> Self {
        Self {
            route: None,
            client_ip,
            allowlisted: false,
            keys: Vec::new(),
        }
    }
}

// === impl Policy ===

impl Policy {
    /// `request`, whose canonical reading is `canonical`, from `client_ip`, as every step after routing reads it on
    /// this policy's route. Borrows all it holds (see [`RequestFacts`]).
    pub(super) fn facts<'f, B>(
        &'f self,
        canonical: &'f CanonicalRequest<'_>,
        client_ip: IpAddr,
        request: &'f Request<B>,
    ) -> RequestFacts<'f> {
        RequestFacts {
            client_ip,
            ipv6_prefix: self.ipv6_prefix(),
            route: self.limits().scope(),
            method: request.method(),
            path: canonical.route_path(),
            path_any_case: self.matches_paths_in_any_case(),
            host: canonical.host.as_deref(),
            headers: request.headers(),
            query: canonical.query,
            consumer: None,
            plan: None,
            // Empty extensions (every request without a client certificate) are one test of a pointer.
            client_cert: request
                .extensions()
                .get::<Arc<ClientCertificate>>()
                .map(Arc::as_ref),
        }
    }

    /// How this policy's route reads `request` (its canonical reading `canonical`, from `client_ip`) without deciding
    /// it: its allowlist verdict and the keys it would be counted under, by the same steps as admission; an error
    /// when a key part or credential occurs twice (refused as ambiguous on the request path).
    pub fn view<B>(
        &self,
        canonical: &CanonicalRequest<'_>,
        client_ip: IpAddr,
        request: &Request<B>,
    ) -> Result<RequestView, AmbiguousKey> {
        let allowlisted = self.is_exempt(client_ip);
        let keys = if allowlisted {
            Vec::new()
        } else {
            self.keys(&self.facts(canonical, client_ip, request))?
        };
        Ok(RequestView {
            route: Some(self.limits().scope().to_owned()),
            client_ip,
            allowlisted,
            keys,
        })
    }
}

/// The request's `x-request-id`, generated (128 random bits, hex) and set on it when the client sent none or an
/// unusable one (empty, over 200 bytes). The gateway and the tower layer both answer with it.
///
/// The field is found once (an entry, not a look-up and then an insert: each hashes the name byte by byte).
pub fn ensure_request_id(headers: &mut HeaderMap) -> HeaderValue {
    match headers.entry(&X_REQUEST_ID) {
        Entry::Occupied(mut field) => {
            let id = field.get();
            if usable_request_id(id) {
                return id.clone();
            }
            let made = new_request_id();
            field.insert(made.clone());
            made
        }
        Entry::Vacant(field) => {
            let made = new_request_id();
            field.insert(made.clone());
            made
        }
    }
}

/// Whether a client's `x-request-id` is kept: not empty, and at most 200 bytes.
fn usable_request_id(id: &HeaderValue) -> bool {
    !id.is_empty() && id.len() <= 200
}

/// A new request id: 128 random bits in hex, in one allocation that its clones share (the request and its answer
/// each carry it). Copied into a header value instead, it took a second one at its first clone.
fn new_request_id() -> HeaderValue {
    let mut id = [0u8; 32];
    for (digits, byte) in id.chunks_exact_mut(2).zip(fastrand::u128(..).to_be_bytes()) {
        digits.copy_from_slice(&HEX_PAIRS[usize::from(byte)]);
    }
    HeaderValue::from_maybe_shared(Bytes::from_owner(id))
        .unwrap_or_else(|_| HeaderValue::from_static("0"))
}

/// Each byte's two lower-case hex digits: one load a byte instead of two.
const HEX_PAIRS: [[u8; 2]; 256] = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut pairs = [[0u8; 2]; 256];
    let mut byte = 0;
    while byte < 256 {
        pairs[byte] = [HEX[byte >> 4], HEX[byte & 0xf]];
        byte += 1;
    }
    pairs
};

/// Sets `request_id` on an answer's `headers` as its `x-request-id`.
pub fn set_request_id(headers: &mut HeaderMap, request_id: HeaderValue) {
    headers.insert(X_REQUEST_ID.clone(), request_id);
}

/// [`set_request_id`] for an answer whose head the server writes itself: `request_id` as a head line of `lines`.
/// The answer's own `x-request-id` (an upstream's echo), and its rate-limit fields where `lines` holds the
/// gateway's, give way: as the map's insertions replace them. One pass over the names finds none nearly always,
/// where a look-up hashed each name.
pub fn add_request_id_line(
    headers: &mut HeaderMap,
    lines: &mut HeadLines,
    request_id: &HeaderValue,
) {
    let rate_limit = lines.holds_rate_limit_fields();
    let replaced =
        |name: &HeaderName| name == X_REQUEST_ID || (rate_limit && is_rate_limit_field(name));
    if headers.keys().any(replaced) {
        let names: Vec<HeaderName> = headers
            .keys()
            .filter(|name| replaced(name))
            .cloned()
            .collect();
        for name in names {
            headers.remove(name);
        }
    }
    lines.push_line(b"x-request-id: ", request_id.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_reads_as_its_two_hex_digits() {
        for byte in 0..=255u8 {
            assert_eq!(
                HEX_PAIRS[usize::from(byte)],
                *format!("{byte:02x}").as_bytes()
            );
        }
    }

    #[test]
    fn a_usable_id_is_kept_and_any_other_replaced_by_one_made_here() {
        let mut headers = HeaderMap::new();
        headers.append(&X_REQUEST_ID, HeaderValue::from_static("client-1"));
        headers.append(&X_REQUEST_ID, HeaderValue::from_static("client-2"));
        assert_eq!(ensure_request_id(&mut headers), "client-1");
        assert_eq!(headers.get_all(&X_REQUEST_ID).iter().count(), 2);

        let long = "x".repeat(201);
        for sent in [&[""][..], &[long.as_str()], &["", "second"], &[]] {
            let mut headers = HeaderMap::new();
            for id in sent {
                headers.append(&X_REQUEST_ID, HeaderValue::from_str(id).unwrap());
            }
            let made = ensure_request_id(&mut headers);
            assert_eq!(made.len(), 32, "{sent:?}");
            assert!(made.as_bytes().iter().all(u8::is_ascii_hexdigit));
            let lines: Vec<_> = headers.get_all(&X_REQUEST_ID).iter().collect();
            assert_eq!(lines, [&made], "{sent:?}");
        }
    }
}
