//! Admission: the request path the gateway and the tower layer share (see docs/development.md, "Layout"). A [`Policy`]
//! runs a request from its reading to its answer ([`Policy::serve`]): allowlist, the caller and its plan, keys, one
//! limiter call, refusals as typed values ([`Refusal`], answered in one place), delays, the consumer headers sent on,
//! the fields of an admitted response and the work kept for after the answer ([`AnswerGuard`]).

mod after_answer;
mod check;
mod counters;
#[cfg(feature = "llm")]
mod dialect;
mod headers;
mod identify;
mod limits;
mod policy;
mod queue;
mod read;
mod refusal;
mod reserve;
mod responses;
mod serve;
mod settle;
mod slots;
#[cfg(feature = "llm")]
mod tokens;
mod wait;

/// A limit with its key spec, as admission takes it (the key module's type, named here too).
pub use crate::key::LimitSettings;
/// A WebSocket tunnel's two ends: proxying opens tunnels, admission waits for them to close.
pub use crate::tunnel::{tunnel, TunnelClosed, TunnelOpen};
#[cfg(test)]
pub(crate) use after_answer::recording;
pub use after_answer::{AfterAnswer, AnswerGuard, Ending, GuardedBody};
pub use check::check_keyed;
#[cfg(feature = "rls")]
pub(crate) use counters::DecisionCounters;
/// The rate-limit fields as tollgate's HTTP answers carry them, for Envoy's rate limit service to send the same.
#[cfg(feature = "rls")]
pub(crate) use headers::{
    apply as apply_rate_limit_fields, policy as rate_limit_policy, Advertised,
};
pub use limits::{Checked, LimitRequest, LimitSet, NotChecked, Replaced};
pub use policy::{Admission, Admitted, Policy};
pub use read::{
    add_request_id_line, ensure_request_id, set_request_id, Arrival, RequestView, X_REQUEST_ID,
};
pub use refusal::Refusal;
pub use reserve::{NoReservation, Reserve};
pub use responses::answer;
#[cfg(feature = "gateway")]
pub(crate) use responses::json_response;
#[cfg(feature = "llm")]
pub use tokens::{Reservation, RouteUsage};
