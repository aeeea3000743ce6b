//! What an upstream is, as the config describes it: its targets, timeouts, `Host`, TLS, health and retries.

use std::num::NonZeroU32;
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
    /// When a target is skipped after failing.
    pub health: HealthSettings,
    /// Tries in all for one request, the first included, each on another target; `None`: one per target.
    pub attempts: Option<NonZeroU32>,
    /// The longest silence between an answer's bytes (and the longest wait for its head, with `timeout`), default
    /// 60s.
    pub idle_timeout: Duration,
}

/// Passive health, as nginx's `max_fails` and `fail_timeout` mean it: a target that fails `max_fails` times within
/// `fail_timeout` is skipped for `fail_timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthSettings {
    /// Failures that make a target skipped; 0 turns the accounting off (never skipped). Default 1.
    pub max_fails: u32,
    /// The window the failures are counted in, and how long the target is then skipped. Default 10s.
    pub fail_timeout: Duration,
}
