//! The validated `consumers:` block: how requests name their consumer, the static keys, the plans.

use std::path::Path;

use http::HeaderName;

use super::failures::FailureSettings;
use super::jwt::JwtSettings;
use crate::admission::LimitSettings;
use crate::config::ConfigError;

/// The whole `consumers:` block, validated.
#[derive(Debug, Clone)]
pub struct ConsumersSettings {
    /// How a request names its consumer, tried in order; the first credential present decides.
    pub identify: Vec<IdentifierSettings>,
    /// API keys written in the config.
    pub keys: Vec<StaticKey>,
    /// What a request without any credential gets.
    pub anonymous: Anonymous,
    /// Headers that tell the upstream who called.
    pub forward: ForwardHeaders,
    /// The plans, in file order.
    pub plans: Vec<Plan>,
    /// The limit on failed credentials per client address, if any.
    pub failed_credentials: Option<FailureSettings>,
}

/// One entry of `identify:`.
#[derive(Debug, Clone)]
pub enum IdentifierSettings {
    /// An API key in a header or a query parameter.
    ApiKey(CredentialSource),
    /// A bearer JWT.
    Jwt(Box<JwtSettings>),
}

/// Where a credential is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSource {
    /// A request header.
    Header(HeaderName),
    /// A query parameter.
    Query(String),
}

/// An API key of the config file: only its SHA-256 digest is kept in memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticKey {
    /// SHA-256 of the key.
    pub digest: [u8; 32],
    /// The consumer it names.
    pub consumer: String,
    /// Its plan, when the key gives one.
    pub plan: Option<String>,
}

/// What a request without any credential gets.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Anonymous {
    /// No plan: only the route's limits apply.
    #[default]
    NoPlan,
    /// The named plan's limits.
    Plan(String),
    /// 401 on every route that identifies consumers.
    Reject,
}

/// `forward:`: headers tollgate sets on the request to the upstream; copies sent by clients are always dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ForwardHeaders {
    /// Carries the consumer id.
    pub consumer: Option<HeaderName>,
    /// Carries the plan name.
    pub plan: Option<HeaderName>,
}

/// `consumers:` of a route: whether it identifies callers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumerMode {
    /// No identification, no plan limits (the default without a `consumers:` block).
    #[default]
    Off,
    /// Identified callers get their plan; anonymous ones the `anonymous` policy (the default with a block).
    Optional,
    /// A valid credential is required: 401 without one.
    Required,
}

/// A plan: limits shared by every route its consumers call.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Its name (`free`, `pro`), what `RateLimit-Policy` and the metrics call it.
    pub name: String,
    /// Its limits, checked with the route's in the same call.
    pub limits: Vec<LimitSettings>,
}

// === impl ConsumersSettings ===

impl ConsumersSettings {
    /// A `consumers:` block on its own, for a tower layer's [`Builder::consumers`](crate::layer::Builder::consumers)
    /// without a whole config file: the text is what goes under `consumers:` in a config file (`identify:`,
    /// `keys:`, `plans:`...), with `${VAR}`s from the environment. It is checked as a config file's block is, and
    /// its problems are located the same way, in `source` (the name the messages give the text), e.g.
    /// `consumers.yaml:7:47: plans.free.limits[0].rate: ...`.
    ///
    /// ```
    /// use std::path::Path;
    ///
    /// use tollgate::consumers::ConsumersSettings;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let consumers = ConsumersSettings::from_yaml(
    ///     r#"
    /// identify:
    ///   - api_key: { header: x-api-key }
    /// keys:
    ///   - { key: "sha256:9f8cfdb17116bf0e2a44e071454f25594cb9b8737bf331e6a2f0b30550572f29", consumer: demo, plan: free }
    /// plans:
    ///   free:
    ///     limits:
    ///       - { name: hourly, key: consumer, algorithm: gcra, rate: 1000/1h, burst: 20 }
    /// "#,
    ///     Path::new("consumers.yaml"),
    /// )?;
    /// assert_eq!(consumers.plans.len(), 1);
    ///
    /// let error = ConsumersSettings::from_yaml("plans:\n  free:\n    limits: 7\n", Path::new("c.yaml"))
    ///     .expect_err("limits is a list");
    /// assert!(error.to_string().starts_with("c.yaml:3:13: plans.free.limits: "), "{error}");
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_yaml(text: &str, source: &Path) -> Result<Self, ConfigError> {
        crate::config::parse_consumers(text, source)
    }
}
