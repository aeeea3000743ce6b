//! Why a request is not admitted, as a typed value: the entry points turn it into their own answer (an HTTP
//! response through [`answer`](super::answer), a gRPC answer through `rls/refusal.rs` for Envoy's rate limit
//! service), so that what is refused and why is decided once, and how it is said is decided per protocol.

use std::time::Duration;

use crate::consumers::CallerRefusal;
use crate::limiter::Unavailable;
#[cfg(feature = "llm")]
use crate::usage::RequestBodyError;

use super::limits::Checked;

/// Why a request is refused.
#[derive(Debug)]
pub enum Refusal {
    /// The request has no single reading (two `Host` fields, a malformed escape, CONNECT where no route names it):
    /// refused before any route or limit.
    Unreadable(crate::routing::Refusal),
    /// No route takes the request; `path` is its canonical path.
    NoRoute {
        /// The canonical path, as routes match it.
        path: String,
    },
    /// The caller is not identified (a credential missing, not verified, sent twice) or is blocked.
    Caller(CallerRefusal),
    /// The client's address is past `consumers.failed_credentials`: its credential is refused unchecked.
    TooManyFailedCredentials {
        /// How long until a credential from the address is checked again.
        wait: Duration,
    },
    /// The request leaves out what its entry point needs to decide it (a request of Envoy's with no domain, no
    /// descriptor, or a limit override in no known unit): the reason, as the caller is told it.
    Invalid(&'static str),
    /// A key part occurs more than once in the request: refused rather than counted on a guess.
    AmbiguousKey,
    /// A limit denied the request.
    RateLimited {
        /// What the limiter said of every limit that applied.
        checked: Checked,
        /// The caller's plan, whose limits were checked with the route's ([`None`] for the route's alone).
        plan: Option<usize>,
    },
    /// The store failed and the policy is `on_error: deny`.
    Unavailable(Unavailable),
    /// The request reserves more tokens than a limit could ever hold (a prompt or a `max_tokens` too large for
    /// it): no wait would admit it.
    ReservationTooLarge {
        /// The limit, as advertised.
        limit: String,
        /// What the request reserves on it.
        reserved: u64,
        /// What the limit holds.
        capacity: u64,
    },
    /// The body of a request on a route with `usage:` is larger than `usage.max_request_bytes`: it cannot be read
    /// whole, so its cost cannot be bounded.
    BodyTooLarge,
    /// The body of a request on a route with `usage:` is not the API's JSON: its cost cannot be bounded, and
    /// guessing how the upstream reads it is how a budget is overrun.
    #[cfg(feature = "llm")]
    BodyUnreadable(RequestBodyError),
}

impl From<crate::routing::Refusal> for Refusal {
    fn from(refusal: crate::routing::Refusal) -> Self {
        match refusal {
            crate::routing::Refusal::AmbiguousKey => Refusal::AmbiguousKey,
            refusal => Refusal::Unreadable(refusal),
        }
    }
}
