//! Forwarding admitted requests to a route's upstream: the pooled client, round robin, header rewriting.

mod headers;
mod upstream;

pub use headers::{ForwardedFacts, VIA};
pub use upstream::{ProxyError, Upstream};
