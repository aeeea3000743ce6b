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
    /// What the consumer claim is prefixed with to make the consumer id, so that a token's consumers live apart
    /// from API-key consumers and other issuers' (see [`consumer_prefix`](Self::consumer_prefix)); `None`: the
    /// default, from `issuer`. `Some("")` joins the claim's ids with the API keys' on purpose.
    pub consumer_prefix: Option<String>,
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
            consumer_prefix: None,
        }
    }

    /// The prefix of this identifier's consumer ids: `consumer_prefix` when set, otherwise the issuer without
    /// its scheme, each run of characters a consumer id may not hold made one `:`, and a `:` after it
    /// (`https://auth.example.com/realms/a` gives `auth.example.com:realms:a:`), or `jwt:` without an issuer.
    pub fn consumer_prefix(&self) -> String {
        match (&self.consumer_prefix, &self.issuer) {
            (Some(prefix), _) => prefix.clone(),
            (None, Some(issuer)) => issuer_prefix(issuer),
            (None, None) => DEFAULT_CONSUMER_PREFIX.to_owned(),
        }
    }
}

/// The prefix of the consumer ids of an identifier with no issuer.
pub const DEFAULT_CONSUMER_PREFIX: &str = "jwt:";

/// The prefix an issuer gives its consumer ids by default (see [`JwtSettings::consumer_prefix`]).
fn issuer_prefix(issuer: &str) -> String {
    let bare = ["https://", "http://"]
        .iter()
        .find_map(|scheme| issuer.strip_prefix(scheme))
        .unwrap_or(issuer);
    let mut prefix = String::with_capacity(bare.len() + 1);
    for c in bare.chars() {
        if crate::consumers::consumer_id_char(c) {
            prefix.push(c);
        } else if !prefix.is_empty() && !prefix.ends_with(':') {
            prefix.push(':');
        }
    }
    if prefix.is_empty() {
        return DEFAULT_CONSUMER_PREFIX.to_owned();
    }
    if !prefix.ends_with(':') {
        prefix.push(':');
    }
    prefix
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issuer_names_its_consumers_apart() {
        let prefix = |issuer: Option<&str>, set: Option<&str>| {
            let mut settings = JwtSettings::new(Vec::new(), JwtKeySource::Secret(Vec::new()));
            settings.issuer = issuer.map(str::to_owned);
            settings.consumer_prefix = set.map(str::to_owned);
            settings.consumer_prefix()
        };
        assert_eq!(prefix(None, None), "jwt:");
        assert_eq!(
            prefix(Some("https://auth.example.com"), None),
            "auth.example.com:"
        );
        assert_eq!(
            prefix(Some("https://auth.example.com/"), None),
            "auth.example.com:"
        );
        assert_eq!(
            prefix(Some("https://kc.example.com:8443/realms/a b"), None),
            "kc.example.com:8443:realms:a:b:"
        );
        assert_eq!(prefix(Some("urn:acme"), None), "urn:acme:");
        assert_eq!(prefix(Some("https://"), None), "jwt:");
        assert_eq!(prefix(Some("https://a.test"), Some("")), "");
        assert_eq!(prefix(None, Some("idp-")), "idp-");
    }
}
