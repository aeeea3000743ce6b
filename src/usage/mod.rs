//! Reading what an LLM API's answer says it cost as it streams through (a JSON body's `usage`, server-sent events,
//! a header or trailer), and reading and rewriting the request fields that bound that cost. The readers come with
//! the `llm` feature; a route's `usage:` settings are in every build, as the config model holds them (a build
//! without `llm` refuses them at their line).

#[cfg(feature = "llm")]
mod body;
#[cfg(feature = "llm")]
mod json;
#[cfg(feature = "llm")]
mod reader;
#[cfg(feature = "llm")]
mod reported;
#[cfg(feature = "llm")]
mod request;
mod settings;
#[cfg(feature = "llm")]
mod sse;

#[cfg(feature = "llm")]
pub use body::{BodyEnd, Handed, Unread};
#[cfg(feature = "llm")]
pub use reader::{accept_readable_answers, UsageReader};
#[cfg(feature = "llm")]
pub use reported::{Dialect, Usage};
#[cfg(feature = "llm")]
pub use request::{
    read_request, rewrite_request, set_body_length, BodyFacts, RequestBodyError, RequestShape,
    Rewrites, Rewritten,
};
pub use settings::{
    CompletionBound, Endpoints, PromptBound, UsageFormat, UsageFormatError, UsageSettings,
    ANTHROPIC_ENDPOINTS, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_READ_ON_BYTES, DEFAULT_READ_ON_TIMEOUT,
    OPENAI_ENDPOINTS,
};
