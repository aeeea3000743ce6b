//! Tokens an LLM API's request may spend: reserved before it is forwarded (an upper bound, all-or-nothing with the
//! route's other limits) and settled once its answer ends, to what the answer reported it spent. A route without
//! `usage:` reserves nothing and reads no body: its requests go through [`NoReservation`](super::NoReservation),
//! which compiles to nothing. With the `llm` feature only.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::BoxError;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};

use super::after_answer::{AfterAnswer, AnswerGuard, Ending, GuardedBody};
use super::limits::{Checked, LimitSet};
use super::reserve::Reserve;
use super::settle::StatusSettlement;
use crate::key::{RequestFacts, TokenKind};
use crate::limiter::{Giver, Limit, Settlement};
use crate::usage::{
    accept_readable_answers, BodyEnd, BodyFacts, CompletionBound, Dialect, Handed, PromptBound,
    Usage, UsageFormat, UsageReader, UsageSettings,
};

/// A route's `usage:`, compiled: its settings and its series.
#[derive(Debug)]
pub struct RouteUsage {
    settings: UsageSettings,
    /// `tollgate_tokens_total{route,kind}`, by kind (input, output, total).
    tokens: [metrics::Counter; 3],
    /// `tollgate_usage_missing_total{route}`.
    missing: metrics::Counter,
}

/// What one request reserves on the token limits, and where its answer's usage is read into.
#[derive(Debug)]
pub struct Reservation {
    /// The prompt's bound.
    pub prompt: u64,
    /// The completion's bound, every answer the request asks for included.
    pub completion: u64,
    route: Arc<RouteUsage>,
}

/// The settlement of an admitted request's tokens (and of its limits that count answers by status, if any), once
/// its answer ends.
struct TokenSettlement {
    giver: Giver,
    /// Per token limit the request reserved on: its store key, the limit with the reservation as its cost, and
    /// what it counts.
    taken: Vec<(String, Limit, TokenKind)>,
    prompt: u64,
    completion: u64,
    route: Arc<RouteUsage>,
    /// What the answer's body reported it cost, once handed over.
    usage: Option<Handed>,
    /// A moment before the decision (see `StatusSettlement`).
    asked: Instant,
    status: Option<StatusCode>,
    statuses: Option<StatusSettlement>,
}

/// What an answer is settled at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Nothing: the upstream failed, or refused before spending (its error status reports no usage).
    Nothing,
    /// Per kind (input, output, total): what the answer reported, or the reservation where it reported nothing.
    Tokens([u64; 3], bool),
}

// === impl RouteUsage ===

impl RouteUsage {
    /// `settings` of route `route`, its series registered.
    pub fn new(route: &str, settings: UsageSettings) -> Self {
        let counter = |kind: &'static str| metrics::counter!("tollgate_tokens_total", "route" => route.to_owned(), "kind" => kind);
        Self {
            settings,
            tokens: [counter("input"), counter("output"), counter("total")],
            missing: metrics::counter!("tollgate_usage_missing_total", "route" => route.to_owned()),
        }
    }

    /// The settings.
    pub fn settings(&self) -> &UsageSettings {
        &self.settings
    }

    /// Which API's meanings the request body and the answer's usage have.
    pub fn dialect(&self) -> Dialect {
        match self.settings.format {
            UsageFormat::Anthropic => Dialect::Anthropic,
            UsageFormat::OpenAi | UsageFormat::Header(_) => Dialect::OpenAi,
        }
    }

    /// The provider whose API the route fronts, when its format names one: its refusals are answered in that
    /// provider's error shape, so that its clients show them.
    pub fn provider(&self) -> Option<Dialect> {
        match self.settings.format {
            UsageFormat::OpenAi => Some(Dialect::OpenAi),
            UsageFormat::Anthropic => Some(Dialect::Anthropic),
            UsageFormat::Header(_) => None,
        }
    }

    /// Whether a request for `path` (the path routes match) is for an endpoint that takes a completion bound
    /// (`usage.endpoints`): only such a request's body is rewritten, and only it reserves a completion.
    pub fn takes_bound(&self, path: &str) -> bool {
        self.settings.endpoints.take(path)
    }

    /// Whether the request body must be read as the API's JSON: to find its completion limit, or to rewrite it.
    pub fn reads_body_fields(&self) -> bool {
        let rewrites = self.settings.rewrites();
        self.settings.completion == CompletionBound::MaxTokens || rewrites.inject_stream_usage
    }

    /// Whether the answer's usage may come in a trailer (`header:<name>`), which the upstream must be told the
    /// gateway takes.
    pub fn reads_trailers(&self) -> bool {
        matches!(self.settings.format, UsageFormat::Header(_))
    }

    /// Prepares the forwarded request's fields: answers whose usage can be read as they pass (not compressed),
    /// when the usage is read from the body.
    pub fn prepare_request(&self, headers: &mut HeaderMap) {
        if !matches!(self.settings.format, UsageFormat::Header(_)) {
            accept_readable_answers(headers);
        }
    }
}

// === impl Reservation ===

impl Reservation {
    /// What a request of `body_len` bytes, whose forwarded body says `facts` (`None` when it was not read), reserves
    /// on `route`.
    pub fn new(route: &Arc<RouteUsage>, body_len: usize, facts: Option<&BodyFacts>) -> Self {
        let settings = &route.settings;
        let prompt = match settings.prompt {
            PromptBound::BodyBytes => body_len as u64,
            PromptBound::Tokens(tokens) => tokens,
        };
        let completion = match settings.completion {
            CompletionBound::Tokens(tokens) => tokens,
            CompletionBound::MaxTokens => {
                let named = facts.and_then(|facts| facts.max_tokens);
                let per_choice = named
                    .or(settings.completion_default)
                    .or(settings.completion_cap)
                    .unwrap_or(0);
                let per_choice = settings
                    .completion_cap
                    .map_or(per_choice, |cap| per_choice.min(cap));
                per_choice.saturating_mul(facts.map_or(1, |facts| facts.choices))
            }
        };
        Self {
            prompt,
            completion,
            route: Arc::clone(route),
        }
    }

    /// The reservation of a request without a body on `route`: it asks for no completion, and reserves nothing.
    pub fn nothing(route: &Arc<RouteUsage>) -> Self {
        Self {
            prompt: 0,
            completion: 0,
            route: Arc::clone(route),
        }
    }

    /// The reservation of a request of `body_len` bytes for an endpoint that takes no completion bound
    /// (embeddings, moderations, a token count): its prompt alone, for it writes no completion.
    pub fn prompt_only(route: &Arc<RouteUsage>, body_len: usize) -> Self {
        Self {
            completion: 0,
            ..Self::new(route, body_len, None)
        }
    }

    /// What the request reserves on a limit counting `kind`.
    pub fn tokens(&self, kind: TokenKind) -> u64 {
        match kind {
            TokenKind::Input => self.prompt,
            TokenKind::Output => self.completion,
            TokenKind::Total => self.prompt.saturating_add(self.completion),
        }
    }
}

impl Reserve for &Reservation {
    type Reserved = Vec<(usize, Limit)>;

    fn reserves(&self) -> bool {
        true
    }

    fn tokens(&self, kind: TokenKind) -> u64 {
        Reservation::tokens(self, kind)
    }

    fn settlement(
        self,
        limits: &LimitSet,
        facts: &RequestFacts<'_>,
        checked: &Checked,
        giver: Giver,
        asked: Instant,
        statuses: Option<StatusSettlement>,
    ) -> Option<Box<dyn AfterAnswer>> {
        if !limits.counts_tokens() {
            return statuses.map(|s| Box::new(s) as Box<dyn AfterAnswer>);
        }
        let taken = limits.taken_tokens(facts, checked, self);
        Some(Box::new(TokenSettlement {
            giver,
            taken,
            prompt: self.prompt,
            completion: self.completion,
            route: Arc::clone(&self.route),
            usage: None,
            asked,
            status: None,
            statuses,
        }))
    }

    fn guard<B>(self, response: Response<B>, after: AnswerGuard) -> Response<Body>
    where
        B: http_body::Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let reader = UsageReader::new(&self.route.settings.format, response.headers());
        response.map(|body| Body::new(GuardedBody::reading(Body::new(body), reader, after)))
    }
}

// === impl TokenSettlement ===

impl AfterAnswer for TokenSettlement {
    fn status(&mut self, status: StatusCode) {
        self.status = Some(status);
        if let Some(statuses) = &mut self.statuses {
            statuses.status(status);
        }
    }

    fn usage(&mut self, handed: Handed) {
        self.usage = Some(handed);
    }

    fn ended(mut self: Box<Self>, ending: Ending) {
        if let Some(statuses) = self.statuses.take() {
            statuses.settle(ending);
        }
        let reading = match self.usage.take() {
            None => None,
            Some(Handed::Read(usage, end)) => Some((usage, end)),
            Some(Handed::Cut(rest)) => {
                // The client left before the usage came: the rest of the answer is read (discarded, bounded in
                // bytes and time) to learn it, in a task that ends with the reading. Only an answer that may
                // report what it spent is worth it.
                let spending = self.status.is_some_and(|status| status.is_success());
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) if spending => {
                        let settings = self.route.settings();
                        let (bytes, timeout) = (settings.read_on_bytes, settings.read_on_timeout);
                        runtime.spawn(async move {
                            let reading = (*rest).read_on(bytes, timeout).await;
                            self.settle(ending, Some(reading));
                        });
                        return;
                    }
                    _ => Some((rest.usage(), BodyEnd::Cut)),
                }
            }
        };
        self.settle(ending, reading);
    }
}

// === impl TokenSettlement ===

impl TokenSettlement {
    /// Settles the token limits at what the answer that ended as `ending`, its body read as `reading`, spent.
    fn settle(self, ending: Ending, reading: Option<(Usage, BodyEnd)>) {
        let settled = settled(self.status, ending, reading, self.prompt, self.completion);
        let Settled::Tokens(tokens, missing) = settled else {
            let back = self
                .taken
                .into_iter()
                .map(|(key, limit, _)| Settlement {
                    key,
                    limit,
                    actual: 0,
                })
                .collect();
            self.giver.settle(back, self.asked);
            return;
        };
        if missing {
            self.route.missing.increment(1);
        }
        for (counter, count) in self.route.tokens.iter().zip(tokens) {
            counter.increment(count);
        }
        let settlements = self
            .taken
            .into_iter()
            .map(|(key, limit, kind)| Settlement {
                key,
                limit,
                actual: tokens[index(kind)],
            })
            .collect();
        self.giver.settle(settlements, self.asked);
    }
}

/// The position of `kind`'s count in a [`Settled::Tokens`].
fn index(kind: TokenKind) -> usize {
    match kind {
        TokenKind::Input => 0,
        TokenKind::Output => 1,
        TokenKind::Total => 2,
    }
}

/// What an answer that ended as `ending` with `status` (none if its head never came), whose body's reading is
/// `reading`, is settled at; `prompt` and `completion` are its reservation.
fn settled(
    status: Option<StatusCode>,
    ending: Ending,
    reading: Option<(Usage, BodyEnd)>,
    prompt: u64,
    completion: u64,
) -> Settled {
    let (usage, end) = match reading {
        Some((usage, end)) => (usage, Some(end)),
        None => (Usage::MISSING, None),
    };
    match status {
        // Unreachable, timed out: nothing was spent.
        None if ending == Ending::Failed => return Settled::Nothing,
        // The upstream failed, or refused the request, and says it spent nothing.
        Some(status) if status.is_server_error() => return Settled::Nothing,
        // A WebSocket: what its messages spend is not read (a handshake has no body, and reserves nothing).
        Some(StatusCode::SWITCHING_PROTOCOLS) => return Settled::Nothing,
        Some(status) if status.is_client_error() && usage.is_missing() => return Settled::Nothing,
        _ => {}
    }
    let whole = end.map_or(ending == Ending::Complete, |end| end == BodyEnd::Complete);
    let reported = [usage.input_tokens, usage.output_tokens, usage.total_tokens];
    let reserved = [prompt, completion, prompt.saturating_add(completion)];
    let failed = end.map_or(ending == Ending::Failed, |end| end == BodyEnd::Failed);
    if !whole && failed {
        // The upstream broke the answer: what it reported so far, and at least the prompt, which it read whatever
        // became of the answer.
        let input = usage.input_tokens.unwrap_or(prompt);
        let output = usage.output_tokens.unwrap_or(0);
        let total = usage
            .total_tokens
            .unwrap_or(input.saturating_add(output))
            .max(input);
        return Settled::Tokens([input, output, total], false);
    }
    if !whole {
        // The client left and the usage stayed unknown (read on past its bounds, or no answer to read on): the
        // whole reservation, and never less than what was reported so far.
        let mut tokens = reserved;
        for (count, reported) in tokens.iter_mut().zip(reported) {
            *count = (*count).max(reported.unwrap_or(0));
        }
        return Settled::Tokens(tokens, true);
    }
    let missing = usage.is_missing();
    let mut tokens = [0; 3];
    for (i, count) in tokens.iter_mut().enumerate() {
        *count = reported[i].unwrap_or(reserved[i]);
    }
    Settled::Tokens(tokens, missing)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(input: u64, output: u64) -> Usage {
        Usage {
            input_tokens: Some(input),
            output_tokens: Some(output),
            total_tokens: Some(input + output),
        }
    }

    #[test]
    fn each_ending_settles_as_promised() {
        let ok = Some(StatusCode::OK);
        let read = |u: Usage, end| Some((u, end));
        // Complete with usage: what was reported.
        assert_eq!(
            settled(
                ok,
                Ending::Complete,
                read(usage(7, 3), BodyEnd::Complete),
                100,
                50
            ),
            Settled::Tokens([7, 3, 10], false)
        );
        // Complete without usage: the reservation, counted as missing.
        assert_eq!(
            settled(
                ok,
                Ending::Complete,
                read(Usage::MISSING, BodyEnd::Complete),
                100,
                50
            ),
            Settled::Tokens([100, 50, 150], true)
        );
        // Upstream unreachable, 5xx, a 4xx that reports nothing: given back.
        assert_eq!(
            settled(None, Ending::Failed, None, 100, 50),
            Settled::Nothing
        );
        let bad_gateway = Some(StatusCode::BAD_GATEWAY);
        assert_eq!(
            settled(
                bad_gateway,
                Ending::Complete,
                read(usage(7, 3), BodyEnd::Complete),
                100,
                50
            ),
            Settled::Nothing
        );
        let bad_request = Some(StatusCode::BAD_REQUEST);
        assert_eq!(
            settled(
                bad_request,
                Ending::Complete,
                read(Usage::MISSING, BodyEnd::Complete),
                100,
                50
            ),
            Settled::Nothing
        );
        // The client left and the usage stayed unknown: the whole reservation, never less than reported so far.
        assert_eq!(
            settled(ok, Ending::Cut, read(Usage::MISSING, BodyEnd::Cut), 100, 50),
            Settled::Tokens([100, 50, 150], true)
        );
        let started = Usage {
            input_tokens: Some(30),
            output_tokens: Some(70),
            total_tokens: Some(100),
        };
        assert_eq!(
            settled(ok, Ending::Cut, read(started, BodyEnd::Cut), 100, 50),
            Settled::Tokens([100, 70, 150], true)
        );
        // Read on to its end after the client left: what it reported.
        assert_eq!(
            settled(ok, Ending::Cut, read(started, BodyEnd::Complete), 100, 50),
            Settled::Tokens([30, 70, 100], false)
        );
        // The upstream broke mid-stream: what was reported so far, at least the prompt.
        assert_eq!(
            settled(
                ok,
                Ending::Failed,
                read(Usage::MISSING, BodyEnd::Failed),
                100,
                50
            ),
            Settled::Tokens([100, 0, 100], false)
        );
        // The client left before the head: the whole reservation.
        assert_eq!(
            settled(None, Ending::Cut, None, 100, 50),
            Settled::Tokens([100, 50, 150], true)
        );
    }
}
