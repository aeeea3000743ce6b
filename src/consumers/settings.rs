//! The validated `consumers:` block: how requests name their consumer, the static keys, the plans.

use http::HeaderName;

use super::failures::FailureSettings;
#[cfg(feature = "jwt")]
use super::jwt::JwtSettings;
use crate::key::LimitSettings;

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
    /// `cache`: with the directory in Redis, how many consumers each instance keeps in memory (the most recently
    /// used; the others are read from Redis when asked for). `None`: every consumer.
    pub cache: Option<usize>,
}

/// One entry of `identify:`.
#[derive(Debug, Clone)]
pub enum IdentifierSettings {
    /// An API key in a header or a query parameter.
    ApiKey {
        /// Where the key is read.
        source: CredentialSource,
        /// `hide_credentials`: the key is removed from the request sent upstream once it named the caller.
        hide_credentials: bool,
    },
    #[cfg(feature = "jwt")]
    /// A bearer JWT.
    Jwt {
        /// The verifier's settings.
        settings: Box<JwtSettings>,
        /// `hide_credentials`: the token's header is removed from the request sent upstream once it named the
        /// caller.
        hide_credentials: bool,
    },
    /// The connection's verified client certificate (mutual TLS): its common name names the consumer.
    Mtls {
        /// What the common name is prefixed with to make the consumer id (`consumer_prefix`, `mtls:` unless
        /// written): the certificates' consumers in a namespace of their own.
        consumer_prefix: String,
        /// The plan of its consumers, below a runtime setting; `None`: the anonymous plan, as for any other.
        plan: Option<String>,
    },
}

/// The prefix of an `mtls` identifier's consumer ids unless `consumer_prefix` is written.
pub const DEFAULT_MTLS_PREFIX: &str = "mtls:";

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

/// Whether `c` may stand in a consumer id.
pub fn consumer_id_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '@' | '-')
}

/// Whether `id` may name a consumer; the message says why not.
pub fn consumer_id(id: &str) -> Result<(), String> {
    // `.` and `..` would be path segments in the admin API's URLs, resolved away by clients and proxies.
    if id.is_empty()
        || id.len() > 128
        || !id.chars().all(consumer_id_char)
        || id == "."
        || id == ".."
    {
        return Err(format!(
            "invalid consumer id {id:?} (1 to 128 of A-Z a-z 0-9 . _ : @ -, not . or ..)"
        ));
    }
    Ok(())
}
