//! Identification: which consumer a request comes from and which plan applies, or why it is refused.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

#[cfg(feature = "jwt")]
use http::HeaderName;
use http::HeaderValue;

use super::api_key::{self, Presented};
use super::directory::{ConsumerRecord, Directory, Known, LimitOverride, StoredRecord};
use super::failures::FailureLimit;
#[cfg(feature = "jwt")]
use super::jwt::{other_scheme, JwtVerifier, TokenRejection};
use super::overrides::overridden;
use super::settings::{
    consumer_id, Anonymous, ConsumerMode, ConsumersSettings, CredentialSource, ForwardHeaders,
    IdentifierSettings, Plan,
};
use crate::key::{RequestFacts, PLAN_KEY_SCOPE};
use crate::limiter::Limit;

/// How many consumers' compiled overrides are kept at most.
const COMPILED_BOUND: usize = 100_000;

/// The compiled `consumers:` block, shared by every route of a config: identifiers, static keys and plans.
#[derive(Debug)]
pub struct Consumers {
    identifiers: Vec<Identifier>,
    /// Static keys by digest.
    static_keys: HashMap<[u8; 32], KeyOwner, foldhash::fast::RandomState>,
    anonymous: AnonymousPolicy,
    forward: ForwardHeaders,
    plans: Vec<Plan>,
    /// `store.key_prefix`, which plan limits' keys start with.
    key_prefix: String,
    /// What the admin API set at runtime: plans, overrides, blocks, issued keys. Outlives config reloads.
    directory: Arc<Directory>,
    /// The limit on failed credentials per client address, if any.
    failures: Option<FailureLimit>,
    /// The overrides of the consumers that have some, compiled once per record and plan (not per request).
    compiled: parking_lot::Mutex<HashMap<Arc<str>, CompiledOverrides, foldhash::fast::RandomState>>,
    /// `WWW-Authenticate` of a 401 for a missing credential: one challenge per kind of credential accepted.
    challenges: HeaderValue,
}

/// Who a request comes from, once identified: what admission keys, limits and forwards by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The consumer id; `None` for an anonymous caller.
    pub consumer: Option<Arc<str>>,
    /// The index of its plan in [`Consumers::plans`], if any.
    pub plan: Option<usize>,
    /// The consumer's own parameters for some of its plan's limits (by index in the plan), named
    /// `<plan>.<limit>` as the plan's limits are advertised.
    pub overrides: Option<Arc<[(usize, Limit)]>>,
    /// The credential that named the caller, when its identifier hides it from the upstream
    /// (`hide_credentials`): see [`hide`](super::hide()).
    pub hidden: Option<CredentialSource>,
}

/// Why a caller is refused before any limit is asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallerRefusal {
    /// A credential is present but does not verify (401); `reason` is its class, never the credential.
    #[error("credential refused: {reason}")]
    Invalid {
        /// The scheme of the credential: `ApiKey` or `Bearer`.
        scheme: &'static str,
        /// `unknown_key`, `expired`, `bad_signature`...
        reason: &'static str,
    },
    /// No credential where one is required (401).
    #[error("a credential is required")]
    Missing,
    /// The consumer is blocked (403).
    #[error("consumer blocked")]
    Blocked,
    /// A credential sent twice (400): which copy the upstream reads would be a guess.
    #[error("a credential occurs more than once")]
    Ambiguous,
    /// The directory in Redis could not be asked about a credential this instance does not hold (still reading the
    /// directory at start, or not cached with `consumers.cache`) (503): a valid key is never refused as unknown
    /// because this instance has not read it.
    #[error("the consumer directory cannot be read")]
    DirectoryUnavailable,
}

/// One compiled entry of `identify:`.
#[derive(Debug)]
enum Identifier {
    ApiKey {
        source: CredentialSource,
        /// The key, where the upstream must not see it (`hide_credentials`).
        hidden: Option<CredentialSource>,
    },
    #[cfg(feature = "jwt")]
    Jwt {
        /// The header carrying `Bearer <token>`.
        header: HeaderName,
        /// `None` when the verifier could not be built (its JWKS file vanished since the config was checked):
        /// every token is then refused as `keys_unavailable`.
        verifier: Option<JwtVerifier>,
        /// The header, where the upstream must not see it (`hide_credentials`).
        hidden: Option<CredentialSource>,
    },
    /// The connection's client certificate, named by its common name.
    Mtls {
        /// `consumer_prefix`.
        prefix: String,
        /// The plan it gives, by index.
        plan: Option<usize>,
    },
}

/// A consumer's overrides compiled for one version of its record and one plan.
#[derive(Debug)]
struct CompiledOverrides {
    record: StoredRecord,
    plan: usize,
    limits: Option<Arc<[(usize, Limit)]>>,
}

/// The consumer a static key names, and its plan.
#[derive(Debug)]
struct KeyOwner {
    consumer: Arc<str>,
    plan: Option<usize>,
}

#[derive(Debug, Clone, Copy)]
enum AnonymousPolicy {
    NoPlan,
    Plan(usize),
    Reject,
}

/// What the identifiers found in a request.
enum Credential {
    None,
    Consumer {
        consumer: Arc<str>,
        plan: Option<usize>,
        hidden: Option<CredentialSource>,
    },
}

// === impl Consumers ===

impl Consumers {
    /// Compiles a validated block (plan names it refers to are known to exist) for a store whose keys start
    /// with `key_prefix`.
    pub fn new(settings: &ConsumersSettings, key_prefix: &str, directory: Arc<Directory>) -> Self {
        let plan_index = |name: &str| settings.plans.iter().position(|plan| plan.name == name);
        let static_keys = settings
            .keys
            .iter()
            .map(|key| {
                let owner = KeyOwner {
                    consumer: Arc::from(key.consumer.as_str()),
                    plan: key.plan.as_deref().and_then(plan_index),
                };
                (key.digest, owner)
            })
            .collect();
        let anonymous = match &settings.anonymous {
            Anonymous::NoPlan => AnonymousPolicy::NoPlan,
            Anonymous::Plan(name) => {
                plan_index(name).map_or(AnonymousPolicy::NoPlan, AnonymousPolicy::Plan)
            }
            Anonymous::Reject => AnonymousPolicy::Reject,
        };
        let identifiers: Vec<Identifier> = settings
            .identify
            .iter()
            .map(|identifier| match identifier {
                IdentifierSettings::ApiKey {
                    source,
                    hide_credentials,
                } => Identifier::ApiKey {
                    source: source.clone(),
                    hidden: hide_credentials.then(|| source.clone()),
                },
                #[cfg(feature = "jwt")]
                IdentifierSettings::Jwt {
                    settings,
                    hide_credentials,
                } => Identifier::Jwt {
                    header: settings.header.clone(),
                    hidden: hide_credentials
                        .then(|| CredentialSource::Header(settings.header.clone())),
                    verifier: JwtVerifier::new((**settings).clone())
                        .map_err(|error| {
                            tracing::error!(
                                %error,
                                "jwt identifier: every token is refused until the keys load"
                            );
                        })
                        .ok(),
                },
                IdentifierSettings::Mtls {
                    consumer_prefix,
                    plan,
                } => Identifier::Mtls {
                    prefix: consumer_prefix.clone(),
                    plan: plan.as_deref().and_then(plan_index),
                },
            })
            .collect();
        let challenges = identifiers
            .iter()
            .map(|identifier| identifier.scheme())
            .fold(Vec::<&str>::new(), |mut schemes, scheme| {
                if !schemes.contains(&scheme) {
                    schemes.push(scheme);
                }
                schemes
            })
            .iter()
            .map(|scheme| format!("{scheme} realm=\"tollgate\""))
            .collect::<Vec<_>>()
            .join(", ");
        Self {
            identifiers,
            static_keys,
            anonymous,
            forward: settings.forward.clone(),
            plans: settings.plans.clone(),
            key_prefix: key_prefix.to_owned(),
            directory,
            compiled: parking_lot::Mutex::default(),
            // Validated with the config (a positive limit and period).
            failures: settings
                .failed_credentials
                .and_then(|failures| FailureLimit::new(failures, key_prefix).ok()),
            challenges: HeaderValue::from_str(&challenges)
                .unwrap_or_else(|_| HeaderValue::from_static("ApiKey realm=\"tollgate\"")),
        }
    }

    /// The plans, in file order; [`Caller::plan`] indexes them.
    pub fn plans(&self) -> &[Plan] {
        &self.plans
    }

    /// The plan named `name`, by index.
    pub fn plan_index(&self, name: &str) -> Option<usize> {
        self.plans.iter().position(|plan| plan.name == name)
    }

    /// The store key of the plan limit named `limit` for the key value `value` (the consumer id of a limit keyed
    /// by `consumer`): `<prefix>consumer:<limit>:{<value>}`, shared by every plan that has a limit of that name.
    pub fn plan_limit_key(&self, limit: &str, value: &str) -> String {
        crate::key::store_key(&self.key_prefix, PLAN_KEY_SCOPE, limit, value)
    }

    /// The headers that tell the upstream who called.
    pub fn forward(&self) -> &ForwardHeaders {
        &self.forward
    }

    /// `WWW-Authenticate` of a 401: the challenges of the credentials accepted.
    pub fn challenges(&self) -> &HeaderValue {
        &self.challenges
    }

    /// Identifies the caller of the request `facts` describes, on a route in `mode` (not `Off`).
    pub fn identify(
        &self,
        facts: &RequestFacts<'_>,
        mode: ConsumerMode,
    ) -> Result<Caller, CallerRefusal> {
        match self.credential(facts)? {
            Credential::Consumer {
                consumer,
                plan,
                hidden,
            } => self
                .consumer(consumer, plan)
                .map(|caller| Caller { hidden, ..caller }),
            Credential::None => match (mode, self.anonymous) {
                (ConsumerMode::Required, _) | (_, AnonymousPolicy::Reject) => {
                    Err(CallerRefusal::Missing)
                }
                (_, policy) => Ok(Caller {
                    consumer: None,
                    plan: match policy {
                        AnonymousPolicy::Plan(plan) => Some(plan),
                        _ => None,
                    },
                    overrides: None,
                    hidden: None,
                }),
            },
        }
    }

    /// [`identify`](Self::identify), after looking up in Redis what the directory does not hold (at start, while
    /// it reads a large directory whole; with `consumers.cache`, what is not cached): the presented API key, then
    /// the runtime record of the consumer found. Costs nothing where the directory holds every record.
    pub async fn identify_reading_through(
        &self,
        facts: &RequestFacts<'_>,
        mode: ConsumerMode,
    ) -> Result<Caller, CallerRefusal> {
        if self.directory.holds_all() {
            return self.identify(facts, mode);
        }
        let unavailable = |error| {
            tracing::debug!(%error, "consumer directory lookup failed");
            CallerRefusal::DirectoryUnavailable
        };
        if let Some(digest) = self.presented_key(facts) {
            if self.directory.key_owner(&digest) == Known::Unread {
                self.directory
                    .read_through_key(&digest)
                    .await
                    .map_err(unavailable)?;
            }
        }
        let caller = self.identify(facts, mode)?;
        let Some(id) = caller.consumer.as_deref() else {
            return Ok(caller);
        };
        if !matches!(self.directory.record(id), Known::Unread) {
            return Ok(caller);
        }
        self.directory
            .read_through_consumer(id)
            .await
            .map_err(unavailable)?;
        self.identify(facts, mode)
    }

    /// The digest of the API key the request presents to the first identifier that reads one, if any.
    fn presented_key(&self, facts: &RequestFacts<'_>) -> Option<[u8; 32]> {
        self.identifiers
            .iter()
            .find_map(|identifier| match identifier {
                Identifier::ApiKey { source, .. } => match api_key::presented(source, facts) {
                    Presented::One(key) => Some(api_key::digest(&key)),
                    _ => None,
                },
                #[cfg(feature = "jwt")]
                Identifier::Jwt { .. } => None,
                Identifier::Mtls { .. } => None,
            })
    }

    /// The first credential present, verified: later identifiers are not tried once one is present.
    fn credential(&self, facts: &RequestFacts<'_>) -> Result<Credential, CallerRefusal> {
        for identifier in &self.identifiers {
            match identifier {
                Identifier::ApiKey { source, hidden } => match api_key::presented(source, facts) {
                    Presented::Absent => continue,
                    Presented::Ambiguous => return Err(CallerRefusal::Ambiguous),
                    Presented::One(key) => {
                        return self
                            .api_key(&key)
                            .map(|credential| credential.hiding(hidden))
                    }
                },
                #[cfg(feature = "jwt")]
                Identifier::Jwt {
                    header,
                    verifier,
                    hidden,
                } => {
                    let mut values = facts.headers.get_all(header).iter();
                    let value = match (values.next(), values.next()) {
                        (None, _) => continue,
                        // As an API key sent twice: which token a proxy in front read is a guess.
                        (Some(_), Some(_)) => return Err(CallerRefusal::Ambiguous),
                        (Some(value), None) => value,
                    };
                    // `Basic ...` and the like are no bearer token: no credential for this identifier.
                    if other_scheme(value) {
                        continue;
                    }
                    let Some(verifier) = verifier else {
                        return Err(invalid_token(TokenRejection::KeysUnavailable));
                    };
                    // The header is read once, here: the verifier parses the value it was given.
                    return match verifier.token_in(value) {
                        Err(rejection) => Err(invalid_token(rejection)),
                        Ok(token) => match verifier.verify(token) {
                            Ok(token) => Ok(Credential::Consumer {
                                plan: token.plan.as_deref().and_then(|p| self.plan_index(p)),
                                consumer: token.consumer,
                                hidden: hidden.clone(),
                            }),
                            Err(rejection) => Err(invalid_token(rejection)),
                        },
                    };
                }
                Identifier::Mtls { prefix, plan } => {
                    let Some(certificate) = facts.client_cert else {
                        continue;
                    };
                    return certificate_consumer(prefix, certificate.common_name()).map(
                        |consumer| Credential::Consumer {
                            consumer,
                            plan: *plan,
                            hidden: None,
                        },
                    );
                }
            }
        }
        Ok(Credential::None)
    }

    /// The caller a verified credential names, with `named` the plan its key or token gives: the runtime
    /// settings decide first (blocked: 403; their plan ahead of the credential's), then the credential, then the
    /// anonymous plan.
    fn consumer(&self, consumer: Arc<str>, named: Option<usize>) -> Result<Caller, CallerRefusal> {
        let mut plan = named.or(self.anonymous_plan());
        let mut overrides = None;
        if let Known::Is(record) = self.directory.record(&consumer) {
            if record.blocked() {
                return Err(CallerRefusal::Blocked);
            }
            if let Some(runtime) = record.plan().and_then(|name| self.plan_index(name)) {
                plan = Some(runtime);
            }
            if let (true, Some(plan)) = (record.has_overrides(), plan) {
                overrides = self.compiled_overrides(&consumer, &record, plan);
            }
        }
        Ok(Caller {
            consumer: Some(consumer),
            plan,
            overrides,
            hidden: None,
        })
    }

    /// [`overrides`](Self::overrides) of `record` for `plan`, compiled at the first request after the record or
    /// the plan changed. Records are compared by identity: the directory shares unchanged ones between snapshots.
    fn compiled_overrides(
        &self,
        consumer: &Arc<str>,
        record: &StoredRecord,
        plan: usize,
    ) -> Option<Arc<[(usize, Limit)]>> {
        let mut compiled = self.compiled.lock();
        if let Some(entry) = compiled.get(consumer) {
            if entry.record.same(record) && entry.plan == plan {
                return entry.limits.clone();
            }
        }
        let limits = self.overrides(plan, &record.overrides());
        let entry = CompiledOverrides {
            record: record.clone(),
            plan,
            limits: limits.clone(),
        };
        // Bounded as the consumers held are (a directory that caches evicts them; this map would not): a full map
        // starts again, each consumer's overrides compiled anew at its next request.
        if compiled.len() >= COMPILED_BOUND {
            compiled.clear();
        }
        compiled.insert(Arc::clone(consumer), entry);
        limits
    }

    /// The limits of plan `plan` that `changes` replace, by index in the plan; names that are not limits of the
    /// plan (it changed since) are passed over.
    fn overrides(
        &self,
        plan: usize,
        changes: &BTreeMap<String, LimitOverride>,
    ) -> Option<Arc<[(usize, Limit)]>> {
        let plan = self.plans.get(plan)?;
        let replaced: Vec<(usize, Limit)> = plan
            .limits
            .iter()
            .enumerate()
            .filter_map(|(index, settings)| {
                let change = changes.get(settings.limit.name())?;
                let limit = overridden(&settings.limit, change).ok()?;
                let name = format!("{}.{}", plan.name, settings.limit.name());
                Some((index, limit.with_name(name)))
            })
            .collect();
        (!replaced.is_empty()).then(|| replaced.into())
    }

    /// Whether `record` may be set: its plan and the limits its overrides name exist, and each override fits its
    /// limit's algorithm. The message says what is wrong (the admin API answers it with 400).
    pub fn check_record(&self, record: &ConsumerRecord) -> Result<(), String> {
        if let Some(plan) = record.plan.as_deref() {
            if self.plan_index(plan).is_none() {
                let known: Vec<&str> = self.plans.iter().map(|p| p.name.as_str()).collect();
                return Err(format!(
                    "unknown plan {plan:?} (plans: {})",
                    known.join(", ")
                ));
            }
        }
        for (name, change) in &record.overrides {
            // Same-named limits of all plans share one algorithm (checked at load): any of them tells.
            let scope: Vec<&Plan> = match record.plan.as_deref().and_then(|p| self.plan_index(p)) {
                Some(plan) => vec![&self.plans[plan]],
                None => self.plans.iter().collect(),
            };
            let Some(base) = scope
                .iter()
                .flat_map(|plan| plan.limits.iter())
                .find(|settings| settings.limit.name() == name)
            else {
                return Err(format!("overrides: no plan limit named {name:?}"));
            };
            overridden(&base.limit, change).map_err(|e| format!("overrides.{name}: {e}"))?;
        }
        Ok(())
    }

    /// The plan a static key of `consumer` names, if any (the first such key's).
    pub fn configured_plan(&self, consumer: &str) -> Option<&str> {
        let plan = self
            .static_keys
            .values()
            .find(|owner| &*owner.consumer == consumer)?
            .plan?;
        self.plans.get(plan).map(|plan| plan.name.as_str())
    }

    /// The limit on failed credentials per client address, if the config sets one.
    pub fn failures(&self) -> Option<&FailureLimit> {
        self.failures.as_ref()
    }

    /// Whether the request carries a credential any identifier reads (verified or not).
    pub fn presents_credential(&self, facts: &RequestFacts<'_>) -> bool {
        self.identifiers.iter().any(|identifier| match identifier {
            Identifier::ApiKey { source, .. } => {
                api_key::presented(source, facts) != Presented::Absent
            }
            #[cfg(feature = "jwt")]
            Identifier::Jwt { header, .. } => facts.headers.contains_key(header),
            Identifier::Mtls { .. } => facts.client_cert.is_some(),
        })
    }

    /// The runtime directory.
    pub fn directory(&self) -> &Arc<Directory> {
        &self.directory
    }

    fn api_key(&self, key: &[u8]) -> Result<Credential, CallerRefusal> {
        let digest = api_key::digest(key);
        // Keys issued at runtime first: revoking one takes effect, whatever the config lists.
        if let Known::Is(consumer) = self.directory.key_owner(&digest) {
            return Ok(Credential::Consumer {
                consumer,
                plan: None,
                hidden: None,
            });
        }
        match self.static_keys.get(&digest) {
            Some(owner) => Ok(Credential::Consumer {
                consumer: Arc::clone(&owner.consumer),
                plan: owner.plan,
                hidden: None,
            }),
            None => Err(CallerRefusal::Invalid {
                scheme: "ApiKey",
                reason: "unknown_key",
            }),
        }
    }

    /// The plan of identified consumers that name none (the last step of the plan's precedence).
    fn anonymous_plan(&self) -> Option<usize> {
        match self.anonymous {
            AnonymousPolicy::Plan(plan) => Some(plan),
            AnonymousPolicy::NoPlan | AnonymousPolicy::Reject => None,
        }
    }
}

/// The consumer a verified client certificate names: `prefix` and its common name. A certificate without one, or
/// whose name cannot stand in a consumer id (the admin API's characters), is refused (401): keying it by anything
/// else would be a guess at who it is.
fn certificate_consumer(
    prefix: &str,
    common_name: Option<&str>,
) -> Result<Arc<str>, CallerRefusal> {
    let refused = CallerRefusal::Invalid {
        scheme: CLIENT_CERTIFICATE,
        reason: "unusable_certificate_name",
    };
    let name = common_name.ok_or_else(|| refused.clone())?;
    let mut id = String::with_capacity(prefix.len() + name.len());
    id.push_str(prefix);
    id.push_str(name);
    match consumer_id(&id) {
        Ok(()) => Ok(Arc::from(id)),
        Err(_) => Err(refused),
    }
}

/// The `WWW-Authenticate` scheme of the `mtls` identifier: HTTP has none for a TLS client certificate, so tollgate
/// names it, as it names `ApiKey`.
const CLIENT_CERTIFICATE: &str = "ClientCertificate";

#[cfg(feature = "jwt")]
/// The refusal of a bearer token.
fn invalid_token(rejection: TokenRejection) -> CallerRefusal {
    CallerRefusal::Invalid {
        scheme: "Bearer",
        reason: rejection.reason(),
    }
}

// === impl Credential ===

impl Credential {
    /// This credential, hidden from the upstream as `hidden` says.
    fn hiding(self, hidden: &Option<CredentialSource>) -> Self {
        match self {
            Credential::Consumer { consumer, plan, .. } => Credential::Consumer {
                consumer,
                plan,
                hidden: hidden.clone(),
            },
            Credential::None => Credential::None,
        }
    }
}

// === impl Identifier ===

impl Identifier {
    /// The `WWW-Authenticate` scheme a client answers with.
    fn scheme(&self) -> &'static str {
        match self {
            Identifier::ApiKey { .. } => "ApiKey",
            #[cfg(feature = "jwt")]
            Identifier::Jwt { .. } => "Bearer",
            Identifier::Mtls { .. } => CLIENT_CERTIFICATE,
        }
    }
}
