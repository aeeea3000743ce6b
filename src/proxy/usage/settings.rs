//! A route's `usage:`: how its answers report what they cost, and how a request's bound is reserved from its body.

use super::reader::UsageFormat;
use super::request::Rewrites;

/// The default `usage.max_request_bytes`: 1 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: u64 = 1 << 20;

/// The default `usage.read_on_bytes`: 1 MiB.
pub const DEFAULT_READ_ON_BYTES: u64 = 1 << 20;

/// The default `usage.read_on_timeout`: 30 s.
pub const DEFAULT_READ_ON_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

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
}

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

// === impl UsageSettings ===

impl UsageSettings {
    /// The rewrites the forwarded body gets: the cap, the default limit written where a request names none (so
    /// that what is reserved bounds what the upstream may write), and the usage asked of an OpenAI stream.
    pub fn rewrites(&self) -> Rewrites {
        let reads_limit = self.completion == CompletionBound::MaxTokens;
        Rewrites {
            completion_cap: self.completion_cap.filter(|_| reads_limit),
            completion_when_absent: self.completion_default.filter(|_| reads_limit),
            inject_stream_usage: self.inject_stream_usage,
        }
    }
}
