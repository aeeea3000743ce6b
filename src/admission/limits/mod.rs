//! A set of keyed limits applied to a request: its keys, one limiter call for them all, the refusal or the
//! informational fields.

mod answer;
mod queue;

pub(super) use queue::QueuedRefusal;

use std::sync::Arc;

use http::header::HeaderValue;
use http::StatusCode;
use smallvec::SmallVec;

use super::counters::{Counted, DecisionCounters};
use super::headers;
use super::reserve::{NoReservation, Reserve};
use crate::consumers::Plan;
use crate::key::{
    key_head, key_with_head, AmbiguousKey, KeySpec, LimitSettings, RequestFacts, StatusSet,
    TokenKind, PLAN_KEY_SCOPE,
};
use crate::limiter::store::{LimitCheck, INLINE_LIMITS};
use crate::limiter::{DecidedBy, Limit, Outcome, RateLimiter, Unavailable};
use crate::top_keys::{LimitTop, Seen, WATCH};

/// The limits of one scope (a route), applied together: a request is admitted only if all admit it.
#[derive(Debug, Clone)]
pub struct LimitSet {
    scope: String,
    /// Each limit with what the set worked out for it once, in configuration order.
    limits: Vec<SetLimit>,
    deny_status: StatusCode,
    /// The distinct ways the limits build their key (usually one: `ip` on every limit), each worked out once
    /// per request.
    key_specs: Vec<KeySpec>,
    /// Room for a request's keys: every head, and an IPv4 address with the closing brace after each.
    keys_capacity: usize,
    /// `RateLimit-Policy`, rendered once.
    policy: Option<HeaderValue>,
    /// Whether some limit counts answers by status: an admitted request then keeps work for after its answer.
    counts_statuses: bool,
    /// Whether some limit is a `concurrency` limit: an admitted request then holds slots until its answer ends.
    holds_slots: bool,
    /// Whether some limit counts calendar windows, whose `RateLimit-Policy` `w` is the length of the window a
    /// request falls in (a month of 28 to 31 days): the field is then rendered per request.
    calendar: bool,
    /// Whether some limit counts tokens (and applies).
    counts_tokens: bool,
    /// Whether the set's requests reserve tokens (its route reads `usage:`). A plan's token limits added to a set
    /// that does not never apply: tokens are spent only on routes that say how their answers report them.
    reserves_tokens: bool,
    /// The key spec slot of the limits that never apply (a plan's token limits on a route without `usage:`): its
    /// value is taken as absent, so those limits are skipped as a `missing: skip` limit is.
    inert_spec: Option<usize>,
}

/// One limit of a set, with what the set works out for it once rather than per request.
#[derive(Debug, Clone)]
struct SetLimit {
    settings: LimitSettings,
    /// Its key spec's index in the set's `key_specs`.
    spec: usize,
    /// The store key up to its value, `<prefix><route>:<limit>:{`.
    head: String,
    /// What the response fields say of it whatever the decision.
    advertised: headers::Advertised,
    /// Its `tollgate_decisions_total`, registered once.
    decisions: DecisionCounters,
    /// `tollgate_in_flight` of a `concurrency` limit.
    in_flight: Option<metrics::Gauge>,
    /// `tollgate_queue_wait_seconds` of a `concurrency` limit with a queue.
    queue_wait: Option<metrics::Histogram>,
    /// Its heaviest keys of the last minutes (`GET /top`), shared by the set's clones.
    top: Arc<LimitTop>,
}

/// A request's limits, checked: the limiter's [`Outcome`] and which limits of the set it covers.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The combined decision; `decisions[i]` belongs to `limits[applied[i]]`.
    pub outcome: Outcome,
    /// Indices of the limits that applied (a `missing: skip` limit may not).
    applied: SmallVec<[usize; INLINE_LIMITS]>,
    /// The limits replaced for this request, if any.
    replaced: Option<Replaced>,
    /// Which store decided: where what the request took goes back if it must (see [`LimitSet::taken`]).
    pub decided_by: DecidedBy,
    /// The lease its `concurrency` limits' slots are held under in Redis (0: none).
    pub lease: u64,
    /// When it was checked, in whole seconds of the limiter's clock (0: not asked), for a set with calendar
    /// windows: which window its fields describe. Seconds lose nothing of that (calendar boundaries fall on whole
    /// seconds), and fit where the struct had room: a request without calendar limits carries nothing more.
    calendar_at_s: u32,
}

/// Limits of a set replaced for one request (a consumer's overrides of its plan, docs/configuration.md, "Consumers and plans").
#[derive(Debug, Clone)]
pub struct Replaced {
    /// The index in the set of the first limit `limits` counts from.
    offset: usize,
    /// Each replaced limit with its index counted from `offset`.
    limits: Arc<[(usize, Limit)]>,
}

/// One request as a set's limits are checked for it.
#[derive(Debug, Clone)]
pub struct LimitRequest<'f, R = NoReservation> {
    /// What the keys are made of.
    pub facts: &'f RequestFacts<'f>,
    /// The set's limits a consumer's overrides replace for this request, if any.
    pub replaced: Option<Replaced>,
    /// What the request reserves on the token limits ([`NoReservation`] off a route with `usage:`).
    pub reserve: R,
}

impl<'f> LimitRequest<'f> {
    /// A request of `facts`, checked against the set's own limits, reserving nothing.
    pub fn of(facts: &'f RequestFacts<'f>) -> Self {
        Self {
            facts,
            replaced: None,
            reserve: NoReservation,
        }
    }
}

/// Why a request was not decided by the limiter.
#[derive(Debug, thiserror::Error)]
pub enum NotChecked {
    /// A key part occurs more than once in the request: refused (400) rather than counted on a guess.
    #[error(transparent)]
    Ambiguous(#[from] AmbiguousKey),
    /// The store failed and the policy is to refuse.
    #[error(transparent)]
    Unavailable(#[from] Unavailable),
    /// A reservation larger than its limit could ever hold: no wait would admit it.
    #[error("the request reserves {reserved} on {limit}, which holds at most {capacity}")]
    TooLarge {
        /// The limit, as advertised.
        limit: String,
        /// What the request reserves.
        reserved: u64,
        /// What the limit holds.
        capacity: u64,
    },
}

/// The store keys of one request, one per limit that applies, one after another in one string.
pub(super) struct RequestKeys {
    text: String,
    /// Per key: the index of its limit and where the key ends in `text`.
    ends: SmallVec<[(usize, usize); INLINE_LIMITS]>,
}

/// Where the value of one key spec stands in a request's keys, once written.
#[derive(Debug, Clone)]
enum Written {
    NotYet,
    /// The limits keyed by it do not apply (`missing: skip`).
    Skipped,
    /// Its value, sealed (digested if need be, brace closed), as the first key that uses it ends.
    At(std::ops::Range<usize>),
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
        let mut set = Self {
            scope: scope.to_owned(),
            limits: Vec::with_capacity(limits.len()),
            deny_status,
            key_specs: Vec::new(),
            keys_capacity: 0,
            policy: None,
            counts_statuses: false,
            holds_slots: false,
            calendar: false,
            counts_tokens: false,
            reserves_tokens: false,
            inert_spec: None,
        };
        for settings in limits {
            let head = key_head(key_prefix, scope, settings.limit.name());
            let counters =
                DecisionCounters::new(&[("route", scope), ("limit", settings.limit.name())]);
            set.push(settings, head, counters, (false, false));
        }
        set.policy = headers::policy(set.limits().map(|s| &s.limit), None);
        set
    }

    /// These limits and those of `plan` (see docs/configuration.md, "Consumers and plans"), checked together in one call. The plan's limits are
    /// advertised and reported as `<plan>.<limit>`, and keyed across routes as
    /// `<prefix>consumer:<limit>:{<value>}`, so every route a consumer calls draws on one state.
    pub fn with_plan(&self, plan: &Plan, key_prefix: &str) -> Self {
        let mut set = self.clone();
        for settings in &plan.limits {
            let name = settings.limit.name();
            let head = key_head(key_prefix, PLAN_KEY_SCOPE, name);
            let counters = DecisionCounters::new(&[
                ("route", &self.scope),
                ("limit", name),
                ("plan", &plan.name),
            ]);
            let advertised = LimitSettings {
                limit: settings
                    .limit
                    .clone()
                    .with_name(format!("{}.{name}", plan.name)),
                key: settings.key.clone(),
                counts: settings.counts.clone(),
            };
            let inert = settings.counts.tokens().is_some() && !set.reserves_tokens;
            set.push(advertised, head, counters, (inert, true));
        }
        set.policy = headers::policy(set.advertised_limits(), None);
        set
    }

    /// The limits `RateLimit-Policy` names: those that may apply.
    fn advertised_limits(&self) -> impl Iterator<Item = &Limit> + '_ {
        self.limits
            .iter()
            .filter(|l| Some(l.spec) != self.inert_spec)
            .map(|l| &l.settings.limit)
    }

    /// The same set, its requests reserving tokens (the route reads `usage:`): the plans added after this count
    /// tokens on it.
    pub fn reserving_tokens(mut self) -> Self {
        self.reserves_tokens = true;
        self
    }

    /// Adds one limit, keyed under `head`, counted in `counters`; an `inert` one never applies; a `plan`'s keeps
    /// the consumers nearest it too.
    fn push(
        &mut self,
        settings: LimitSettings,
        head: String,
        counters: DecisionCounters,
        (inert, plan): (bool, bool),
    ) {
        let spec = if inert {
            *self.inert_spec.get_or_insert_with(|| {
                self.key_specs.push(settings.key.clone());
                self.key_specs.len() - 1
            })
        } else {
            self.key_specs
                .iter()
                .enumerate()
                .position(|(i, spec)| *spec == settings.key && Some(i) != self.inert_spec)
                .unwrap_or_else(|| {
                    self.key_specs.push(settings.key.clone());
                    self.key_specs.len() - 1
                })
        };
        self.keys_capacity += head.len() + 16;
        self.counts_statuses |= settings.counts.statuses().is_some();
        self.counts_tokens |= settings.counts.tokens().is_some() && !inert;
        let algorithm = settings.limit.algorithm();
        self.holds_slots |= algorithm.holds_slots();
        self.calendar |= algorithm.calendar().is_some() && !inert;
        let labels = || {
            [
                ("route", self.scope.clone()),
                ("limit", settings.limit.name().to_owned()),
            ]
        };
        let in_flight = algorithm
            .holds_slots()
            .then(|| metrics::gauge!("tollgate_in_flight", &labels()));
        let queue_wait = algorithm
            .slot_queue()
            .map(|_| metrics::histogram!("tollgate_queue_wait_seconds", &labels()));
        self.limits.push(SetLimit {
            advertised: headers::Advertised::new(&settings.limit),
            settings,
            spec,
            head,
            decisions: counters,
            in_flight,
            queue_wait,
            top: Arc::new(match plan {
                true => LimitTop::for_plan(),
                false => LimitTop::default(),
            }),
        });
    }

    /// The scope's name.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// Whether the set has no limit.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// Each limit with its heaviest keys of the last minutes, in configuration order.
    pub fn tops(&self) -> impl Iterator<Item = (&LimitSettings, &LimitTop)> + '_ {
        self.limits
            .iter()
            .map(|limit| (&limit.settings, &*limit.top))
    }

    /// The limits, in configuration order.
    pub fn limits(&self) -> impl ExactSizeIterator<Item = &LimitSettings> + Clone + '_ {
        self.limits.iter().map(|limit| &limit.settings)
    }

    /// The limit named `limit` and the store key it uses for the key value `value` (as `KeySpec::value` builds
    /// it: parts joined with `|`).
    pub fn key_for(&self, limit: &str, value: &str) -> Option<(String, &LimitSettings)> {
        let limit = self
            .limits
            .iter()
            .find(|l| l.settings.limit.name() == limit)?;
        Some((key_with_head(&limit.head, value), &limit.settings))
    }

    /// Builds the request's keys and asks `limiter` once for all the limits that apply: the set's own, or what
    /// replaces them for this caller, each token limit at what the request reserves on it.
    pub async fn check<R: Reserve>(
        &self,
        limiter: &RateLimiter,
        request: LimitRequest<'_, R>,
    ) -> Result<Checked, NotChecked> {
        let LimitRequest {
            facts,
            replaced,
            reserve,
        } = request;
        let keys = self.request_keys(facts)?;
        let reserved: R::Reserved = self.reserved(&keys, replaced.as_ref(), reserve)?;
        let checks: SmallVec<[LimitCheck<'_>; INLINE_LIMITS]> = keys
            .iter()
            .map(|(index, key)| LimitCheck {
                key,
                limit: reserved
                    .as_ref()
                    .iter()
                    .find(|(reserved, _)| *reserved == index)
                    .map_or_else(|| self.limit_at(index, replaced.as_ref()), |(_, l)| l),
            })
            .collect();
        let lease = if self.holds_slots {
            limiter.new_lease()
        } else {
            0
        };
        let applied = keys.ends.iter().map(|&(index, _)| index).collect();
        let answer = limiter.check_leased(&checks, lease).await?;
        let mut checked = Checked::answered(answer, applied, lease);
        drop(checks);
        checked.replaced = replaced;
        if self.calendar {
            let seconds = limiter.local().now_ms().div_euclid(1_000);
            checked.calendar_at_s = u32::try_from(seconds).unwrap_or(u32::MAX);
        }
        // A request refused only for want of a slot it may wait for is counted once it is admitted or refused for
        // good (see `queue.rs`), not at each time it asks.
        if checked.outcome.allowed || !self.holds_slots || self.queued_refusal(&checked).is_none() {
            self.count_decisions(facts, &checked, Some(&keys));
        }
        Ok(checked)
    }

    /// Each token limit of `keys` with what `reserve` reserves on it as its cost; refused when a reservation is
    /// larger than its limit could ever hold (a shadow limit only observes, and refuses nothing).
    fn reserved<R: Reserve>(
        &self,
        keys: &RequestKeys,
        replaced: Option<&Replaced>,
        reserve: R,
    ) -> Result<R::Reserved, NotChecked> {
        if !reserve.reserves() {
            return Ok(std::iter::empty().collect());
        }
        let mut too_large = None;
        let reserved = keys
            .iter()
            .filter_map(|(index, _)| {
                let kind = self.limits[index].settings.counts.tokens()?;
                let limit = self.limit_at(index, replaced);
                let amount = reserve.tokens(kind);
                let capacity = limit.algorithm().capacity();
                if amount > capacity && !limit.is_shadow() && too_large.is_none() {
                    too_large = Some(NotChecked::TooLarge {
                        limit: self.limits[index].settings.limit.name().to_owned(),
                        reserved: amount,
                        capacity,
                    });
                }
                Some((index, limit.clone().with_cost(amount)))
            })
            .collect();
        match too_large {
            Some(refusal) => Err(refusal),
            None => Ok(reserved),
        }
    }

    /// What an admitted request reserved on its token limits as `reserve` says: the store key, the limit with the
    /// reservation as its cost, and what it counts, owned, for the settlement once its answer ends.
    pub fn taken_tokens<R: Reserve>(
        &self,
        facts: &RequestFacts<'_>,
        checked: &Checked,
        reserve: R,
    ) -> Vec<(String, Limit, TokenKind)> {
        self.each_taken(facts, checked, |index, key, limit| {
            let kind = self.limits[index].settings.counts.tokens()?;
            Some((
                key.to_owned(),
                limit.clone().with_cost(reserve.tokens(kind)),
                kind,
            ))
        })
    }

    /// Whether some limit that applies counts tokens.
    pub fn counts_tokens(&self) -> bool {
        self.counts_tokens
    }

    /// The store key and limit of every limit an admitted request took from (a shadow limit takes only when it
    /// admits itself), owned: what a give-back needs once the request is gone.
    pub fn taken(&self, facts: &RequestFacts<'_>, checked: &Checked) -> Vec<(String, Limit)> {
        self.each_taken(facts, checked, |_, key, limit| {
            Some((key.to_owned(), limit.clone()))
        })
    }

    /// Whether some limit counts answers by status (`counts: { status: [...] }`).
    pub fn counts_statuses(&self) -> bool {
        self.counts_statuses
    }

    /// What an admitted request took from the limits that count answers by status, each with its statuses: the
    /// store key and limit, owned, for a give-back once the answer's status is known.
    pub fn taken_by_status(
        &self,
        facts: &RequestFacts<'_>,
        checked: &Checked,
    ) -> Vec<(String, Limit, StatusSet)> {
        self.each_taken(facts, checked, |index, key, limit| {
            let statuses = self.limits[index].settings.counts.statuses()?;
            Some((key.to_owned(), limit.clone(), statuses.clone()))
        })
    }

    /// Whether some limit is a `concurrency` limit, whose slots an admitted request holds until its answer ends.
    pub fn holds_slots(&self) -> bool {
        self.holds_slots
    }

    /// The slots an admitted request holds: the store key and limit of every `concurrency` limit it took from,
    /// owned, with the limit's `tollgate_in_flight`, for their release once the answer ends.
    pub(super) fn slots_taken(
        &self,
        facts: &RequestFacts<'_>,
        checked: &Checked,
    ) -> Vec<(String, Limit, metrics::Gauge)> {
        self.each_taken(facts, checked, |index, key, limit| {
            let gauge = self.limits[index].in_flight.clone()?;
            Some((key.to_owned(), limit.clone(), gauge))
        })
    }

    /// What `pick` makes of each limit an admitted request took from (its index, store key and limit, or what
    /// replaces it), skipping those it gives nothing for: none when the request was refused.
    fn each_taken<T>(
        &self,
        facts: &RequestFacts<'_>,
        checked: &Checked,
        mut pick: impl FnMut(usize, &str, &Limit) -> Option<T>,
    ) -> Vec<T> {
        let Ok(keys) = self.request_keys(facts) else {
            return Vec::new();
        };
        keys.iter()
            .zip(&checked.outcome.decisions)
            .filter(|(_, decision)| checked.outcome.allowed && decision.allowed)
            .filter_map(|((index, key), _)| {
                pick(index, key, self.limit_at(index, checked.replaced.as_ref()))
            })
            .collect()
    }

    /// The limit at `index`, or what replaces it.
    fn limit_at<'s>(&'s self, index: usize, replaced: Option<&'s Replaced>) -> &'s Limit {
        replaced
            .and_then(|replaced| replaced.get(index))
            .unwrap_or(&self.limits[index].settings.limit)
    }

    /// The store keys a request is counted under, one per limit that applies, without asking the limiter.
    pub fn keys(&self, facts: &RequestFacts<'_>) -> Result<Vec<String>, AmbiguousKey> {
        Ok(self
            .request_keys(facts)?
            .iter()
            .map(|(_, key)| key.to_owned())
            .collect())
    }

    /// The store key of every limit that applies to the request, each key spec's value worked out once: one
    /// string for them all, where one per value and one per key showed in profiles.
    fn request_keys(&self, facts: &RequestFacts<'_>) -> Result<RequestKeys, AmbiguousKey> {
        let mut text = String::with_capacity(self.keys_capacity);
        let mut ends = SmallVec::new();
        let mut written: SmallVec<[Written; INLINE_LIMITS]> =
            SmallVec::from_elem(Written::NotYet, self.key_specs.len());
        if let Some(inert) = self.inert_spec {
            written[inert] = Written::Skipped;
        }
        for (index, SetLimit { head, spec, .. }) in self.limits.iter().enumerate() {
            let spec = *spec;
            let start = text.len();
            match &written[spec] {
                Written::Skipped => continue,
                Written::At(value) => {
                    let value = value.clone();
                    text.push_str(head);
                    text.extend_from_within(value);
                }
                Written::NotYet => {
                    text.push_str(head);
                    let value_start = text.len();
                    if !self.key_specs[spec].push_value(facts, &mut text)? {
                        text.truncate(start);
                        written[spec] = Written::Skipped;
                        continue;
                    }
                    self.key_specs[spec].seal(&mut text, value_start);
                    written[spec] = Written::At(value_start..text.len());
                }
            }
            ends.push((index, text.len()));
        }
        Ok(RequestKeys { text, ends })
    }

    /// `tollgate_decisions_total`: every limit of an admitted request counts as allowed; of a denied request
    /// only the denying limits count (the others consumed nothing and decided nothing).
    /// A shadow limit that denies counts as `shadow_denied` (and is logged), whatever the request's fate.
    /// Each limit's top keys record its denials (a shadow limit's as denied), and its admissions while someone
    /// looks: under `keys`, the request's, worked out again from `facts` if not given and needed.
    pub(super) fn count_decisions(
        &self,
        facts: &RequestFacts<'_>,
        checked: &Checked,
        keys: Option<&RequestKeys>,
    ) {
        let watched = WATCH.watched();
        let mut worked_out = None;
        for (i, decision) in checked.outcome.decisions.iter().enumerate() {
            let Some(limit) = checked.applied.get(i).and_then(|&l| self.limits.get(l)) else {
                continue;
            };
            let shadow = self.is_shadow(checked, i);
            let counted = limit
                .decisions
                .count(shadow, checked.outcome.allowed, !decision.allowed);
            if counted == Counted::ShadowDenied {
                tracing::info!(
                    scope = %self.scope,
                    limit = self.name_of(checked, i),
                    retry_after_ms = decision.retry_after_ms,
                    "shadow limit would deny"
                );
            }
            let denied = matches!(counted, Counted::Denied | Counted::ShadowDenied);
            if denied || (watched && counted == Counted::Allowed) {
                let keys = keys.or_else(|| {
                    worked_out
                        .get_or_insert_with(|| self.request_keys(facts).ok())
                        .as_ref()
                });
                if let Some((_, key)) = keys.and_then(|keys| keys.iter().nth(i)) {
                    // The value as the store key holds it: a secret's digest, never the secret.
                    let value = key[limit.head.len()..]
                        .strip_suffix('}')
                        .unwrap_or_default();
                    let seen = Seen {
                        key: value,
                        denied,
                        used: decision.used(),
                        capacity: decision.limit,
                    };
                    limit.top.record(&WATCH, seen);
                }
            }
        }
    }
}

// === impl Checked ===

impl Checked {
    /// When it was checked in ms, for a set with calendar windows.
    fn calendar_at_ms(&self) -> Option<i64> {
        (self.calendar_at_s != 0).then(|| i64::from(self.calendar_at_s) * 1_000)
    }

    /// The store's `answer` to one all-or-nothing limiter call (`check_leased`) for a request's limits, as a checked
    /// request: the one way every entry point's limits are asked (a route's and the layer's through
    /// [`LimitSet::check`], Envoy's descriptors through [`check_keyed`](super::check::check_keyed)). `applied[i]` is
    /// the index of the limit the call's `i`-th check is of; `lease` holds the request's `concurrency` slots (0:
    /// none). A sync constructor rather than an `async fn` around the call: a nested future costs every limiting
    /// request its own poll and drop.
    pub(in crate::admission) fn answered(
        answer: (Outcome, DecidedBy),
        applied: SmallVec<[usize; INLINE_LIMITS]>,
        lease: u64,
    ) -> Self {
        let (outcome, decided_by) = answer;
        Self {
            outcome,
            applied,
            replaced: None,
            decided_by,
            lease,
            calendar_at_s: 0,
        }
    }

    /// `outcome`, the store's answer for every limit of a set in order, as a checked request: for a caller that asks
    /// the limiter itself and answers with the set's fields (a test that holds the clock).
    pub fn of_every_limit(outcome: Outcome) -> Self {
        let applied = (0..outcome.decisions.len()).collect();
        Self {
            outcome,
            applied,
            replaced: None,
            decided_by: DecidedBy::Store,
            lease: 0,
            calendar_at_s: 0,
        }
    }
}

// === impl Replaced ===

impl Replaced {
    /// `limits` in place of the set's limits from index `offset` on (each counted from `offset`).
    pub fn new(offset: usize, limits: Arc<[(usize, Limit)]>) -> Self {
        Self { offset, limits }
    }

    fn get(&self, index: usize) -> Option<&Limit> {
        let index = index.checked_sub(self.offset)?;
        self.limits
            .iter()
            .find(|(replaced, _)| *replaced == index)
            .map(|(_, limit)| limit)
    }
}

// === impl RequestKeys ===

impl RequestKeys {
    /// Each key with the index of its limit.
    fn iter(&self) -> impl Iterator<Item = (usize, &str)> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().map(|&(_, end)| end));
        self.ends
            .iter()
            .zip(starts)
            .map(|(&(index, end), start)| (index, &self.text[start..end]))
    }
}

#[cfg(test)]
mod tests;
