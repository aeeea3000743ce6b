//! The verifier of one `jwt:` identifier: the keys it holds, the checks of §10, and the token cache in front.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use http::{HeaderMap, HeaderName, HeaderValue};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Validation};
use parking_lot::Mutex;
use serde_json::{Map, Value};

use crate::consumers::json::Claims;
use tokio::sync::Notify;

use super::bearer;
use super::cache::TokenCache;
use super::jwks::{self, AbortOnDrop, JwksUrl, Refresher};
use super::keys::KeySet;
use super::rejection::{JwtSetupError, TokenRejection};
use super::settings::{JwtKeySource, JwtSettings, TOKEN_CACHE_BYTES, TOKEN_CACHE_CAPACITY};

/// A token naming an unknown `kid` asks for the JWKS again at most this often: an issuer that rotated its keys is
/// picked up at once, while a stream of made-up `kid`s costs one fetch per period.
const REFETCH_AT_MOST_EVERY: Duration = Duration::from_secs(30);

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    /// The consumer id: the identifier's `consumer_prefix` and the consumer claim's value.
    pub consumer: Arc<str>,
    /// The plan claim's value, when configured and present as a non-empty string.
    pub plan: Option<Arc<str>>,
    /// `exp`, unix seconds.
    pub expires_at: u64,
}

/// Verifies the bearer tokens of one `jwt:` identifier. Cheap to clone (one `Arc`); `Send + Sync`.
///
/// With a JWKS URL, a background task fetches the keys and refreshes them; it ends when the last clone is dropped.
#[derive(Clone)]
pub struct JwtVerifier {
    shared: Arc<Shared>,
}

/// What every clone of a verifier shares, and what its refresh task reaches through a `Weak`.
pub(crate) struct Shared {
    header: HeaderName,
    algorithms: Vec<Algorithm>,
    /// One per allowed algorithm: jsonwebtoken requires every algorithm of a `Validation` to fit the key.
    validations: Vec<(Algorithm, Validation)>,
    consumer_claim: String,
    /// What the consumer claim is prefixed with to make the consumer id (`consumer_prefix`).
    consumer_prefix: String,
    plan_claim: Option<String>,
    leeway: u64,
    /// `None` until a JWKS URL is first fetched.
    keys: ArcSwapOption<KeySet>,
    next_generation: AtomicU64,
    cache: TokenCache,
    refetch: Option<Refetch>,
    /// Signature checks made (cache misses that got as far as a key).
    verifications: AtomicU64,
}

/// How a verifier with a JWKS URL asks its task for the keys again.
struct Refetch {
    asked: Arc<Notify>,
    started: Instant,
    /// Milliseconds after `started` of the last ask, `u64::MAX` before the first.
    last_asked_ms: AtomicU64,
    task: Mutex<RefreshTask>,
}

/// The refresh task: running, or waiting for a runtime to be spawned on (a verifier built outside one).
struct RefreshTask {
    pending: Option<Refresher>,
    running: Option<AbortOnDrop>,
}

// === impl JwtVerifier ===

impl JwtVerifier {
    /// Builds the verifier. A JWKS file that cannot be read or parsed is an error naming the file. A JWKS URL is
    /// fetched in a background task that start-up never waits for: until the first fetch succeeds, tokens are
    /// refused with `KeysUnavailable`, and the task retries (backoff up to 5s). A verifier built again for a URL
    /// fetched before in this process (a config reload) starts with the keys of that last fetch meanwhile. The task is spawned on the Tokio
    /// runtime this is called in or, built outside one, on the runtime of the first `verify` (the first token
    /// is then refused with `KeysUnavailable` while the fetch starts).
    pub fn new(settings: JwtSettings) -> Result<Self, JwtSetupError> {
        let mut keys = initial_keys(&settings)?;
        if let JwtKeySource::Url { url, .. } = &settings.keys {
            keys = jwks::remembered(url)
                .and_then(|json| KeySet::from_jwks(&json, &settings.algorithms, 0).ok());
        }
        let refresh = match &settings.keys {
            JwtKeySource::Url { url, refresh } => Some((JwksUrl::new(url)?, *refresh)),
            _ => None,
        };
        let validations = settings
            .algorithms
            .iter()
            .map(|alg| (*alg, validation(&settings, *alg)))
            .collect();
        let shared = Arc::new_cyclic(|weak: &Weak<Shared>| {
            let refetch = refresh.map(|(url, every)| {
                let asked = Arc::new(Notify::new());
                let refresher = Refresher {
                    url,
                    every,
                    asked: asked.clone(),
                    verifier: weak.clone(),
                };
                let task = match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => RefreshTask {
                        pending: None,
                        running: Some(AbortOnDrop(runtime.spawn(refresher.run()).abort_handle())),
                    },
                    Err(_) => RefreshTask {
                        pending: Some(refresher),
                        running: None,
                    },
                };
                Refetch {
                    asked,
                    started: Instant::now(),
                    last_asked_ms: AtomicU64::new(u64::MAX),
                    task: Mutex::new(task),
                }
            });
            Shared {
                header: settings.header.clone(),
                algorithms: settings.algorithms.clone(),
                validations,
                consumer_claim: settings.consumer_claim.clone(),
                consumer_prefix: settings.consumer_prefix(),
                plan_claim: settings.plan_claim.clone(),
                leeway: settings.leeway.as_secs(),
                keys: ArcSwapOption::new(keys.map(Arc::new)),
                next_generation: AtomicU64::new(1),
                cache: TokenCache::new(TOKEN_CACHE_CAPACITY, TOKEN_CACHE_BYTES),
                refetch,
                verifications: AtomicU64::new(0),
            }
        });
        Ok(Self { shared })
    }

    /// Checks what [`new`](Self::new) checks (the JWKS file read and its keys, the URL, the secret) without
    /// building anything or fetching the URL: for `tollgate check`, which has no runtime to fetch with.
    pub fn check(settings: &JwtSettings) -> Result<(), JwtSetupError> {
        initial_keys(settings)?;
        if let JwtKeySource::Url { url, .. } = &settings.keys {
            JwksUrl::new(url)?;
        }
        Ok(())
    }

    /// The token of a request: `None` when the header is absent or holds another scheme's credentials (no
    /// credential: the caller tries the next identifier), `Some(Err(Malformed))` when it is present but not one
    /// `Bearer <token>`.
    pub fn token_from<'h>(
        &self,
        headers: &'h HeaderMap,
    ) -> Option<Result<&'h str, TokenRejection>> {
        bearer::token_from(headers, &self.shared.header)
    }

    /// The token in one value of the header, `Malformed` when it is not `Bearer <token>`: for a caller that read
    /// the header already.
    pub fn token_in<'h>(&self, value: &'h HeaderValue) -> Result<&'h str, TokenRejection> {
        bearer::token_in(value)
    }

    /// Verifies `token`: its `alg` allowed and fitting the key, the signature, `exp` (required), `nbf`, `iss`,
    /// `aud` with the leeway; then reads the consumer and plan claims. A verified token is cached until its `exp`
    /// (plus leeway), so verifying it again is one hash lookup.
    pub fn verify(&self, token: &str) -> Result<VerifiedToken, TokenRejection> {
        let now = unix_now();
        if let Some(answer) = self.shared.cache.get(token, now) {
            return answer;
        }
        let answer = self.shared.verify(token, now, true);
        // Counted off the cache only: a hit costs no metrics work, and a miss costs far more anyway.
        let result = answer
            .as_ref()
            .map_or_else(TokenRejection::reason, |_| "ok");
        metrics::counter!("tollgate_jwt_verifications_total", "result" => result).increment(1);
        answer
    }

    /// Verifies `token` as [`verify`](Self::verify) does, but always by its signature and without caching it:
    /// what a cache miss costs (benches, diagnostics).
    pub fn verify_uncached(&self, token: &str) -> Result<VerifiedToken, TokenRejection> {
        self.shared.verify(token, unix_now(), false)
    }

    /// The header tokens are read from.
    pub fn header(&self) -> &HeaderName {
        &self.shared.header
    }

    /// How many usable keys are held (0 until a JWKS URL is first fetched).
    pub fn key_count(&self) -> usize {
        self.shared
            .keys
            .load()
            .as_ref()
            .map_or(0, |keys| keys.len())
    }

    /// Signature checks made since it was built (cache hits make none).
    pub fn verifications(&self) -> u64 {
        self.shared.verifications.load(Ordering::Relaxed)
    }

    /// Tokens in the cache.
    pub fn cached_tokens(&self) -> usize {
        self.shared.cache.len()
    }

    #[cfg(test)]
    pub(crate) fn refresh_signal(&self) -> Option<Arc<Notify>> {
        self.shared.refetch.as_ref().map(|r| r.asked.clone())
    }
}

impl fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JwtVerifier")
            .field("header", &self.shared.header)
            .field("algorithms", &self.shared.algorithms)
            .field("keys", &self.key_count())
            .field("cached_tokens", &self.cached_tokens())
            .finish_non_exhaustive()
    }
}

// === impl Shared ===

impl Shared {
    fn verify(&self, token: &str, now: u64, cache: bool) -> Result<VerifiedToken, TokenRejection> {
        let header = bearer::jose_header(token)?;
        let alg = Algorithm::from_str(&header.alg)
            .ok()
            .filter(|alg| self.algorithms.contains(alg))
            .ok_or(TokenRejection::AlgorithmNotAllowed)?;
        let Some(keys) = self.keys.load_full() else {
            self.start_refresh();
            return Err(TokenRejection::KeysUnavailable);
        };
        let candidates = keys
            .candidates(alg, header.kid.as_deref())
            .inspect_err(|_| {
                if let Some(kid) = header.kid.as_deref().filter(|kid| !keys.knows(kid)) {
                    self.ask_refetch(kid);
                }
            })?;
        let validation = self
            .validations
            .iter()
            .find_map(|(allowed, validation)| (*allowed == alg).then_some(validation))
            .ok_or(TokenRejection::AlgorithmNotAllowed)?;
        let mut outcome = Err(TokenRejection::UnknownKey);
        // Without a `kid`, each key that fits is tried; a signature that fails one may verify with the next.
        for key in candidates {
            self.verifications.fetch_add(1, Ordering::Relaxed);
            // Claims with a member named twice are malformed: which `sub` would the upstream's parser read?
            outcome = jsonwebtoken::decode::<Claims>(token, key, validation)
                .map(|data| data.claims.0)
                .map_err(|error| rejection(error.kind()));
            if outcome != Err(TokenRejection::BadSignature) {
                break;
            }
        }
        let verified = self.read_claims(&outcome?)?;
        if cache {
            let valid_until = verified.expires_at.saturating_add(self.leeway);
            self.cache
                .insert(token, verified.clone(), valid_until, keys.generation, now);
        }
        Ok(verified)
    }

    fn read_claims(&self, claims: &Map<String, Value>) -> Result<VerifiedToken, TokenRejection> {
        let string = |name: &str| match claims.get(name) {
            Some(Value::String(value)) if !value.is_empty() => {
                Some(Arc::<str>::from(value.as_str()))
            }
            _ => None,
        };
        let consumer = string(&self.consumer_claim).ok_or(TokenRejection::MissingClaim)?;
        // The id reaches store keys, logs and the consumer header: it obeys the admin API's character set, or a
        // `sub` with CR LF would silently lose the header the upstream believes.
        if crate::consumers::consumer_id(&consumer).is_err() {
            return Err(TokenRejection::InvalidConsumerId);
        }
        // The identifier's namespace: a `sub` of `zed` is never the API-key consumer `zed`, nor another issuer's.
        let consumer = if self.consumer_prefix.is_empty() {
            consumer
        } else {
            let id = format!("{}{consumer}", self.consumer_prefix);
            if crate::consumers::consumer_id(&id).is_err() {
                return Err(TokenRejection::InvalidConsumerId);
            }
            Arc::from(id)
        };
        let plan = self.plan_claim.as_deref().and_then(string);
        // jsonwebtoken has checked `exp` is there and a non-negative number (an integer or not).
        let expires_at = match claims.get("exp") {
            Some(Value::Number(exp)) => exp
                .as_u64()
                .or_else(|| exp.as_f64().map(|exp| exp.round() as u64)),
            _ => None,
        }
        .ok_or(TokenRejection::MissingClaim)?;
        Ok(VerifiedToken {
            consumer,
            plan,
            expires_at,
        })
    }

    /// Installs the keys of a JWKS just fetched; a document with the same keys as now changes nothing (the cache
    /// stays), one with others replaces them and empties the cache.
    pub(crate) fn install_jwks(&self, json: &[u8]) -> Result<(), String> {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        let keys = KeySet::from_jwks(json, &self.algorithms, generation)?;
        if let Some(current) = self.keys.load().as_ref() {
            if current.same_keys(&keys) {
                return Ok(());
            }
        }
        tracing::info!(keys = keys.len(), "JWKS keys installed");
        self.keys.store(Some(Arc::new(keys)));
        self.cache.reset(generation);
        Ok(())
    }

    /// Spawns the refresh task if the verifier was built outside a runtime and this runs in one. Reached only
    /// while no keys are held, so never on the path of a token that verifies.
    fn start_refresh(&self) {
        let Some(refetch) = &self.refetch else {
            return;
        };
        let mut task = refetch.task.lock();
        if task.pending.is_none() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if let Some(refresher) = task.pending.take() {
            task.running = Some(AbortOnDrop(runtime.spawn(refresher.run()).abort_handle()));
        }
    }

    /// Wakes the refresh task for a token naming `kid`, unless it was woken less than 30s ago.
    fn ask_refetch(&self, kid: &str) {
        let Some(refetch) = &self.refetch else {
            return;
        };
        let now = u64::try_from(refetch.started.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        let last = refetch.last_asked_ms.load(Ordering::Relaxed);
        let due = last == u64::MAX
            || now.saturating_sub(last) >= REFETCH_AT_MOST_EVERY.as_millis() as u64;
        // One caller wins the exchange; the others see the new time and leave it.
        if due
            && refetch
                .last_asked_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::debug!(%kid, "token names an unknown kid: fetching the JWKS again");
            refetch.asked.notify_one();
        }
    }
}

/// The keys known before any fetch: a JWKS file's or the secret's; `None` for a JWKS URL.
fn initial_keys(settings: &JwtSettings) -> Result<Option<KeySet>, JwtSetupError> {
    Ok(match &settings.keys {
        JwtKeySource::File(path) => Some(jwks::read_file(path, &settings.algorithms, 0)?),
        JwtKeySource::Secret(secret) if secret.is_empty() => {
            return Err(JwtSetupError::EmptySecret)
        }
        JwtKeySource::Secret(secret) => Some(KeySet::from_secret(secret, 0)),
        JwtKeySource::Url { .. } => None,
    })
}

/// The checks jsonwebtoken makes for tokens signed with `alg`.
fn validation(settings: &JwtSettings, alg: Algorithm) -> Validation {
    let mut validation = Validation::new(alg);
    validation.leeway = settings.leeway.as_secs();
    validation.validate_exp = true;
    validation.validate_nbf = true;
    // jsonwebtoken checks `iss` and `aud` only when the token has them: required, a token cannot skip the check
    // by leaving them out.
    let mut required = vec!["exp"];
    if let Some(issuer) = &settings.issuer {
        validation.set_issuer(&[issuer]);
        required.push("iss");
    }
    if settings.audiences.is_empty() {
        // Unset, jsonwebtoken would refuse every token that has an `aud`.
        validation.validate_aud = false;
    } else {
        validation.set_audience(&settings.audiences);
        required.push("aud");
    }
    validation.set_required_spec_claims(&required);
    validation
}

/// The class of a jsonwebtoken error.
fn rejection(kind: &ErrorKind) -> TokenRejection {
    match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => TokenRejection::BadSignature,
        ErrorKind::ExpiredSignature => TokenRejection::Expired,
        ErrorKind::ImmatureSignature => TokenRejection::NotYetValid,
        ErrorKind::InvalidIssuer => TokenRejection::WrongIssuer,
        ErrorKind::InvalidAudience => TokenRejection::WrongAudience,
        ErrorKind::MissingRequiredClaim(claim) => match claim.as_str() {
            "iss" => TokenRejection::WrongIssuer,
            "aud" => TokenRejection::WrongAudience,
            _ => TokenRejection::MissingClaim,
        },
        ErrorKind::InvalidClaimFormat(claim) if claim == "exp" => TokenRejection::MissingClaim,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => {
            TokenRejection::AlgorithmNotAllowed
        }
        _ => TokenRejection::Malformed,
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropping_the_verifier_stops_its_refresh_task() {
        // Nothing listens on port 9 of the loopback: the task keeps retrying until the verifier goes.
        let settings = JwtSettings::new(
            vec![Algorithm::RS256],
            JwtKeySource::Url {
                url: "http://127.0.0.1:9/jwks.json".parse().expect("url"),
                refresh: Duration::from_secs(60),
            },
        );
        let verifier = JwtVerifier::new(settings).expect("verifier");
        let signal = verifier.refresh_signal().expect("a refresh task");
        let clone = verifier.clone();
        drop(verifier);
        tokio::task::yield_now().await;
        // The verifier itself, its task and this test: a clone keeps the task alive.
        assert_eq!(Arc::strong_count(&signal), 3);
        drop(clone);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&signal) > 1 {
            assert!(
                Instant::now() < deadline,
                "the refresh task outlived its verifier"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn an_unknown_kid_asks_for_a_refetch_at_most_every_30s() {
        let settings = JwtSettings::new(
            vec![Algorithm::HS256],
            JwtKeySource::Url {
                url: "http://127.0.0.1:9/jwks.json".parse().expect("url"),
                refresh: Duration::from_secs(60),
            },
        );
        let verifier = JwtVerifier::new(settings).expect("verifier");
        let refetch = verifier.shared.refetch.as_ref().expect("refetch");
        assert_eq!(refetch.last_asked_ms.load(Ordering::Relaxed), u64::MAX);
        verifier.shared.ask_refetch("k");
        let first = refetch.last_asked_ms.load(Ordering::Relaxed);
        assert_ne!(first, u64::MAX);
        verifier.shared.ask_refetch("k");
        assert_eq!(
            refetch.last_asked_ms.load(Ordering::Relaxed),
            first,
            "too soon"
        );
    }
}
