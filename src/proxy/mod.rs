//! Forwarding admitted requests to a route's upstream: connection pools, round robin, TLS, header rewriting,
//! WebSocket tunnels.

mod body;
mod headers;
mod pool;
mod tls;
mod upgrade;
mod upstream;

pub use body::{discard, ClientBody, ClientBodyError, Discarding, LimitedBody};
pub use headers::{clean_client_fields, prepare_request, ClientFieldRules, ForwardedFacts, VIA};
pub use tls::{TlsDialer, TlsFieldError, TlsFiles, UpstreamTls};
pub(crate) use upgrade::TunnelHold;
pub use upgrade::{tunnel, TunnelClosed, TunnelOpen};
pub use upstream::{ProxyError, Upstream, UpstreamSettings};
