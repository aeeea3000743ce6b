//! Applying a set of keyed limits to HTTP requests: keys, one limiter call, the refusal or the informational
//! headers. Shared by the gateway's routes and the tower layer.

mod headers;

use axum::body::Body;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use serde_json::json;

use crate::config::LimitSettings;
use crate::key::{store_key, RequestFacts};
use crate::limiter::store::LimitCheck;
use crate::limiter::{Outcome, RateLimiter, Unavailable};

/// The limits of one scope (a route), applied together: a request is admitted only if all admit it.
#[derive(Debug, Clone)]
pub struct LimitSet {
    scope: String,
    key_prefix: String,
    limits: Vec<LimitSettings>,
    deny_status: StatusCode,
    /// `RateLimit-Policy`, rendered once.
    policy: Option<HeaderValue>,
    /// `tollgate_decisions_total` of each limit, registered once.
    decisions: Vec<DecisionCounters>,
}

/// `tollgate_decisions_total{route,limit,decision}` of one limit.
#[derive(Debug, Clone)]
struct DecisionCounters {
    allowed: metrics::Counter,
    denied: metrics::Counter,
    shadow_denied: metrics::Counter,
}

/// What the limiter said about one request.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// The combined decision; `decisions[i]` belongs to `limits[applied[i]]`.
    pub outcome: Outcome,
    /// Indices of the limits that applied (a `missing: skip` limit may not).
    applied: Vec<usize>,
}

// === impl LimitSet ===

impl LimitSet {
    /// The limits of scope `scope` (the route name, part of every store key), refusing with `deny_status`.
    pub fn new(
        scope: &str,
        key_prefix: &str,
        limits: Vec<LimitSettings>,
        deny_status: StatusCode,
    ) -> Self {
        let policy = headers::policy(&limits);
        let decisions = limits
            .iter()
            .map(|settings| DecisionCounters::new(scope, settings.limit.name()))
            .collect();
        Self {
            scope: scope.to_owned(),
            key_prefix: key_prefix.to_owned(),
            limits,
            deny_status,
            policy,
            decisions,
        }
    }

    /// The scope's name.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The limits, in configuration order.
    pub fn limits(&self) -> &[LimitSettings] {
        &self.limits
    }

    /// The limit named `limit` and the store key it uses for the key value `value` (as `KeySpec::value` builds
    /// it: parts joined with `|`).
    pub fn key_for(&self, limit: &str, value: &str) -> Option<(String, &LimitSettings)> {
        let settings = self.limits.iter().find(|s| s.limit.name() == limit)?;
        Some((
            store_key(&self.key_prefix, &self.scope, limit, value),
            settings,
        ))
    }

    /// Builds the keys of `facts` and asks `limiter` once for all the limits that apply.
    pub async fn check(
        &self,
        limiter: &RateLimiter,
        facts: &RequestFacts<'_>,
    ) -> Result<Verdict, Unavailable> {
        let mut keys = Vec::with_capacity(self.limits.len());
        let mut applied = Vec::with_capacity(self.limits.len());
        for (index, settings) in self.limits.iter().enumerate() {
            if let Some(value) = settings.key.value(facts) {
                keys.push(store_key(
                    &self.key_prefix,
                    &self.scope,
                    settings.limit.name(),
                    &value,
                ));
                applied.push(index);
            }
        }
        let checks: Vec<LimitCheck<'_>> = keys
            .iter()
            .zip(&applied)
            .map(|(key, &index)| LimitCheck {
                key,
                limit: &self.limits[index].limit,
            })
            .collect();
        let outcome = limiter.check(&checks).await?;
        let verdict = Verdict { outcome, applied };
        self.count_decisions(&verdict);
        Ok(verdict)
    }

    /// `tollgate_decisions_total`: every limit of an admitted request counts as allowed; of a denied request
    /// only the denying limits count (the others consumed nothing and decided nothing).
    /// A shadow limit that denies counts as `shadow_denied` (and is logged), whatever the request's fate.
    fn count_decisions(&self, verdict: &Verdict) {
        for (i, decision) in verdict.outcome.decisions.iter().enumerate() {
            let Some(counters) = verdict.applied.get(i).and_then(|&l| self.decisions.get(l)) else {
                continue;
            };
            let shadow = self.is_shadow(verdict, i);
            let counter = match (shadow, verdict.outcome.allowed, decision.allowed) {
                (true, _, false) => {
                    tracing::info!(
                        scope = %self.scope,
                        limit = self.name_of(verdict, i),
                        retry_after_ms = decision.retry_after_ms,
                        "shadow limit would deny"
                    );
                    &counters.shadow_denied
                }
                (_, true, _) => &counters.allowed,
                (false, false, false) => &counters.denied,
                (_, false, true) => continue,
            };
            counter.increment(1);
        }
    }

    /// The answer to a denied request: `deny_status` (429 by default) with `Retry-After`, the rate-limit fields
    /// and a JSON body naming the limit.
    pub fn refusal(&self, verdict: &Verdict) -> Response<Body> {
        let (outcome, names) = self.enforced(verdict);
        let limit = outcome
            .most_restrictive()
            .and_then(|i| names.get(i).copied())
            .unwrap_or_default();
        let retry_after_ms = outcome.retry_after_ms();
        tracing::debug!(scope = %self.scope, limit, retry_after_ms, "rate limited");
        let body = json!({
            "error": "rate_limited",
            "route": self.scope,
            "limit": limit,
            "retry_after_ms": retry_after_ms,
        });
        let mut response = json_response(self.deny_status, &body);
        // At least 1: `Retry-After: 0` would invite an immediate retry that is still refused.
        let seconds = retry_after_ms.div_ceil(1000).max(1);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        self.decorate(response.headers_mut(), verdict);
        response
    }

    /// The answer when the store failed and the policy is `on_error: deny`.
    pub fn unavailable(&self, error: &Unavailable) -> Response<Body> {
        tracing::warn!(scope = %self.scope, %error, "refusing: limiter unavailable");
        let body = json!({"error": "limiter_unavailable", "route": self.scope});
        let mut response = json_response(StatusCode::SERVICE_UNAVAILABLE, &body);
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        response
    }

    /// Adds `X-RateLimit-*`, `RateLimit-Policy` and `RateLimit` describing `verdict`.
    pub fn decorate(&self, headers: &mut HeaderMap, verdict: &Verdict) {
        let (outcome, names) = self.enforced(verdict);
        headers::apply(headers, self.policy.as_ref(), &outcome, &names);
    }

    /// The decisions of the enforced limits only, with their names: what clients are told about.
    fn enforced<'a>(&'a self, verdict: &Verdict) -> (Outcome, Vec<&'a str>) {
        let (decisions, names) = verdict
            .outcome
            .decisions
            .iter()
            .enumerate()
            .filter(|&(i, _)| !self.is_shadow(verdict, i))
            .map(|(i, d)| (*d, self.name_of(verdict, i)))
            .unzip();
        let outcome = Outcome {
            allowed: verdict.outcome.allowed,
            decisions,
        };
        (outcome, names)
    }

    /// How long an admitted request must be held (`leaky_bucket` in delay mode); shadow limits hold nothing.
    pub fn delay_ms(&self, verdict: &Verdict) -> u64 {
        self.enforced(verdict).0.delay_ms()
    }

    fn is_shadow(&self, verdict: &Verdict, decision: usize) -> bool {
        verdict
            .applied
            .get(decision)
            .and_then(|&index| self.limits.get(index))
            .is_some_and(|settings| settings.limit.is_shadow())
    }

    fn name_of(&self, verdict: &Verdict, decision: usize) -> &str {
        verdict
            .applied
            .get(decision)
            .and_then(|&index| self.limits.get(index))
            .map_or("", |settings| settings.limit.name())
    }
}

// === impl DecisionCounters ===

impl DecisionCounters {
    fn new(scope: &str, limit: &str) -> Self {
        let counter = |decision: &'static str| {
            metrics::counter!(
                "tollgate_decisions_total",
                "route" => scope.to_owned(),
                "limit" => limit.to_owned(),
                "decision" => decision,
            )
        };
        Self {
            allowed: counter("allowed"),
            denied: counter("denied"),
            shadow_denied: counter("shadow_denied"),
        }
    }
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
