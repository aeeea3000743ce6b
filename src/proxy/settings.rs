//! What an upstream is, as the config describes it: its targets, timeouts, `Host` and TLS.

use std::time::Duration;

use http::Uri;

use super::tls::UpstreamTls;

/// What one upstream is (one entry of the config's `upstreams:`).
#[derive(Debug, Clone)]
pub struct UpstreamSettings {
    /// Its key in `upstreams:`.
    pub name: String,
    /// `http[s]://host[:port][/base-path]` targets, used round robin.
    pub targets: Vec<Uri>,
    /// Time to wait for the response head, default 30s.
    pub timeout: Duration,
    /// Time to wait for a connection (TCP, then the TLS handshake of `https` targets), default 5s.
    pub connect_timeout: Duration,
    /// Whether the client's `Host` goes to the upstream (default) or the target's own host and port replace it.
    pub pass_host_header: bool,
    /// How `https` targets are verified; `Some` exactly when there is one.
    pub tls: Option<UpstreamTls>,
}
