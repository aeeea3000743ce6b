//! The validated configuration: what the rest of tollgate runs on, built once from the YAML file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, HeaderValue, StatusCode};
use ipnet::IpNet;

// Domain types the config builds but does not own; named here too, as the config's parts.
pub use crate::consumers::{ConsumerMode, ConsumersSettings};
pub use crate::key::ClientIpHeader;
pub use crate::key::LimitSettings;
pub use crate::limiter::{BackendKind, StoreSettings};
pub use crate::proxy::UpstreamSettings;
pub use crate::rls::RlsSettings;
pub use crate::routing::RouteMatch;
pub use crate::tls::{CertificateFiles, TlsSettings, TlsVersion};
pub use crate::usage::UsageSettings;

/// A whole, valid configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from (for messages and reloads).
    pub source: PathBuf,
    /// Where the gateway listens in clear; `None` when the file sets `tls.listen` and no `listen`.
    pub listen: Option<SocketAddr>,
    /// HTTPS, when the file has a `tls:` block.
    pub tls: Option<TlsSettings>,
    /// The admin listener.
    pub admin: AdminSettings,
    /// The limiter store.
    pub store: StoreSettings,
    /// How the client address is found.
    pub client_ip: ClientIpSettings,
    /// HTTP server limits.
    pub server: ServerSettings,
    /// Named upstreams, in file order.
    pub upstreams: Vec<UpstreamSettings>,
    /// Routes, in file order (first match wins).
    pub routes: Vec<RouteSettings>,
    /// Consumers and plans (see docs/configuration.md, "Consumers and plans"), when the file has a `consumers:` block.
    pub consumers: Option<ConsumersSettings>,
    /// Envoy's rate limit service, when the file has an `rls:` block.
    pub rls: Option<RlsSettings>,
    /// Traces sent to an OpenTelemetry collector.
    pub telemetry: TelemetrySettings,
}

/// `telemetry:`
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TelemetrySettings {
    /// Where spans go, when they are sent anywhere.
    pub otlp: Option<OtlpSettings>,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/HTTP: protobuf bodies POSTed (`http://` endpoints, `https://` over TLS).
    Http,
    /// OTLP/gRPC over HTTP/2 (`grpc://` endpoints, `grpcs://` over TLS).
    Grpc,
}

/// `telemetry.otlp:`: where spans are sent, and which.
#[derive(Debug, Clone, PartialEq)]
pub struct OtlpSettings {
    /// The collector's traces address: `http://HOST:4318/v1/traces` for OTLP/HTTP, `http://HOST:4317` for gRPC;
    /// `https://` when it is reached over TLS.
    pub endpoint: http::Uri,
    /// The PEM file of the certificates a TLS collector's must chain to, instead of the system's roots.
    pub ca_file: Option<PathBuf>,
    /// How spans are sent.
    pub protocol: OtlpProtocol,
    /// The `service.name` the spans carry (default `tollgate`).
    pub service_name: String,
    /// The share of new traces kept, from 0 to 1 (default 1); a request whose `traceparent` says sampled is kept
    /// whatever the ratio, and one that says not sampled is not.
    pub sample_ratio: f64,
}

/// `admin:`
#[derive(Debug, Clone)]
pub struct AdminSettings {
    /// Default `127.0.0.1:9901`.
    pub listen: SocketAddr,
    /// Bearer token for the admin API; `None` when empty.
    pub token: Option<String>,
    /// The HTTP status of `/readyz` while the store is degraded: 200 (default: the gateway still serves), or
    /// e.g. 503 for orchestrators that should stop routing to it.
    pub readyz_degraded_status: u16,
}

/// `client_ip:`
#[derive(Debug, Clone)]
pub struct ClientIpSettings {
    /// Peers whose `Forwarded` / `X-Forwarded-For` are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// IPv6 clients are keyed by their network of this many bits (default 64): one subscriber holds a whole /64.
    pub ipv6_prefix: u8,
    /// Whether tollgate writes a `Forwarded` field (RFC 7239) for the upstream besides `X-Forwarded-For`.
    pub forwarded: bool,
    /// The one field believed from trusted proxies (default `X-Forwarded-For`).
    pub header: ClientIpHeader,
}

impl Default for ClientIpSettings {
    fn default() -> Self {
        Self {
            trusted_proxies: Vec::new(),
            ipv6_prefix: 64,
            forwarded: false,
            header: ClientIpHeader::default(),
        }
    }
}

/// `server:` (optional): protections of the HTTP listener.
#[derive(Debug, Clone)]
pub struct ServerSettings {
    /// Time a client has to send its request head, from the head's first byte (and a new connection's first
    /// bytes), default 10s.
    pub header_read_timeout: Duration,
    /// Time a connection may stay idle between requests (HTTP/2: with no request in flight), default 75s (as nginx):
    /// longer than the idle
    /// timeouts of the load balancers in front (60s for AWS's), so that the balancer, not tollgate, closes idle
    /// connections and never sends a request on one being closed.
    pub keepalive_timeout: Duration,
    /// Time a request body may go without a new piece (HTTP/1.1 and HTTP/2), default 30s: then 408 and the
    /// upstream request is cancelled.
    pub body_read_timeout: Duration,
    /// A path on the main listener answered as the admin listener's `/readyz` is, before any route: for load
    /// balancers' health checks, which reach only the listener they balance.
    pub health_path: Option<String>,
    /// Largest request body accepted: 413 past it (a declared `Content-Length` at once, a streamed body when it
    /// grows past it). None: no limit.
    pub max_body_bytes: Option<u64>,
    /// Largest request head accepted (431 beyond), default 64 KiB.
    pub max_header_bytes: usize,
    /// Time in-flight requests get to finish on shutdown, default 30s.
    pub shutdown_grace: Duration,
    /// Time the listener keeps accepting and serving after a shutdown signal, while `/readyz` already fails
    /// (`draining`), so that load balancers stop sending before it closes; default 0s.
    pub shutdown_delay: Duration,
    /// Whether request field names with `_` reach the upstream (default false: dropped, as nginx does), except
    /// the spellings that read as a field tollgate writes.
    pub underscores_in_headers: bool,
    /// `escaped_slashes: keep`: `%2F` in a path is data, forwarded escaped, rather than refused (400, the default).
    pub keep_escaped_slashes: bool,
}

/// One entry of `routes:`.
#[derive(Debug, Clone)]
pub struct RouteSettings {
    /// Unique route name.
    pub name: String,
    /// Which requests it takes.
    pub matcher: RouteMatch,
    /// What it does with them once admitted.
    pub action: RouteAction,
    /// Its limits, all checked together.
    pub limits: Vec<LimitSettings>,
    /// Status of denied requests, default 429.
    pub deny_status: StatusCode,
    /// Whether rate-limit headers are added to admitted responses, default true.
    pub headers: bool,
    /// Client networks exempt from the route's limits (health checkers, internal callers).
    pub allow: Vec<IpNet>,
    /// Whether the route identifies consumers and applies their plans.
    pub consumers: ConsumerMode,
    /// How its answers report the tokens they cost, and what a request reserves (`usage:`), on an LLM API's route.
    pub usage: Option<UsageSettings>,
}

/// What a route does with an admitted request.
#[derive(Debug, Clone)]
pub enum RouteAction {
    /// Forward to the named upstream.
    Upstream(String),
    /// Answer directly.
    Respond(DirectResponse),
    /// Neither: a route of a file read for tower layers (`config::load_for_layers`, with the `yaml` feature), which
    /// limit whatever service they wrap. The gateway serves no such route.
    LimitsOnly,
}

/// `respond:` of a route.
#[derive(Debug, Clone)]
pub struct DirectResponse {
    /// Default 200.
    pub status: StatusCode,
    /// Default empty.
    pub body: String,
    /// Extra response headers.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}
