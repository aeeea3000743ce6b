//! Forwarding admitted requests to a route's upstream: connection pools, round robin, TLS, header rewriting,
//! WebSocket tunnels. Without the `gateway` feature only what the config describes an upstream with is here
//! (its settings and TLS), and none of hyper's client.

#[cfg(feature = "gateway")]
mod body;
#[cfg(feature = "gateway")]
mod headers;
#[cfg(feature = "gateway")]
mod health;
#[cfg(feature = "gateway")]
mod pool;
mod settings;
mod tls;
#[cfg(feature = "gateway")]
mod upgrade;
#[cfg(feature = "gateway")]
mod upstream;

#[cfg(feature = "gateway")]
pub use body::{discard, ClientBody, ClientBodyError, Discarding, LimitedBody};
#[cfg(feature = "gateway")]
pub use headers::{clean_client_fields, prepare_request, ClientFieldRules, ForwardedFacts, VIA};
pub use settings::{HealthSettings, UpstreamSettings};
pub use tls::{client_config, trusted_roots, TlsDialer, TlsFieldError, TlsFiles, UpstreamTls};
// The PEM readers, which the TLS listener's certificates use too.
#[cfg(feature = "gateway")]
pub(crate) use health::HealthView;
#[cfg(feature = "gateway")]
pub(crate) use tls::{certificates, private_key, roots_from_file};
#[cfg(feature = "gateway")]
pub(crate) use upgrade::TunnelHold;
#[cfg(feature = "gateway")]
pub use upstream::{ProxyError, Upstream};
