//! HTTP/1.1 towards a target, written for the proxy's one exchange: a request head written from the request's
//! parts, its body framed, the answer's head parsed and its body decoded, all in the request's own task.
//!
//! hyper's client did this in a task per connection, with a channel to it and one back, and its general head
//! handling: 12,700 instructions of a proxied request's 32,800 (`bench/gateway_cost.py`, callgrind), against
//! nginx's 19,100 for all of its request.

mod decode;
mod head;
mod upload;

pub(super) use decode::{Decoder, Step};
pub(super) use head::{parse_response_head, write_request_head, ResponseHead};
pub(super) use upload::{Upload, UploadError};

use thiserror::Error;

/// How the target broke the exchange.
#[derive(Debug, Error)]
pub enum WireError {
    /// The connection failed (reset, refused write, TLS alert).
    #[error("upstream connection failed: {0}")]
    Io(#[from] std::io::Error),
    /// The connection closed before the answer was complete (before its head, or mid-body).
    #[error("upstream connection closed before the answer was complete")]
    Closed,
    /// The answer is not HTTP/1.x the gateway can pass on: a malformed head or framing.
    #[error("malformed answer from the upstream: {0}")]
    Malformed(&'static str),
    /// The answer's head is larger than the gateway reads.
    #[error("the upstream's answer head is larger than {0} bytes")]
    HeadTooLarge(usize),
}

impl From<httparse::Error> for WireError {
    fn from(error: httparse::Error) -> Self {
        Self::Malformed(match error {
            httparse::Error::HeaderName => "invalid header name",
            httparse::Error::HeaderValue => "invalid header value",
            httparse::Error::NewLine => "invalid line ending",
            httparse::Error::Status => "invalid status",
            httparse::Error::Token => "invalid token",
            httparse::Error::TooManyHeaders => "too many header fields",
            httparse::Error::Version => "invalid HTTP version",
        })
    }
}
