//! Building a [`RateLimitLayer`]: the limiter, the scope, the limits, from code or from a gateway config route.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use ipnet::IpNet;

use super::rate_limit::RateLimitLayer;
use crate::admission::LimitSettings;
use crate::admission::{LimitSet, Policy};
use crate::config::Config;
use crate::consumers::directory::Directory;
use crate::consumers::{ConsumerMode, Consumers, ConsumersSettings};
use crate::key::{
    ClientIpHeader, ClientIpResolver, Counts, KeyPart, KeyPartError, KeySpec, MissingKey,
};
use crate::limiter::{Algorithm, Backend, Limit, LimitError, OnError, RateLimiter, SystemClock};

/// The bound of the in-process store made by [`Builder::memory_store`], the gateway's `store.max_keys` default.
pub const DEFAULT_MAX_KEYS: usize = 1_000_000;

/// The key prefix when none is given: the gateway's `store.key_prefix` default.
const DEFAULT_KEY_PREFIX: &str = "tollgate:";

/// Configures a [`RateLimitLayer`]; made by [`RateLimitLayer::builder`] or [`RateLimitLayer::from_route`].
///
/// A limiter, a scope and at least one limit are required. Mistakes in [`Builder::limit_by`] are kept and
/// reported by [`Builder::build`], so that the chain needs a single `?`.
#[derive(Debug, Clone)]
pub struct Builder {
    limiter: Option<Arc<RateLimiter>>,
    scope: Option<String>,
    key_prefix: String,
    limits: Vec<LimitSettings>,
    deny_status: StatusCode,
    headers: bool,
    trusted_proxies: Vec<IpNet>,
    /// The one field believed from `trusted_proxies`.
    client_ip_header: ClientIpHeader,
    ipv6_prefix: u8,
    /// Client networks exempt from the limits.
    allow: Vec<IpNet>,
    /// Consumers and plans, and whether the layer identifies callers.
    consumers: Option<(ConsumersSettings, ConsumerMode)>,
    /// The consumers' runtime settings; in this process when not given.
    directory: Option<Arc<Directory>>,
    /// The first mistake of a [`Builder::limit_by`] call.
    error: Option<LayerError>,
}

/// Why a [`RateLimitLayer`] could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayerError {
    /// Neither [`Builder::limiter`] nor [`Builder::memory_store`] was called.
    #[error("no limiter: call .limiter(...) or .memory_store()")]
    NoLimiter,
    /// The scope, or a limit, has an empty name.
    #[error("the {0} needs a name")]
    MissingName(&'static str),
    /// No limit was added: the layer would admit everything, which is never what was meant.
    #[error("scope {scope:?} has no limits")]
    NoLimits {
        /// The scope.
        scope: String,
    },
    /// Two limits share a name, and so would share store keys.
    #[error("scope {scope:?} has two limits named {limit:?}")]
    DuplicateLimit {
        /// The scope.
        scope: String,
        /// The repeated name.
        limit: String,
    },
    /// A key part of [`Builder::limit_by`] did not parse.
    #[error("limit {limit:?}: {source}")]
    Key {
        /// The limit's name.
        limit: String,
        /// What was wrong with the part.
        source: KeyPartError,
    },
    /// The algorithm's parameters of [`Builder::limit_by`] were refused.
    #[error("limit {limit:?}: {source}")]
    Limit {
        /// The limit's name.
        limit: String,
        /// What was wrong with it.
        source: LimitError,
    },
    /// [`RateLimitLayer::from_route`] was given a route the config does not have.
    #[error("the config has no route named {0:?}")]
    UnknownRoute(String),
    /// [`RateLimitLayer::from_route`] was given a route with `usage:` (an LLM API's): the layer cannot read the
    /// tokens a request may spend from its body, nor those its answer reports, out of a generic service's bodies.
    #[error(
        "route {route:?} has usage:, which the layer cannot read (token limits need the gateway)"
    )]
    ReadsUsage {
        /// The route.
        route: String,
    },
    /// A limit counts tokens (`counts: input_tokens | output_tokens | total_tokens`), which only a gateway route
    /// with `usage:` can reserve and settle.
    #[error("limit {limit:?} counts tokens, which the layer cannot read (token limits need the gateway)")]
    CountsTokens {
        /// The limit's name.
        limit: String,
    },
}

/// An in-process limiter holding at most about `max_keys` keys, to share between several layers (each layer made
/// with [`Builder::memory_store`] has a store of its own).
///
/// Its counters live in this process only: several instances of a service each admit the full limit. Use a Redis
/// limiter ([`RateLimiter::from_settings`]) to share limits between instances.
pub fn memory_limiter(max_keys: usize) -> Arc<RateLimiter> {
    Arc::new(RateLimiter::new(
        Backend::Memory,
        // Only a Redis backend has a time budget and a failure policy; these are inert here.
        Duration::from_millis(25),
        OnError::Local,
        max_keys,
        Arc::new(SystemClock),
    ))
}

// === impl Builder ===

impl Builder {
    pub(super) fn new() -> Self {
        Self {
            limiter: None,
            scope: None,
            key_prefix: DEFAULT_KEY_PREFIX.to_owned(),
            limits: Vec::new(),
            deny_status: StatusCode::TOO_MANY_REQUESTS,
            headers: true,
            trusted_proxies: Vec::new(),
            client_ip_header: ClientIpHeader::default(),
            ipv6_prefix: 64,
            allow: Vec::new(),
            consumers: None,
            directory: None,
            error: None,
        }
    }

    /// A builder holding what `route` of `config` says: its name as the scope, its limits, `deny_status`,
    /// `headers` and `allow`, and the config's `store.key_prefix` and `client_ip` (`trusted_proxies`, `header`,
    /// `ipv6_prefix`).
    pub(super) fn from_route(config: &Config, route: &str) -> Result<Self, LayerError> {
        let settings = config
            .routes
            .iter()
            .find(|r| r.name == route)
            .ok_or_else(|| LayerError::UnknownRoute(route.to_owned()))?;
        // Refused rather than served without its token limits, which would then limit nothing.
        if settings.usage.is_some() {
            return Err(LayerError::ReadsUsage {
                route: route.to_owned(),
            });
        }
        Ok(Self {
            scope: Some(settings.name.clone()),
            key_prefix: config.store.key_prefix.clone(),
            limits: settings.limits.clone(),
            deny_status: settings.deny_status,
            headers: settings.headers,
            trusted_proxies: config.client_ip.trusted_proxies.clone(),
            client_ip_header: config.client_ip.header,
            ipv6_prefix: config.client_ip.ipv6_prefix,
            allow: settings.allow.clone(),
            consumers: config
                .consumers
                .clone()
                .map(|consumers| (consumers, settings.consumers)),
            ..Self::new()
        })
    }

    /// The limiter that decides: an in-process one ([`memory_limiter`]) or Redis
    /// ([`RateLimiter::from_settings`]). Layers sharing one limiter share its store and connections.
    pub fn limiter(mut self, limiter: Arc<RateLimiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// Decides with an in-process store of its own, bounded to [`DEFAULT_MAX_KEYS`] keys.
    pub fn memory_store(self) -> Self {
        self.limiter(memory_limiter(DEFAULT_MAX_KEYS))
    }

    /// The scope's name (required): it is part of every store key, it is the `route` of the 429 body and the value
    /// of the `route` key part. Layers with the same scope and limit names share counters.
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into());
        self
    }

    /// The prefix of every store key; default `tollgate:`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// Adds a limit. All the limits are checked together: a request is admitted only if every limit admits it,
    /// and a denied request consumes from none.
    pub fn limit(mut self, limit: LimitSettings) -> Self {
        self.limits.push(limit);
        self
    }

    /// Adds a limit named `name`, costing 1 per request, keyed by `key`: parts as the config file writes them
    /// (`ip`, `route`, `method`, `path`, `host`, `header:NAME`, `query:NAME`). A request lacking a part is keyed
    /// by its client address (`missing: ip`); for other costs or `missing: skip`, use [`Builder::limit`].
    ///
    /// An invalid part or algorithm is reported by [`Builder::build`].
    pub fn limit_by<I>(mut self, name: &str, key: I, algorithm: Algorithm) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        match limit_settings(name, key, algorithm) {
            Ok(settings) => self.limits.push(settings),
            Err(error) => {
                self.error.get_or_insert(error);
            }
        }
        self
    }

    /// The status of denied requests; default `429 Too Many Requests`.
    pub fn deny_status(mut self, status: StatusCode) -> Self {
        self.deny_status = status;
        self
    }

    /// Whether admitted responses carry the rate-limit headers (`X-RateLimit-*`, `RateLimit-Policy`,
    /// `RateLimit`); default true. Denied responses always carry them.
    pub fn headers(mut self, enabled: bool) -> Self {
        self.headers = enabled;
        self
    }

    /// Peers (load balancers, proxies) whose client-address field ([`Builder::client_ip_header`], `X-Forwarded-For`
    /// by default) is believed when finding the client address; default none. Networks or plain addresses, as the config's `client_ip.trusted_proxies` takes them:
    /// `["10.0.0.0/8".parse::<IpNet>()?]` or `[IpAddr::from([10, 0, 0, 7])]` (a /32).
    pub fn trusted_proxies<P: Into<IpNet>>(mut self, proxies: impl IntoIterator<Item = P>) -> Self {
        self.trusted_proxies = proxies.into_iter().map(Into::into).collect();
        self
    }

    /// The one field trusted proxies write the client address in, as the config's `client_ip.header`: default
    /// [`ClientIpHeader::XForwardedFor`], or `Forwarded` (its `for=`) or `X-Real-IP`. Only it is believed, and only
    /// from [`Builder::trusted_proxies`]: a proxy that writes one field passes the others through from the client
    /// untouched, so believing them would let a client name its own address.
    pub fn client_ip_header(mut self, header: ClientIpHeader) -> Self {
        self.client_ip_header = header;
        self
    }

    /// Client networks (CIDRs) exempt from the limits, as a route's `allow:`: their requests are passed on
    /// without asking the limiter, counted against nobody, and get no rate-limit fields.
    pub fn allow<N: Into<IpNet>>(mut self, networks: impl IntoIterator<Item = N>) -> Self {
        self.allow = networks.into_iter().map(Into::into).collect();
        self
    }

    /// Keys IPv6 clients by their network of `bits` bits (default 64, as `client_ip.ipv6_prefix`; 128 keys each
    /// address): one subscriber is given a whole /64, and must not get 2^64 keys.
    pub fn ipv6_prefix(mut self, bits: u8) -> Self {
        self.ipv6_prefix = bits;
        self
    }

    /// Identifies callers as `consumers` says (a config's `consumers:` block, docs/configuration.md, "Consumers and plans") and applies their plans'
    /// limits with the layer's own, in one limiter call; `mode` as a route's `consumers:`. Copies of the forwarded
    /// consumer headers sent by clients are dropped before the inner service sees the request.
    pub fn consumers(mut self, consumers: ConsumersSettings, mode: ConsumerMode) -> Self {
        self.consumers = Some((consumers, mode));
        self
    }

    /// Reads the consumers' runtime settings (plans, overrides, blocks, keys issued by the admin API) from
    /// `directory`, e.g. [`Directory::from_settings`] on the gateway's store to share them with it; by default
    /// the layer has a directory of its own, in this process.
    pub fn directory(mut self, directory: Arc<Directory>) -> Self {
        self.directory = Some(directory);
        self
    }

    /// The layer, or the first mistake of the configuration.
    pub fn build(self) -> Result<RateLimitLayer, LayerError> {
        if let Some(error) = self.error {
            return Err(error);
        }
        let limiter = self.limiter.ok_or(LayerError::NoLimiter)?;
        let scope = self
            .scope
            .filter(|s| !s.is_empty())
            .ok_or(LayerError::MissingName("scope"))?;
        let has_plans = self.consumers.as_ref().is_some_and(|(settings, mode)| {
            *mode != ConsumerMode::Off && !settings.plans.is_empty()
        });
        if self.limits.is_empty() && !has_plans {
            return Err(LayerError::NoLimits { scope });
        }
        let mut own = self.limits;
        let mut consumers = self.consumers;
        if let Some((settings, _)) = consumers.as_mut() {
            // As a config file's limits and plans: one keyed by where the consumers' API keys are sent keys by
            // their digest, so that no key stands in a store key.
            crate::config::mark_credential_keys(own.iter_mut(), settings);
            crate::config::secret_api_keys(&mut [], Some(settings));
        }
        let mut names = HashSet::new();
        for settings in &own {
            let name = settings.limit.name();
            if name.is_empty() {
                return Err(LayerError::MissingName("limit"));
            }
            if !names.insert(name) {
                return Err(LayerError::DuplicateLimit {
                    scope,
                    limit: name.to_owned(),
                });
            }
            if matches!(settings.counts, Counts::Tokens(_)) {
                return Err(LayerError::CountsTokens {
                    limit: name.to_owned(),
                });
            }
        }
        let client_ip = ClientIpResolver::new(self.trusted_proxies)
            .with_header(self.client_ip_header)
            .with_ipv6_prefix(self.ipv6_prefix);
        let limits = LimitSet::new(&scope, &self.key_prefix, own, self.deny_status);
        let mut policy =
            Policy::new(limits, self.allow, self.headers).with_ipv6_prefix(client_ip.ipv6_prefix());
        if let Some((settings, mode)) = &consumers {
            let directory = self.directory.unwrap_or_else(Directory::in_memory);
            let consumers = Arc::new(Consumers::new(settings, &self.key_prefix, directory));
            policy = policy.with_consumers(*mode, consumers, &self.key_prefix);
        }
        Ok(RateLimitLayer::new(limiter, policy, client_ip))
    }
}

fn limit_settings<I>(name: &str, key: I, algorithm: Algorithm) -> Result<LimitSettings, LayerError>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    let parts = key
        .into_iter()
        .map(|part| KeyPart::parse(part.as_ref()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| LayerError::Key {
            limit: name.to_owned(),
            source,
        })?;
    let limit = Limit::new(name, algorithm, 1).map_err(|source| LayerError::Limit {
        limit: name.to_owned(),
        source,
    })?;
    Ok(LimitSettings {
        limit,
        // An empty list means `ip`, as an absent `key:` does in the config file.
        key: KeySpec::new(parts, MissingKey::Ip),
        counts: Counts::Requests,
    })
}
