//! Forwarding admitted requests to a route's upstream: connection pools, round robin, header rewriting, WebSocket
//! tunnels.

mod headers;
mod pool;
mod upgrade;
mod upstream;

pub use headers::{ForwardedFacts, VIA};
pub use upstream::{ProxyError, Upstream};
