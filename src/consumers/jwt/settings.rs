//! The settings of one `jwt:` identifier, as the config module validates them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Uri};
use jsonwebtoken::Algorithm;

/// How often a `jwks_url` is fetched again when nothing asks sooner.
pub const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(300);

/// Verified tokens kept per verifier, at most; past it, expired entries go first, then those expiring soonest.
pub const TOKEN_CACHE_CAPACITY: usize = 65_536;

/// What the cached tokens of one verifier may take, at most (tokens run from under 1 KB to a few KB).
pub const TOKEN_CACHE_BYTES: usize = 64 * 1024 * 1024;

/// One `jwt:` identifier, validated (the config module builds it).
#[derive(Debug, Clone)]
pub struct JwtSettings {
    /// The request header carrying `Bearer <token>` (scheme case-insensitive); `authorization` by default.
    pub header: HeaderName,
    /// The accepted `alg` values: a non-empty subset of RS256, ES256, EdDSA and HS256. A token naming any other
    /// (`none` included) is refused, and so is one whose `alg` does not fit the key it names.
    pub algorithms: Vec<Algorithm>,
    /// Where the verification keys come from.
    pub keys: JwtKeySource,
    /// Required `iss`, when set (a token without one is refused).
    pub issuer: Option<String>,
    /// Accepted `aud` values (one match is enough; a token without `aud` is refused); empty: `aud` not checked.
    pub audiences: Vec<String>,
    /// Clock skew tolerated on `exp` and `nbf` (whole seconds count).
    pub leeway: Duration,
    /// The claim naming the consumer: a non-empty string, `sub` by default.
    pub consumer_claim: String,
    /// The claim naming the consumer's plan, if any (ignored when absent or not a string).
    pub plan_claim: Option<String>,
}

/// Where the keys that verify tokens come from. Its `Debug` never shows the secret.
#[derive(Clone)]
pub enum JwtKeySource {
    /// A JWKS document on disk, read at start (and on reload, since the config is rebuilt).
    File(PathBuf),
    /// A JWKS served over http(s), fetched in the background and refreshed every `refresh` (default 5m), and
    /// again (at most once per 30s) when a token names a `kid` not in the set.
    Url { url: Uri, refresh: Duration },
    /// HS256 shared secret (the config reads it from the env var `secret_env`).
    Secret(Vec<u8>),
}

// === impl JwtSettings ===

impl JwtSettings {
    /// Settings with the defaults of the config file: the `authorization` header, no issuer or audience check,
    /// no leeway, the consumer in `sub`, no plan claim.
    pub fn new(algorithms: Vec<Algorithm>, keys: JwtKeySource) -> Self {
        Self {
            header: http::header::AUTHORIZATION,
            algorithms,
            keys,
            issuer: None,
            audiences: Vec::new(),
            leeway: Duration::ZERO,
            consumer_claim: "sub".to_owned(),
            plan_claim: None,
        }
    }
}

// === impl JwtKeySource ===

impl fmt::Debug for JwtKeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
            Self::Url { url, refresh } => f
                .debug_struct("Url")
                .field("url", url)
                .field("refresh", refresh)
                .finish(),
            Self::Secret(secret) => write!(f, "Secret([{} bytes redacted])", secret.len()),
        }
    }
}
