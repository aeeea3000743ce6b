//! The one admission decision: the allowlist, the keys, one limiter call, the refusal or the delay, and the fields
//! an admitted response carries. The gateway's routes and the tower layer both call it, so that a capability
//! added here (an allowlist, a header, consumers) reaches both at once and they never decide a request apart.

use std::net::IpAddr;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, Response};
use ipnet::IpNet;

use super::limits::{LimitSet, Verdict};
use crate::key::RequestFacts;
use crate::limiter::RateLimiter;

/// What one route (or one layer) admits: its limits, the clients exempt from them, and whether admitted
/// responses carry the rate-limit fields.
#[derive(Debug, Clone)]
pub struct Policy {
    limits: LimitSet,
    /// Client networks exempt from `limits` (health checkers, internal callers).
    allow: Vec<IpNet>,
    /// Whether admitted responses get the rate-limit fields (refusals always do).
    headers: bool,
}

/// What admission decided for one request.
#[derive(Debug)]
pub enum Admission {
    /// The client is on the allowlist: no limit was asked, nothing was counted, and the response carries no fields.
    Exempt,
    /// Refused: the answer to send instead of the request's (429 or `deny_status`, 503 when the store failed and
    /// the policy is to refuse, 400 for an ambiguous key).
    Refused(Response<Body>),
    /// Admitted, once any delay a `leaky_bucket` in delay mode asked for has passed.
    Admitted(Verdict),
}

// === impl Policy ===

impl Policy {
    /// A policy of `limits`, exempting clients within `allow`, adding the fields to admitted responses when
    /// `headers`.
    pub fn new(limits: LimitSet, allow: Vec<IpNet>, headers: bool) -> Self {
        Self {
            limits,
            allow,
            headers,
        }
    }

    /// The limits.
    pub fn limits(&self) -> &LimitSet {
        &self.limits
    }

    /// Whether `client` is exempt from the limits.
    pub fn is_exempt(&self, client: IpAddr) -> bool {
        self.allow.iter().any(|net| net.contains(&client))
    }

    /// Decides the request `facts` describes: asks `limiter` once for all the limits that apply, and holds an
    /// admitted request for as long as a `leaky_bucket` in delay mode says.
    pub async fn admit(&self, limiter: &RateLimiter, facts: &RequestFacts<'_>) -> Admission {
        // Allowlisted clients skip the limits entirely: no store call, nothing counted against anyone.
        if self.is_exempt(facts.client_ip) {
            return Admission::Exempt;
        }
        let verdict = match self.limits.check(limiter, facts).await {
            Ok(verdict) => verdict,
            Err(error) => return Admission::Refused(self.limits.not_checked(&error)),
        };
        if !verdict.outcome.allowed {
            return Admission::Refused(self.limits.refusal(&verdict));
        }
        let delay_ms = self.limits.delay_ms(&verdict);
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        Admission::Admitted(verdict)
    }

    /// Adds the rate-limit fields of an admitted request to its response's `headers`, unless the policy says not
    /// to; an exempt request's response gets none.
    pub fn decorate(&self, admission: &Admission, headers: &mut HeaderMap) {
        if let (true, Admission::Admitted(verdict)) = (self.headers, admission) {
            self.limits.decorate(headers, verdict);
        }
    }
}
