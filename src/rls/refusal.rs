//! Admission's typed refusal as gRPC: the one place a [`Refusal`] becomes Envoy's answer or a gRPC status, as
//! admission's `responses.rs` is the one place it becomes an HTTP answer.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use tonic::Status;

use super::answer;
use super::decide::Decided;
use super::domains::{HeaderNames, WhenUnavailable};
use crate::admission::Refusal;
use crate::consumers::CallerRefusal;

/// How the running `rls:` section says answers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Answering {
    /// What a failed store answers when `on_error` refuses (`rls.when_unavailable`).
    pub when_unavailable: WhenUnavailable,
    /// Whether the rate-limit fields include `X-RateLimit-*`.
    pub x_ratelimit_headers: bool,
    /// Which names the other rate-limit fields go by.
    pub headers: HeaderNames,
}

/// The `code` of `tollgate_rls_requests_total` an answer counts under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Code {
    /// Admitted.
    Ok = 0,
    /// Refused by a limit.
    OverLimit = 1,
    /// The store failed and `on_error` refused, whatever the answer says of it.
    Unavailable = 2,
}

impl Code {
    /// Every code, each at its own index.
    pub(super) const ALL: [Code; 3] = [Code::Ok, Code::OverLimit, Code::Unavailable];

    /// The label's value.
    pub(super) fn label(self) -> &'static str {
        match self {
            Code::Ok => "ok",
            Code::OverLimit => "over_limit",
            Code::Unavailable => "unavailable",
        }
    }
}

/// Envoy's answer to a request its limits were asked about: OK with every descriptor's status and the rate-limit
/// fields; OVER_LIMIT with the same when a limit refused it (nothing taken from any); when the store failed and
/// `on_error` refuses, UNAVAILABLE (Envoy then applies its filter's `failure_mode_deny`) or, under
/// `when_unavailable: over_limit`, every descriptor OVER_LIMIT.
pub(super) fn answer(decided: &Decided<'_>, how: Answering) -> Result<RateLimitResponse, Status> {
    match &decided.refusal {
        None | Some(Refusal::RateLimited { .. }) => Ok(answer::response(
            decided,
            how.x_ratelimit_headers,
            how.headers,
        )),
        Some(refusal @ Refusal::Unavailable(error)) => {
            // The limiter logs the outage once per reason; a line per request would flood the log.
            tracing::debug!(%error, "rls: store unavailable");
            match how.when_unavailable {
                WhenUnavailable::Unavailable => Err(status(refusal)),
                WhenUnavailable::OverLimit => {
                    Ok(answer::every_descriptor_over(decided.found.len()))
                }
            }
        }
        Some(refusal) => Err(status(refusal)),
    }
}

/// The code `decided`'s answer counts under.
pub(super) fn code(decided: &Decided<'_>) -> Code {
    match &decided.refusal {
        None => Code::Ok,
        Some(Refusal::Unavailable(_)) => Code::Unavailable,
        Some(_) => Code::OverLimit,
    }
}

/// The gRPC status of `refusal`: what a request refused before its limits are asked is answered with (a request
/// that is not one the service can decide: INVALID_ARGUMENT). Refusals only HTTP entry points give have the status
/// gRPC's conventions give their HTTP answer.
pub(super) fn status(refusal: &Refusal) -> Status {
    match refusal {
        Refusal::Invalid(reason) => Status::invalid_argument(*reason),
        Refusal::Unavailable(_) => Status::unavailable("rate limit store unavailable"),
        Refusal::RateLimited { .. } | Refusal::TooManyFailedCredentials { .. } => {
            Status::resource_exhausted("rate limited")
        }
        Refusal::Unreadable(refusal) => Status::invalid_argument(refusal.to_string()),
        Refusal::AmbiguousKey => {
            Status::invalid_argument("a value used as a rate-limit key occurs more than once")
        }
        #[cfg(feature = "llm")]
        Refusal::BodyUnreadable(error) => Status::invalid_argument(error.to_string()),
        Refusal::NoRoute { .. } => Status::not_found("no route"),
        Refusal::Caller(CallerRefusal::Blocked) => Status::permission_denied("consumer blocked"),
        Refusal::Caller(CallerRefusal::Ambiguous) => {
            Status::invalid_argument("a credential is sent more than once")
        }
        Refusal::Caller(CallerRefusal::DirectoryUnavailable) => {
            Status::unavailable("the consumer directory cannot be read")
        }
        Refusal::Caller(_) => Status::unauthenticated("credential missing or not valid"),
        Refusal::ReservationTooLarge { .. } | Refusal::BodyTooLarge => {
            Status::out_of_range("the request is larger than a limit ever holds")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_stands_at_its_own_index() {
        // The service's counters are an array indexed by the code.
        for (index, code) in Code::ALL.into_iter().enumerate() {
            assert_eq!(code as usize, index, "{}", code.label());
        }
    }
}
