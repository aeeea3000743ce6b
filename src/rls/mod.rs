//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`): descriptors matched as
//! envoyproxy/ratelimit matches them, decided by the limiter call admission makes, answered in gRPC.

#[cfg(feature = "rls")]
mod answer;
mod decide;
mod domains;
#[cfg(feature = "rls")]
mod refusal;
#[cfg(feature = "rls")]
mod service;
mod unit;

pub use decide::{decide, Checked, Decided, Descriptor, Found};
pub use domains::{
    pattern_matches, Domain, HeaderNames, Matched, Node, RlsSettings, Rule, RuleKind, ValueMatch,
    WhenUnavailable, MAX_SHARED_DEPTH,
};
#[cfg(feature = "rls")]
pub use service::{serve, RateLimitService};
pub use unit::{requests_per_unit, Unit, UNITS};
