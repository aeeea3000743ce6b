//! Reading what an LLM API's answer says it cost as it streams through (a JSON body's `usage`, server-sent events,
//! a header or trailer), and reading and rewriting the request fields that bound that cost.

mod body;
mod json;
mod reader;
mod reported;
mod request;
mod settings;
mod sse;

pub use body::{BodyEnd, Handed, Unread};
pub use reader::{accept_readable_answers, UsageFormat, UsageFormatError, UsageReader};
pub use reported::{Dialect, Usage};
pub use request::{
    read_request, rewrite_request, set_body_length, BodyFacts, RequestBodyError, RequestShape,
    Rewrites, Rewritten,
};
pub use settings::{
    CompletionBound, Endpoints, PromptBound, UsageSettings, ANTHROPIC_ENDPOINTS,
    DEFAULT_MAX_REQUEST_BYTES, DEFAULT_READ_ON_BYTES, DEFAULT_READ_ON_TIMEOUT, OPENAI_ENDPOINTS,
};
