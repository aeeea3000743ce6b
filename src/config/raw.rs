//! The config file as written: plain serde structs mirroring the YAML, before any validation.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

/// The whole file.
///
/// Durations and rates stay strings in these structs, so that validation can report every bad value with its
/// location instead of serde stopping at the first one. Unknown keys are refused everywhere: a typo must not
/// disable a limit.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawConfig {
    /// `None` when not written: 0.0.0.0:8080, or no clear-text listener when `tls.listen` is set.
    pub listen: Option<String>,
    pub admin: RawAdmin,
    pub store: RawStore,
    pub client_ip: RawClientIp,
    pub server: RawServer,
    pub upstreams: Ordered<RawUpstream>,
    pub routes: Vec<RawRoute>,
    pub consumers: Option<RawConsumers>,
    pub rls: Option<super::rls::RawRls>,
    pub tls: Option<super::tls::RawTls>,
    pub telemetry: super::telemetry::RawTelemetry,
}

/// `admin:`
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawAdmin {
    pub listen: String,
    /// `None` when written `token:` with nothing after it.
    pub token: Option<String>,
    pub readyz_degraded_status: u64,
}

/// `store.backend`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawBackend {
    Redis,
    Memory,
}

/// `store.on_error`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawOnError {
    Allow,
    Deny,
    Local,
}

/// `store.when_full`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawWhenFull {
    Deny,
    Allow,
}

/// `store:`
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawStore {
    pub backend: RawBackend,
    pub url: String,
    #[serde(deserialize_with = "scalar_text")]
    pub timeout: String,
    pub on_error: RawOnError,
    pub key_prefix: String,
    pub max_keys: u64,
    pub when_full: RawWhenFull,
    pub pool_size: u64,
    pub max_keys_per_limit: Option<u64>,
}

/// `client_ip:`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawClientIp {
    pub trusted_proxies: Vec<String>,
    pub ipv6_prefix: Option<u64>,
    pub forwarded: bool,
    pub header: RawClientIpHeader,
}

/// `client_ip.header`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum RawClientIpHeader {
    #[default]
    XForwardedFor,
    Forwarded,
    XRealIp,
}

/// `server:`
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawServer {
    #[serde(deserialize_with = "scalar_text")]
    pub header_read_timeout: String,
    #[serde(deserialize_with = "scalar_text")]
    pub keepalive_timeout: String,
    #[serde(deserialize_with = "scalar_text")]
    pub body_read_timeout: String,
    pub health_path: Option<String>,
    pub max_body_bytes: Option<u64>,
    pub max_header_bytes: u64,
    #[serde(deserialize_with = "scalar_text")]
    pub shutdown_grace: String,
    #[serde(deserialize_with = "scalar_text")]
    pub shutdown_delay: String,
    pub underscores_in_headers: bool,
    pub escaped_slashes: RawEscapedSlashes,
}

/// `server.escaped_slashes`
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawEscapedSlashes {
    #[default]
    Reject,
    Keep,
}

/// One entry of `upstreams:`.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawUpstream {
    pub targets: Vec<String>,
    #[serde(deserialize_with = "scalar_text")]
    pub timeout: String,
    #[serde(deserialize_with = "scalar_text")]
    pub connect_timeout: String,
    pub pass_host_header: bool,
    pub tls: Option<RawUpstreamTls>,
    pub health: RawHealth,
    pub retry: RawRetry,
    #[serde(deserialize_with = "scalar_text")]
    pub idle_timeout: String,
}

/// `health:` of an upstream: passive health, nginx's `max_fails` and `fail_timeout`.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawHealth {
    pub max_fails: u32,
    #[serde(deserialize_with = "scalar_text")]
    pub fail_timeout: String,
}

/// `retry:` of an upstream: tries in all, the first included; `None` when not written (as many as targets).
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawRetry {
    pub attempts: Option<u32>,
}

/// `tls:` of an upstream: how its `https` targets are verified, and the client certificate it presents.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawUpstreamTls {
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    pub server_name: Option<String>,
}

/// One entry of `routes:`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRoute {
    /// Empty when absent, so that validation reports it with the route's other problems.
    #[serde(default)]
    pub name: String,
    #[serde(default, rename = "match")]
    pub matcher: RawMatch,
    #[serde(default)]
    pub upstream: Option<String>,
    #[serde(default)]
    pub respond: Option<RawRespond>,
    #[serde(default)]
    pub limits: Vec<RawLimit>,
    #[serde(default = "default_deny_status")]
    pub deny_status: u16,
    #[serde(default = "default_true")]
    pub headers: bool,
    /// Client networks exempt from the route's limits.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Whether the route identifies consumers: `required`, `optional` or `off`.
    #[serde(default)]
    pub consumers: Option<RawConsumerMode>,
    /// How the route's answers report the tokens they cost (LLM APIs).
    #[serde(default)]
    pub usage: Option<RawUsage>,
}

/// `usage:` of a route. Amounts are kept as text (`body_bytes`, `max_tokens` or a number), checked later.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawUsage {
    pub format: Option<String>,
    pub reserve: RawReserve,
    pub stream_usage: Option<String>,
    pub max_request_bytes: Option<u64>,
    pub read_on_bytes: Option<u64>,
    pub read_on_timeout: Option<String>,
    /// The path suffixes whose requests take a completion bound (the format's API's endpoints when absent).
    pub endpoints: Option<Vec<String>>,
}

/// `reserve:` of a route's `usage:`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawReserve {
    #[serde(deserialize_with = "optional_scalar_text")]
    pub prompt: Option<String>,
    #[serde(deserialize_with = "optional_scalar_text")]
    pub completion: Option<String>,
    pub completion_default: Option<u64>,
    pub completion_cap: Option<u64>,
}

/// `consumers:` of a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawConsumerMode {
    Required,
    Optional,
    Off,
}

/// The top-level `consumers:` block (see docs/configuration.md, "Consumers and plans").
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawConsumers {
    pub identify: Vec<RawIdentifier>,
    pub keys: Vec<RawStaticKey>,
    pub anonymous: Option<RawAnonymous>,
    pub forward: RawForward,
    pub plans: Ordered<RawPlan>,
    pub failed_credentials: Option<RawFailedCredentials>,
    pub cache: Option<u64>,
}

/// `failed_credentials:` of `consumers:`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawFailedCredentials {
    pub limit: u64,
    #[serde(deserialize_with = "scalar_text")]
    pub period: String,
}

/// One entry of `identify:`: exactly one of its fields.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawIdentifier {
    pub api_key: Option<RawCredentialSource>,
    pub jwt: Option<RawJwt>,
    pub mtls: Option<RawMtls>,
}

/// `mtls:` of `identify:`: the connection's client certificate names the consumer.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawMtls {
    pub consumer_prefix: Option<String>,
    pub plan: Option<String>,
}

/// Where an API key is read: exactly one of `header` and `query`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawCredentialSource {
    pub header: Option<String>,
    pub query: Option<String>,
    pub hide_credentials: bool,
}

/// `jwt:` of `identify:`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawJwt {
    pub header: Option<String>,
    pub algorithms: Vec<String>,
    pub jwks_file: Option<String>,
    pub jwks_url: Option<String>,
    #[serde(deserialize_with = "optional_scalar_text")]
    pub jwks_refresh: Option<String>,
    pub secret_env: Option<String>,
    pub issuer: Option<String>,
    pub audiences: Vec<String>,
    #[serde(deserialize_with = "optional_scalar_text")]
    pub leeway: Option<String>,
    pub consumer_claim: Option<String>,
    pub plan_claim: Option<String>,
    pub consumer_prefix: Option<String>,
    pub hide_credentials: bool,
}

/// One entry of `keys:`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawStaticKey {
    pub key: String,
    pub consumer: String,
    pub plan: Option<String>,
}

/// `anonymous:`, written `{ plan: NAME }` or `reject`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum RawAnonymous {
    Word(String),
    Plan(RawAnonymousPlan),
}

/// `anonymous: { plan: NAME }`
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawAnonymousPlan {
    pub plan: String,
}

/// `forward:`
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawForward {
    pub consumer: Option<String>,
    pub plan: Option<String>,
}

/// One entry of `plans:`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawPlan {
    pub limits: Vec<RawLimit>,
}

/// `match:` of a route.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawMatch {
    pub path_prefix: Option<String>,
    pub path: Option<String>,
    pub methods: Vec<String>,
    pub host: Option<String>,
    /// Accepted for old configs: paths are matched without regard to case unless `case_sensitive`.
    pub case_insensitive: bool,
    pub case_sensitive: bool,
}

/// `respond:` of a route.
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub(crate) struct RawRespond {
    pub status: u16,
    pub body: String,
    pub headers: Ordered<String>,
}

/// `missing:` of a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RawMissing {
    #[default]
    Ip,
    Skip,
}

/// One entry of a route's `limits:`. Parameters of every algorithm are optional here: validation says which
/// the chosen algorithm needs and refuses the others.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawLimit {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub key: Option<KeyParts>,
    #[serde(default)]
    pub missing: RawMissing,
    #[serde(default)]
    pub algorithm: String,
    #[serde(default)]
    pub limit: Option<u64>,
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub period: Option<String>,
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub rate: Option<String>,
    #[serde(default)]
    pub burst: Option<u64>,
    #[serde(default = "default_cost")]
    pub cost: u64,
    #[serde(default)]
    pub mode: Option<String>,
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub max_delay: Option<String>,
    /// `concurrency`: requests in flight at once.
    #[serde(default)]
    pub max: Option<u64>,
    /// `concurrency`: how long a slot outlives an instance that stopped renewing it.
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub lease: Option<String>,
    /// `concurrency`: whether and how long a request waits for a slot.
    #[serde(default)]
    pub queue: Option<RawQueue>,
    /// `fixed_window`: windows of the calendar (`day`, `week`, `month`, `year`) instead of a `period`.
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub calendar: Option<String>,
    /// The IANA time zone whose midnight starts the calendar's windows (UTC when absent).
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub timezone: Option<String>,
    /// The key is a credential (or made from one): its values are digested (`KeySpec::secret`).
    #[serde(default)]
    pub secret: bool,
    /// Decide, log and count, but never enforce.
    #[serde(default)]
    pub shadow: bool,
    /// What the limit counts: `requests` (the default), a kind of tokens, or `{ status: [...] }`.
    #[serde(default)]
    pub counts: Option<RawCounts>,
}

/// `queue:` of a `concurrency` limit.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQueue {
    #[serde(default, deserialize_with = "optional_scalar_text")]
    pub max_wait: Option<String>,
    #[serde(default)]
    pub max_waiting: Option<u64>,
}

/// `counts:` as written: a name (`requests`) or `{ status: [401, "5xx"] }` (codes kept as text, checked later).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RawCounts {
    Name(String),
    Status(Vec<String>),
}

/// `key:` written as one part (`key: ip`) or a list (`key: [route, header:x-api-key]`); which of the two is kept
/// so that messages name `key` or `key[1]` as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyParts {
    One(String),
    List(Vec<String>),
}

/// A YAML mapping whose entry order matters (upstreams, response headers), refusing duplicate keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ordered<V>(pub Vec<(String, V)>);

// === defaults ===

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            listen: None,
            admin: RawAdmin::default(),
            store: RawStore::default(),
            client_ip: RawClientIp::default(),
            server: RawServer::default(),
            upstreams: Ordered(Vec::new()),
            routes: Vec::new(),
            consumers: None,
            rls: None,
            tls: None,
            telemetry: Default::default(),
        }
    }
}

impl Default for RawAdmin {
    fn default() -> Self {
        RawAdmin {
            listen: "127.0.0.1:9901".to_owned(),
            token: None,
            readyz_degraded_status: 200,
        }
    }
}

impl Default for RawStore {
    fn default() -> Self {
        RawStore {
            backend: RawBackend::Memory,
            url: "redis://127.0.0.1:6379".to_owned(),
            timeout: "25ms".to_owned(),
            on_error: RawOnError::Local,
            key_prefix: "tollgate:".to_owned(),
            max_keys: 1_000_000,
            when_full: RawWhenFull::Deny,
            pool_size: 4,
            max_keys_per_limit: None,
        }
    }
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            header_read_timeout: "10s".to_owned(),
            keepalive_timeout: "75s".to_owned(),
            body_read_timeout: "30s".to_owned(),
            health_path: None,
            max_body_bytes: None,
            max_header_bytes: 65_536,
            shutdown_grace: "30s".to_owned(),
            shutdown_delay: "0s".to_owned(),
            underscores_in_headers: false,
            escaped_slashes: RawEscapedSlashes::Reject,
        }
    }
}

impl Default for RawUpstream {
    fn default() -> Self {
        RawUpstream {
            targets: Vec::new(),
            timeout: "30s".to_owned(),
            connect_timeout: "5s".to_owned(),
            pass_host_header: true,
            tls: None,
            health: RawHealth::default(),
            retry: RawRetry::default(),
            idle_timeout: "60s".to_owned(),
        }
    }
}

impl Default for RawHealth {
    /// nginx's defaults, which users of a proxy expect: one failure skips a target for 10 s.
    fn default() -> Self {
        RawHealth {
            max_fails: 1,
            fail_timeout: "10s".to_owned(),
        }
    }
}

impl Default for RawRespond {
    fn default() -> Self {
        RawRespond {
            status: 200,
            body: String::new(),
            headers: Ordered(Vec::new()),
        }
    }
}

impl<V> Default for Ordered<V> {
    fn default() -> Self {
        Ordered(Vec::new())
    }
}

fn default_deny_status() -> u16 {
    429
}

fn default_true() -> bool {
    true
}

fn default_cost() -> u64 {
    1
}

// === scalars kept as text ===

/// Accepts any scalar as text, so that `timeout: 30` reaches validation and gets the duration message ("use 1s")
/// rather than a type error.
pub(super) fn scalar_text<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    deserializer.deserialize_any(ScalarText)
}

fn optional_scalar_text<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    scalar_text(deserializer).map(Some)
}

struct ScalarText;

impl Visitor<'_> for ScalarText {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration such as 250ms, 1s or 1m, or a rate such as 10/s")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
        Ok(v.to_string())
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
        Ok(v.to_string())
    }
}

// === impl KeyParts ===

impl<'de> Deserialize<'de> for KeyParts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(KeyPartsVisitor)
    }
}

struct KeyPartsVisitor;

impl<'de> Visitor<'de> for KeyPartsVisitor {
    type Value = KeyParts;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key part (ip, header:NAME...) or a list of key parts")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<KeyParts, E> {
        Ok(KeyParts::One(v.to_owned()))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<KeyParts, A::Error> {
        let mut parts = Vec::new();
        while let Some(part) = seq.next_element::<String>()? {
            parts.push(part);
        }
        Ok(KeyParts::List(parts))
    }
}

// === impl RawCounts ===

impl<'de> Deserialize<'de> for RawCounts {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(RawCountsVisitor)
    }
}

struct RawCountsVisitor;

/// One status of `counts.status`: a number or a class written as text.
struct StatusText(String);

impl<'de> Deserialize<'de> for StatusText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct StatusTextVisitor;
        impl Visitor<'_> for StatusTextVisitor {
            type Value = StatusText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an HTTP status (401) or class (5xx)")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<StatusText, E> {
                Ok(StatusText(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<StatusText, E> {
                Ok(StatusText(v.to_string()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StatusText, E> {
                Ok(StatusText(v.to_owned()))
            }
        }
        deserializer.deserialize_any(StatusTextVisitor)
    }
}

impl<'de> Visitor<'de> for RawCountsVisitor {
    type Value = RawCounts;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("`requests`, `input_tokens`, `output_tokens`, `total_tokens` or `{ status: [401, 403] }`")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<RawCounts, E> {
        Ok(RawCounts::Name(v.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawCounts, A::Error> {
        let mut statuses = None;
        while let Some(field) = map.next_key::<String>()? {
            if field != "status" {
                return Err(de::Error::unknown_field(&field, &["status"]));
            }
            if statuses.is_some() {
                return Err(de::Error::duplicate_field("status"));
            }
            let list: Vec<StatusText> = map.next_value()?;
            statuses = Some(list.into_iter().map(|status| status.0).collect());
        }
        statuses
            .map(RawCounts::Status)
            .ok_or_else(|| de::Error::missing_field("status"))
    }
}

// === impl Ordered ===

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(OrderedVisitor(PhantomData))
    }
}

struct OrderedVisitor<V>(PhantomData<V>);

impl<'de, V: Deserialize<'de>> Visitor<'de> for OrderedVisitor<V> {
    type Value = Ordered<V>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a mapping")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ordered<V>, A::Error> {
        let mut entries: Vec<(String, V)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            if entries.iter().any(|(seen, _)| *seen == key) {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            let value = map.next_value()?;
            entries.push((key, value));
        }
        Ok(Ordered(entries))
    }
}
