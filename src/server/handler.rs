//! What a server hands each request to: the one seam between the connections and the request path.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;

/// What the body of an answer may fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Answers the requests a server's connections read. One value per server, cloned into each request's future: keep
/// it a pointer or two, every byte of it is copied with that future. `Unpin`: hyper's HTTP/1 connection holds it unpinned.
pub trait Handler: Clone + Send + Sync + Unpin + 'static {
    /// The body of its answers. `Unpin`: an HTTP/2 answer's body is wrapped to follow the requests in flight.
    type Body: http_body::Body<Data = Bytes, Error: Into<BoxError>> + Send + Unpin + 'static;

    /// Answers `request`, read from `peer`. `handler` is `None` when the request's head was over
    /// [`Settings::max_header_bytes`](super::Settings::max_header_bytes): the answer is then the handler's refusal
    /// of it, with nothing else read.
    ///
    /// An associated function returning the request's whole future, hyper's `Result` in it: hyper copies each
    /// request's future whole, and every level of futures is copied again where it is built, so the server's request
    /// future is this one and not one around it. `None` rather than a flag: it costs the future no byte.
    fn handle(
        handler: Option<Self>,
        request: Request<Incoming>,
        peer: SocketAddr,
    ) -> impl Future<Output = Result<Response<Self::Body>, Infallible>> + Send + 'static;

    /// Answers `request`, a request that the connection read itself with its whole body (empty when it has none;
    /// see `direct.rs`), as [`handle`](Self::handle) does. Its answer goes out through the server's own writer,
    /// with `lines`, handed back with it: fields the handler wrote ahead as head lines (`name: value` and CRLF
    /// each), copied after the answer's map as they are. `lines` comes empty, in the allocation the connection's
    /// last answer used, so that writing them costs no allocation. A head over
    /// [`Settings::max_header_bytes`](super::Settings::max_header_bytes) is never read here (hyper refuses it), so
    /// there is always a handler.
    fn handle_whole(
        handler: Self,
        request: Request<Bytes>,
        peer: SocketAddr,
        lines: Vec<u8>,
    ) -> impl Future<Output = Result<(Response<Self::Body>, Vec<u8>), Infallible>> + Send + 'static;
}
