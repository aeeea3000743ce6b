//! Reading what an LLM API's answer says it cost as it streams through (a JSON body's `usage`, server-sent events,
//! a header or trailer), and reading and rewriting the request fields that bound that cost.

mod json;
mod reader;
mod reported;
mod sse;

pub use reader::{UsageFormat, UsageReader};
pub use reported::{Dialect, Usage};
