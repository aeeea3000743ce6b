//! The one admission decision: the allowlist, the keys, one limiter call, the refusal or the delay, and the fields
//! an admitted response carries. The gateway's routes and the tower layer both call it, so that a capability
//! added here (an allowlist, a header, consumers) reaches both at once and they never decide a request apart.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderValue, Request, Response};
use ipnet::IpNet;

use super::after_answer::{AfterAnswer, AnswerGuard};
use super::check::check;
use super::limits::{Checked, LimitRequest, LimitSet, Replaced};
use super::refusal::Refusal;
use super::reserve::Reserve;
use super::settle::StatusSettlement;
use super::slots::{Both, HeldSlots};
#[cfg(feature = "llm")]
use super::tokens::RouteUsage;
use super::wait::hold_for_delay;
use crate::consumers::{Caller, CallerRefusal, ConsumerMode, Consumers};
use crate::head_lines::HeadLines;
use crate::key::{AmbiguousKey, LimitSettings, RequestFacts};
use crate::limiter::RateLimiter;
use crate::top_keys::LimitTop;
use crate::trail::Trail;

/// What one route (or one layer) admits: its limits, the clients exempt from them, and whether admitted
/// responses carry the rate-limit fields.
#[derive(Debug, Clone)]
pub struct Policy {
    limits: LimitSet,
    /// Client networks exempt from `limits` (health checkers, internal callers).
    allow: Vec<IpNet>,
    /// Whether admitted responses get the rate-limit fields (refusals always do).
    headers: bool,
    /// Consumers and plans, when the config has a `consumers:` block.
    consumers: Option<PolicyConsumers>,
    /// The tests of the after-the-answer seam: work made for every admitted request, whatever its limits keep.
    /// Only in the crate's own tests: a running gateway keeps only what its limits make.
    #[cfg(test)]
    after_answer: Option<AfterAnswerMaker>,
    /// How the route's answers report the tokens they cost, on a route with `usage:`.
    #[cfg(feature = "llm")]
    usage: Option<Arc<RouteUsage>>,
    /// The bits of an IPv6 client address that key it (`client_ip.ipv6_prefix`).
    ipv6_prefix: u8,
    /// Whether the route matches paths in any case (a `path` key part then counts them in lower case).
    path_any_case: bool,
}

/// Makes the [`AfterAnswer`] work of one admitted request.
#[cfg(test)]
#[derive(Clone)]
struct AfterAnswerMaker(Arc<dyn Fn() -> Box<dyn AfterAnswer> + Send + Sync>);

#[cfg(test)]
impl std::fmt::Debug for AfterAnswerMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AfterAnswerMaker")
    }
}

/// How a route treats callers (see docs/configuration.md, "Consumers and plans").
#[derive(Debug, Clone)]
pub(super) struct PolicyConsumers {
    pub(super) mode: ConsumerMode,
    pub(super) consumers: Arc<Consumers>,
    /// Per plan (indexed as [`Consumers::plans`]): the route's limits followed by the plan's.
    with_plan: Vec<LimitSet>,
}

/// An admitted request: what the limiter said, and who called.
#[derive(Debug)]
pub struct Admitted {
    /// The limiter's answer.
    pub checked: Checked,
    /// The identified caller, on a route that identifies callers. Boxed: an admission is held while the request
    /// is forwarded, and routes without consumers should not carry room for one.
    pub caller: Option<Box<Caller>>,
    /// What runs once the answer ends, when the request's limits keep anything for after it.
    pub after: Option<AnswerGuard>,
}

/// What admission decided for one request.
#[derive(Debug)]
pub enum Admission {
    /// The client is on the allowlist: no limit was asked, nothing was counted, and the response carries no fields.
    Exempt,
    /// Refused, and why: the entry point answers it ([`answer`](super::answer) for HTTP).
    Refused(Refusal),
    /// Admitted, once any delay a `leaky_bucket` in delay mode asked for has passed.
    Admitted(Admitted),
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
            consumers: None,
            #[cfg(test)]
            after_answer: None,
            #[cfg(feature = "llm")]
            usage: None,
            ipv6_prefix: 64,
            path_any_case: false,
        }
    }

    /// The same policy keying IPv6 clients by their network of `bits` (`client_ip.ipv6_prefix`; 64 unless said).
    pub fn with_ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// The same policy on a route that matches paths in any case (`yes`) or with regard to it: a `path` key part
    /// then counts them in lower case. A layer has no routes: with regard to case, unless said.
    pub fn matching_paths_in_any_case(mut self, yes: bool) -> Self {
        self.path_any_case = yes;
        self
    }

    /// The bits of an IPv6 client address that key it.
    pub(super) fn ipv6_prefix(&self) -> u8 {
        self.ipv6_prefix
    }

    /// Whether the route matches paths in any case.
    pub(super) fn matches_paths_in_any_case(&self) -> bool {
        self.path_any_case
    }

    /// The same policy on a route whose answers report their tokens as `usage` says: its requests reserve on its
    /// token limits, and on the token limits of the plans added after this.
    #[cfg(feature = "llm")]
    pub fn with_usage(mut self, usage: Arc<RouteUsage>) -> Self {
        self.limits = self.limits.reserving_tokens();
        self.usage = Some(usage);
        self
    }

    /// The route's `usage:`, when it has one: its requests' bodies are read and reserve tokens.
    #[cfg(feature = "llm")]
    pub fn usage(&self) -> Option<&Arc<RouteUsage>> {
        self.usage.as_ref()
    }

    /// The same policy making `work` for every admitted request, to run when its answer ends. For the tests of
    /// the seam; the capabilities that keep work for after the answer make theirs from their limits.
    #[cfg(test)]
    pub(crate) fn with_after_answer(
        mut self,
        work: impl Fn() -> Box<dyn AfterAnswer> + Send + Sync + 'static,
    ) -> Self {
        self.after_answer = Some(AfterAnswerMaker(Arc::new(work)));
        self
    }

    /// The same policy identifying callers as `mode` says, with the plans of `consumers` (stores keys under
    /// `key_prefix`). Even with `mode` off, copies of the forwarded consumer headers sent by clients are dropped.
    pub fn with_consumers(
        mut self,
        mode: ConsumerMode,
        consumers: Arc<Consumers>,
        key_prefix: &str,
    ) -> Self {
        let with_plan = match mode {
            ConsumerMode::Off => Vec::new(),
            ConsumerMode::Optional | ConsumerMode::Required => consumers
                .plans()
                .iter()
                .map(|plan| self.limits.with_plan(plan, key_prefix))
                .collect(),
        };
        self.consumers = Some(PolicyConsumers {
            mode,
            consumers,
            with_plan,
        });
        self
    }

    /// The limits.
    pub fn limits(&self) -> &LimitSet {
        &self.limits
    }

    /// Each limit its requests may be counted by, with its top keys: the route's, then each plan's (named
    /// `<plan>.<limit>`).
    pub fn tops(&self) -> impl Iterator<Item = (&LimitSettings, &LimitTop)> + '_ {
        let own = self.limits.limits().len();
        let plans = self
            .consumers
            .iter()
            .flat_map(|c| &c.with_plan)
            .flat_map(move |set| set.tops().skip(own));
        self.limits.tops().chain(plans)
    }

    /// The `max` of each `concurrency` limit its requests may be counted by (a plan's too), by the head of its
    /// store keys.
    pub fn slot_maxes(&self) -> impl Iterator<Item = (String, u64)> + '_ {
        let plans = self.consumers.iter().flat_map(|c| &c.with_plan);
        std::iter::once(&self.limits)
            .chain(plans)
            .flat_map(LimitSet::slot_maxes)
    }

    /// Whether `client` is exempt from the limits.
    pub fn is_exempt(&self, client: IpAddr) -> bool {
        self.allow.iter().any(|net| net.contains(&client))
    }

    /// Decides the request `facts` describes: identifies its caller where the route does (refusing with 401, 403
    /// or 400), asks `limiter` once for the route's limits and the caller's plan's, the token limits for what
    /// `reserve` reserves on them ([`NoReservation`](super::NoReservation) off a route with `usage:`), and holds
    /// an admitted request for as long as a `leaky_bucket` in delay mode says. The caller goes on `trail`, when the
    /// request has one.
    pub async fn admit<R: Reserve>(
        &self,
        limiter: &RateLimiter,
        facts: &RequestFacts<'_>,
        reserve: R,
        trail: Option<&Arc<Trail>>,
    ) -> Admission {
        // Allowlisted clients skip the limits entirely: no store call, nothing counted against anyone.
        if self.is_exempt(facts.client_ip) {
            return Admission::Exempt;
        }
        let caller = match self.identify(limiter, facts).await {
            Ok(caller) => caller,
            Err(refusal) => return Admission::Refused(refusal),
        };
        if let (Some(trail), Some(caller)) = (trail, caller.as_deref()) {
            trail.note_caller(caller.consumer.as_ref(), self.plan_name(caller));
        }
        let limits = self.limits_for(caller.as_deref());
        let identified;
        let (facts, replaced) = match caller.as_deref() {
            None => (facts, None),
            Some(caller) => {
                identified = self.identified(facts, Some(caller));
                let replaced = caller
                    .overrides
                    .clone()
                    .map(|overrides| Replaced::new(self.limits.limits().len(), overrides));
                (&identified, replaced)
            }
        };
        let plan = caller.as_deref().and_then(|caller| caller.plan);
        let request = LimitRequest {
            facts,
            replaced,
            reserve,
        };
        let (checked, asked) =
            match check(limiter, limits, request, plan, trail.map(|t| &**t)).await {
                Ok(checked) => checked,
                Err(refusal) => return Admission::Refused(refusal),
            };
        let delay_ms = limits.delay_ms(&checked);
        if delay_ms > 0 {
            hold_for_delay(limiter, limits, facts, &checked, delay_ms).await;
        }
        let after = self.kept_for_after(limiter, limits, facts, &checked, asked, reserve);
        Admission::Admitted(Admitted {
            checked,
            caller,
            after,
        })
    }

    /// The work an admitted request keeps for after its answer, when its limits keep any: the give-backs of
    /// limits that count by status and of token reservations (asked at `asked`), and its concurrency slots.
    fn kept_for_after<R: Reserve>(
        &self,
        limiter: &RateLimiter,
        limits: &LimitSet,
        facts: &RequestFacts<'_>,
        checked: &Checked,
        asked: Option<Instant>,
        reserve: R,
    ) -> Option<AnswerGuard> {
        // Boxed, and only on routes whose limits keep work for after the answer: one box for statuses and tokens.
        let mut after: Option<Box<dyn AfterAnswer>> = asked.and_then(|asked| {
            let giver = limiter.giver(checked.decided_by);
            let statuses = limits.counts_statuses().then(|| {
                let taken = limits.taken_by_status(facts, checked);
                StatusSettlement::new(giver.clone(), taken, asked)
            });
            reserve.settlement(limits, facts, checked, giver, asked, statuses)
        });
        if limits.holds_slots() {
            after = Some(self.hold_slots(limiter, limits, facts, checked, after));
        }
        #[cfg(test)]
        let after = after.or_else(|| self.after_answer.as_ref().map(|make| (make.0)()));
        after.map(AnswerGuard::new)
    }

    /// The slots an admitted request took, to be released when its answer ends, beside the work `other` keeps for
    /// then. Out of line: routes without a concurrency limit never come here.
    #[inline(never)]
    fn hold_slots(
        &self,
        limiter: &RateLimiter,
        limits: &LimitSet,
        facts: &RequestFacts<'_>,
        checked: &Checked,
        other: Option<Box<dyn AfterAnswer>>,
    ) -> Box<dyn AfterAnswer> {
        let held = limits.slots_taken(facts, checked);
        let giver = limiter.giver(checked.decided_by);
        let slots = Box::new(HeldSlots::new(
            giver,
            held,
            checked.lease,
            Arc::clone(limiter.slot_queues()),
        ));
        match other {
            None => slots,
            Some(other) => Box::new(Both(other, slots)),
        }
    }

    /// The store keys a request would be counted under, its caller identified, without asking the limiter: none
    /// when the caller is refused (nothing is counted then), an error when a key part or credential occurs twice.
    pub(super) fn keys(&self, facts: &RequestFacts<'_>) -> Result<Vec<String>, AmbiguousKey> {
        let caller = match self
            .identifying()
            .map(|p| p.consumers.identify(facts, p.mode))
        {
            None => None,
            Some(Ok(caller)) => Some(caller),
            Some(Err(CallerRefusal::Ambiguous)) => return Err(AmbiguousKey),
            Some(Err(_)) => return Ok(Vec::new()),
        };
        let identified = self.identified(facts, caller.as_ref());
        self.limits_for(caller.as_ref()).keys(&identified)
    }

    /// Adds the rate-limit fields of an admitted request to its response: to `lines` where the entry point gives
    /// them (the upstream's own copies then taken out of the map), else to its map; unless the policy says not to.
    /// An exempt request (`None`) gets none.
    pub(super) fn decorate<R>(
        &self,
        admitted: Option<&Admitted>,
        response: &mut Response<R>,
        lines: Option<&mut HeadLines>,
    ) {
        let (true, Some(admitted)) = (self.headers, admitted) else {
            return;
        };
        let limits = self.limits_for(admitted.caller.as_deref());
        if let Some(lines) = lines {
            if limits.decorate_lines(lines, &admitted.checked) {
                // The answer's own (an upstream's) are taken out with its `x-request-id`, in one pass.
                lines.hold_rate_limit_fields();
                return;
            }
        }
        limits.decorate(response.headers_mut(), &admitted.checked);
    }

    /// Sets the forwarded consumer headers (`consumers.forward`) on the request going upstream: the identified
    /// caller's, and never a client's own copies, whatever the route and the decision; and takes out the
    /// credential that named the caller where its identifier hides it (`hide_credentials`).
    pub(super) fn forward_caller<B>(&self, admitted: Option<&Admitted>, request: &mut Request<B>) {
        let Some(policy) = &self.consumers else {
            return;
        };
        let forward = policy.consumers.forward();
        let headers = request.headers_mut();
        for name in [&forward.consumer, &forward.plan].into_iter().flatten() {
            headers.remove(name);
        }
        let Some(caller) = admitted.and_then(|admitted| admitted.caller.as_deref()) else {
            return;
        };
        if let Some(hidden) = &caller.hidden {
            crate::consumers::hide(hidden, request);
        }
        let headers = request.headers_mut();
        let values = [
            (&forward.consumer, caller.consumer.as_deref()),
            (&forward.plan, self.plan_name(caller)),
        ];
        for (name, value) in values {
            // Ids and plan names are validated to be header-safe.
            if let (Some(name), Some(Ok(value))) = (name, value.map(HeaderValue::from_str)) {
                headers.insert(name, value);
            }
        }
    }

    /// Whether the policy has nothing to decide, add or keep for any request: no limits and no consumers. Every
    /// capability that acts on admitted requests lives in one of these two (work kept for after the answer comes
    /// from limits), so that a route without either pays nothing for admission.
    pub(crate) fn decides_nothing(&self) -> bool {
        #[cfg(test)]
        if self.after_answer.is_some() {
            return false;
        }
        self.limits.is_empty() && self.consumers.is_none()
    }

    /// The consumers of a route that identifies callers.
    pub(super) fn identifying(&self) -> Option<&PolicyConsumers> {
        self.consumers
            .as_ref()
            .filter(|policy| policy.mode != ConsumerMode::Off)
    }

    /// The limits that apply to a caller: the route's, and its plan's.
    fn limits_for(&self, caller: Option<&Caller>) -> &LimitSet {
        self.limits_for_plan(caller.and_then(|caller| caller.plan))
    }

    /// The limits checked for a caller on `plan`: the route's, and the plan's.
    pub(super) fn limits_for_plan(&self, plan: Option<usize>) -> &LimitSet {
        let plan_limits = self
            .consumers
            .as_ref()
            .and_then(|policy| policy.with_plan.get(plan?));
        plan_limits.unwrap_or(&self.limits)
    }

    /// `WWW-Authenticate` of the 401 this policy gives, on a route with consumers.
    pub(super) fn challenges(&self) -> Option<&HeaderValue> {
        Some(self.consumers.as_ref()?.consumers.challenges())
    }

    /// `facts` with the caller's consumer id and plan name, for the key parts that use them.
    fn identified<'f>(
        &'f self,
        facts: &RequestFacts<'f>,
        caller: Option<&'f Caller>,
    ) -> RequestFacts<'f> {
        match caller {
            Some(caller) => RequestFacts {
                consumer: caller.consumer.as_deref(),
                plan: self.plan_name(caller),
                ..*facts
            },
            None => *facts,
        }
    }

    /// Notes on `trail` the limit that refused a request, when a limit did, and the shadow limits that would have.
    #[cold]
    pub(super) fn note_refusal(&self, trail: &Trail, refusal: &Refusal) {
        if let Refusal::RateLimited { checked, plan } = refusal {
            let limits = self.limits_for_plan(*plan);
            trail.note_refusing_limit(limits.denial(checked).0);
            trail.note_shadow_denials(limits.shadow_denials(checked));
        }
    }

    /// Notes on `trail` that `admitted` was, and the shadow limits that would have refused it.
    #[cold]
    pub(super) fn note_admitted(&self, trail: &Trail, admitted: &Admitted) {
        trail.note_admitted();
        let limits = self.limits_for(admitted.caller.as_deref());
        trail.note_shadow_denials(limits.shadow_denials(&admitted.checked));
    }

    fn plan_name(&self, caller: &Caller) -> Option<&str> {
        let policy = self.consumers.as_ref()?;
        let plan = policy.consumers.plans().get(caller.plan?)?;
        Some(plan.name.as_str())
    }
}
