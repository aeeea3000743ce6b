//! A route's `usage:`: how its answers report what they cost, and how a request's bound is reserved from its body.

use http::HeaderName;

#[cfg(feature = "llm")]
use super::request::Rewrites;

/// The default `usage.max_request_bytes`: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1 << 20;

/// The default `usage.read_on_bytes`: 1 MiB.
pub const DEFAULT_READ_ON_BYTES: u64 = 1 << 20;

/// The default `usage.read_on_timeout`: 30 s.
pub const DEFAULT_READ_ON_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// How a route's answers report what they cost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UsageFormat {
    /// OpenAI chat completions or Responses, JSON or streamed (and the servers that answer as they do).
    OpenAi,
    /// Anthropic messages, JSON or streamed.
    Anthropic,
    /// A whole number in this response header, or in a trailer of that name: counted as the total.
    Header(HeaderName),
}

/// A `usage.format` that names no format tollgate reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a usage format: openai, anthropic or header:<name>")]
pub struct UsageFormatError(String);

/// `usage:` of a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageSettings {
    /// How answers report their tokens.
    pub format: UsageFormat,
    /// The bound reserved for the prompt's tokens.
    pub prompt: PromptBound,
    /// The bound reserved for the completion's tokens, per answer the request asks for.
    pub completion: CompletionBound,
    /// The completion limit of a request that names none (also written into the body forwarded).
    pub completion_default: Option<u64>,
    /// A larger completion limit is lowered to this in the body forwarded.
    pub completion_cap: Option<u64>,
    /// `stream_usage: inject`: a streamed OpenAI request that does not ask for its usage is made to.
    pub inject_stream_usage: bool,
    /// Largest request body read (413 past it).
    pub max_request_bytes: u64,
    /// After a client leaves before the usage is known, how much more of the answer is read to learn it.
    pub read_on_bytes: u64,
    /// ... and for how long at most.
    pub read_on_timeout: std::time::Duration,
    /// The endpoints whose requests take a completion bound (`usage.endpoints`): only there is the body rewritten
    /// and a completion reserved.
    pub endpoints: Endpoints,
}

/// The endpoints that take a completion bound, as suffixes of the request path made of whole segments
/// (`/chat/completions` takes `/v1/chat/completions`); `/` takes every path. Matched in any ASCII case and with a
/// trailing `/` ignored, as routes match: a path written another way is still the endpoint it reaches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints(Vec<String>);

/// OpenAI's endpoints that take a completion bound: chat completions, legacy completions, Responses.
pub const OPENAI_ENDPOINTS: [&str; 3] = ["/chat/completions", "/completions", "/responses"];

/// Anthropic's endpoint that takes a completion bound: messages (not `/messages/count_tokens`, not
/// `/messages/batches`, which end otherwise).
pub const ANTHROPIC_ENDPOINTS: [&str; 1] = ["/messages"];

/// `reserve.prompt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptBound {
    /// The body's length in bytes: no tokenizer makes more tokens than the bytes it reads.
    BodyBytes,
    /// A fixed number of tokens.
    Tokens(u64),
}

/// `reserve.completion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompletionBound {
    /// The request's own completion limit (`max_tokens`, `max_completion_tokens`, `max_output_tokens`), else
    /// `completion_default`, never above `completion_cap`.
    MaxTokens,
    /// A fixed number of tokens.
    Tokens(u64),
}

// === impl UsageFormat ===

impl std::str::FromStr for UsageFormat {
    type Err = UsageFormatError;

    /// `openai`, `anthropic` or `header:<name>` (a field name, any case).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "openai" => Ok(Self::OpenAi),
            "anthropic" => Ok(Self::Anthropic),
            _ => text
                .strip_prefix("header:")
                .and_then(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
                .map(Self::Header)
                .ok_or_else(|| UsageFormatError(text.to_owned())),
        }
    }
}

// === impl UsageSettings ===

impl UsageSettings {
    /// The rewrites the forwarded body gets: the cap, the default limit written where a request names none (so
    /// that what is reserved bounds what the upstream may write), and the usage asked of an OpenAI stream.
    #[cfg(feature = "llm")]
    pub fn rewrites(&self) -> Rewrites {
        let reads_limit = self.completion == CompletionBound::MaxTokens;
        Rewrites {
            completion_cap: self.completion_cap.filter(|_| reads_limit),
            completion_when_absent: self.completion_default.filter(|_| reads_limit),
            inject_stream_usage: self.inject_stream_usage,
        }
    }
}

// === impl Endpoints ===

impl Endpoints {
    /// Every path takes a bound: what a `header:` format's route does by default (its API is not known).
    pub fn every() -> Self {
        Self(vec!["/".to_owned()])
    }

    /// The paths ending with one of `suffixes` (each a path of whole segments: see [`Endpoints`]).
    pub fn suffixes<S: Into<String>>(suffixes: impl IntoIterator<Item = S>) -> Self {
        Self(suffixes.into_iter().map(Into::into).collect())
    }

    /// The default of a route whose answers are read as `format`'s: the endpoints of its API that take a bound.
    pub fn of(format: &UsageFormat) -> Self {
        match format {
            UsageFormat::OpenAi => Self::suffixes(OPENAI_ENDPOINTS),
            UsageFormat::Anthropic => Self::suffixes(ANTHROPIC_ENDPOINTS),
            UsageFormat::Header(_) => Self::every(),
        }
    }

    /// The suffixes, as configured.
    pub fn as_slice(&self) -> &[String] {
        &self.0
    }

    /// Whether a request for `path` (the path routes match) takes a completion bound. Compares bytes in place:
    /// this runs once per request on a token route, and allocates nothing.
    pub fn take(&self, path: &str) -> bool {
        let path = path.strip_suffix('/').unwrap_or(path).as_bytes();
        self.0.iter().any(|suffix| {
            let suffix = suffix.as_bytes();
            suffix == b"/"
                || (path.len() >= suffix.len()
                    && path[path.len() - suffix.len()..].eq_ignore_ascii_case(suffix))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_suffixes_of_whole_segments_in_any_case() {
        let openai = Endpoints::of(&UsageFormat::OpenAi);
        for path in [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/Chat/Completions/",
            "/openai/deployments/gpt-4/chat/completions",
        ] {
            assert!(openai.take(path), "{path}");
        }
        for path in [
            "/v1/embeddings",
            "/v1/moderations",
            "/v1/audio/speech",
            "/v1/images/generations",
            "/v1/xresponses",
            "/v1/responses/resp_1/cancel",
            "/v1/messages",
            "/",
            "",
        ] {
            assert!(!openai.take(path), "{path}");
        }
        let anthropic = Endpoints::of(&UsageFormat::Anthropic);
        assert!(anthropic.take("/v1/messages"));
        assert!(!anthropic.take("/v1/messages/count_tokens"));
        assert!(!anthropic.take("/v1/messages/batches"));
        let every = Endpoints::of(&UsageFormat::Header(http::HeaderName::from_static(
            "x-tokens",
        )));
        assert!(every.take("/") && every.take("/anything/at/all"));
        assert!(!Endpoints::suffixes(Vec::<String>::new()).take("/v1/chat/completions"));
    }
}
