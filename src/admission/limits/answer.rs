//! What a checked request's answer says of its limits: the status and the limit a refusal names, the rate-limit
//! fields of an admitted answer, and how long a `leaky_bucket` in delay mode holds it.

use http::header::{HeaderMap, HeaderValue, RETRY_AFTER};
use http::StatusCode;

use super::super::headers;
use super::{Checked, LimitSet};
use crate::head_lines::HeadLines;
use crate::limiter::Decision;

// === impl LimitSet ===

impl LimitSet {
    /// The status a denied request is answered with (`deny_status`, 429 by default).
    pub fn deny_status(&self) -> StatusCode {
        self.deny_status
    }

    /// What a refusal names of a denied request: the limit that explains it, and how long until it would be
    /// admitted (the longest wait among the enforced limits that denied it).
    pub fn denial(&self, checked: &Checked) -> (&str, u64) {
        let limit = self
            .most_restrictive(checked)
            .map_or("", |i| self.name_of(checked, i));
        let retry_after_ms = self
            .enforced(checked)
            .filter(|d| !d.allowed)
            .map(|d| d.retry_after_ms)
            .max()
            .unwrap_or(0);
        (limit, retry_after_ms)
    }

    /// Adds the fields of a refusal of `checked`: `Retry-After`, the longest wait in whole seconds rounded up and
    /// at least 1 (`Retry-After: 0` would invite an immediate retry that is still refused), then the rate-limit
    /// fields ([`decorate`](Self::decorate)).
    pub fn decorate_refusal(&self, headers: &mut HeaderMap, checked: &Checked) {
        let (_, retry_after_ms) = self.denial(checked);
        let seconds = retry_after_ms.div_ceil(1000).max(1);
        headers.insert(RETRY_AFTER, HeaderValue::from(seconds));
        self.decorate(headers, checked);
    }

    /// Adds `X-RateLimit-*`, `RateLimit-Policy` and `RateLimit` describing `checked`; where limits count tokens,
    /// also the `x-ratelimit-*-tokens` fields of the most restrictive of them, and its `RateLimit` item.
    pub fn decorate(&self, headers: &mut HeaderMap, checked: &Checked) {
        self.decorate_requests(headers, checked);
        if self.counts_tokens {
            self.decorate_tokens(headers, checked);
        }
    }

    /// As [`decorate`](Self::decorate), as head lines; false, with nothing written, where the fields need a map
    /// (token limits merge their item into `RateLimit`).
    pub(crate) fn decorate_lines(&self, lines: &mut HeadLines, checked: &Checked) -> bool {
        if self.counts_tokens {
            return false;
        }
        self.decorate_requests(lines, checked);
        true
    }

    /// The fields of the token limit that explains the outcome among the token limits (the longest wait among
    /// those that denied, else the fewest left), as OpenAI's API names them.
    #[inline(never)]
    fn decorate_tokens(&self, headers: &mut HeaderMap, checked: &Checked) {
        let tokens = checked
            .outcome
            .decisions
            .iter()
            .enumerate()
            .filter(|&(i, _)| {
                !self.is_shadow(checked, i)
                    && checked
                        .applied
                        .get(i)
                        .is_some_and(|&limit| self.limits[limit].settings.counts.tokens().is_some())
            });
        let explaining = if checked.outcome.allowed || tokens.clone().all(|(_, d)| d.allowed) {
            tokens.min_by_key(|(_, d)| d.remaining)
        } else {
            tokens
                .filter(|(_, d)| !d.allowed)
                .max_by_key(|(_, d)| d.retry_after_ms)
        };
        let Some((index, decision)) = explaining else {
            return;
        };
        headers::apply_tokens(headers, decision);
        if self.most_restrictive(checked) != Some(index) {
            headers::add_rate_limit_item(headers, self.name_of(checked, index), decision);
        }
    }

    /// `X-RateLimit-*`, `RateLimit-Policy` and `RateLimit` of the limit that explains the outcome.
    fn decorate_requests<F: headers::Fields>(&self, fields: &mut F, checked: &Checked) {
        let Some(index) = self.most_restrictive(checked) else {
            return;
        };
        let Some(&limit) = checked.applied.get(index) else {
            return;
        };
        if let Some(replaced) = &checked.replaced {
            // A consumer's own parameters: rendered for its request (rare: a few consumers have overrides).
            let limits = (0..self.limits.len()).map(|i| self.limit_at(i, Some(replaced)));
            let advertised = headers::Advertised::new(self.limit_at(limit, Some(replaced)));
            headers::apply(
                fields,
                headers::policy(limits, checked.calendar_at_ms()).as_ref(),
                &checked.outcome.decisions[index],
                &advertised,
            );
            return;
        }
        let Some(advertised) = self.limits.get(limit).map(|l| &l.advertised) else {
            return;
        };
        // A calendar window's `w` is the length of the window the request fell in: rendered for it.
        let at_request = checked
            .calendar_at_ms()
            .and_then(|at| headers::policy(self.advertised_limits(), Some(at)));
        headers::apply(
            fields,
            at_request.as_ref().or(self.policy.as_ref()),
            &checked.outcome.decisions[index],
            advertised,
        );
    }

    /// The decision that explains the outcome among those of the enforced limits: what clients are told about.
    fn most_restrictive(&self, checked: &Checked) -> Option<usize> {
        checked
            .outcome
            .most_restrictive_among(|i| !self.is_shadow(checked, i))
    }

    /// The decisions of the enforced limits.
    fn enforced<'v>(&'v self, checked: &'v Checked) -> impl Iterator<Item = &'v Decision> + 'v {
        checked
            .outcome
            .decisions
            .iter()
            .enumerate()
            .filter(|&(i, _)| !self.is_shadow(checked, i))
            .map(|(_, decision)| decision)
    }

    /// How long an admitted request must be held (`leaky_bucket` in delay mode); shadow limits hold nothing.
    pub fn delay_ms(&self, checked: &Checked) -> u64 {
        self.enforced(checked)
            .map(|d| d.delay_ms)
            .max()
            .unwrap_or(0)
    }

    /// The shadow limits that would have denied the request, by name.
    pub fn shadow_denials<'c>(
        &'c self,
        checked: &'c Checked,
    ) -> impl Iterator<Item = &'c str> + 'c {
        checked
            .outcome
            .decisions
            .iter()
            .enumerate()
            .filter(move |(i, decision)| !decision.allowed && self.is_shadow(checked, *i))
            .map(move |(i, _)| self.name_of(checked, i))
    }

    pub(super) fn is_shadow(&self, checked: &Checked, decision: usize) -> bool {
        checked
            .applied
            .get(decision)
            .and_then(|&index| self.limits.get(index))
            .is_some_and(|l| l.settings.limit.is_shadow())
    }

    pub(super) fn name_of(&self, checked: &Checked, decision: usize) -> &str {
        checked
            .applied
            .get(decision)
            .and_then(|&index| self.limits.get(index))
            .map_or("", |l| l.settings.limit.name())
    }
}
