//! The [`Layer`] itself: what every wrapped service shares (limiter, limits, client address resolution).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tower::Layer;

use super::builder::Builder;
use super::service::RateLimit;
use crate::admission::{LimitSet, Policy};
use crate::config::Config;
use crate::key::ClientIpResolver;
use crate::limiter::RateLimiter;

/// A tower [`Layer`] applying one scope's limits to the services it wraps; see the [module docs](super).
///
/// Cheap to clone: the services it makes share one [`RateLimiter`] and one set of limits, so the routes of an
/// axum router each get a copy of the service and still count against the same budget.
#[derive(Debug, Clone)]
pub struct RateLimitLayer {
    pub(super) shared: Arc<Shared>,
}

/// What every service of one layer reads.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) limiter: Arc<RateLimiter>,
    /// The limits, allowlist and fields: what admission decides requests by, as for a gateway route.
    pub(super) policy: Policy,
    pub(super) client_ip: ClientIpResolver,
    /// Set once a request came without `ConnectInfo`, so that the misconfiguration is logged once, not per
    /// request.
    pub(super) warned_no_peer: AtomicBool,
}

// === impl RateLimitLayer ===

impl RateLimitLayer {
    /// A builder for limits written in code.
    ///
    /// ```
    /// use tollgate::config::parse_rate;
    /// use tollgate::layer::RateLimitLayer;
    /// use tollgate::limiter::Algorithm;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let layer = RateLimitLayer::builder()
    ///     .memory_store()
    ///     .scope("search")
    ///     .limit_by("per-ip", ["ip"], Algorithm::Gcra { rate: parse_rate("30/1m")?, burst: 5 })
    ///     .build()?;
    /// assert_eq!(layer.scope(), "search");
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder() -> Builder {
        Builder::new()
    }

    /// A builder holding what the route named `route` of a gateway config says: its limits (named as in the file),
    /// `deny_status`, `headers` and `allow`, with the config's `store.key_prefix` and `client_ip.trusted_proxies`. The
    /// route's `match:` and its `upstream` / `respond` are not used: the layer limits whatever it wraps, and a file
    /// read with `config::load_for_layers` (or `parse_for_layers`; both with the `yaml` feature) needs neither.
    ///
    /// The store is still to be chosen, usually [`RateLimiter::from_settings`] with the config's `store:`,
    /// shared between the layers of one config:
    ///
    /// ```
    /// use std::path::Path;
    /// use std::sync::Arc;
    ///
    /// use tollgate::layer::RateLimitLayer;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let yaml = r#"
    /// store: { backend: memory }
    /// routes:
    ///   - name: api
    ///     limits:
    ///       - { name: per-ip, key: ip, algorithm: sliding_window, limit: 100, period: 1m }
    /// "#;
    /// let config = tollgate::config::parse_for_layers(yaml, Path::new("inline.yaml"))?;
    /// let limiter = Arc::new(tollgate::limiter::RateLimiter::from_settings(&config.store)?);
    /// let layer = RateLimitLayer::from_route(&config, "api")?.limiter(limiter).build()?;
    /// assert_eq!(layer.scope(), "api");
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_route(config: &Config, route: &str) -> Result<Builder, super::LayerError> {
        Builder::from_route(config, route)
    }

    pub(super) fn new(
        limiter: Arc<RateLimiter>,
        policy: Policy,
        client_ip: ClientIpResolver,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                limiter,
                policy,
                client_ip,
                warned_no_peer: AtomicBool::new(false),
            }),
        }
    }

    /// The same layer making `work` for every admitted request, to run when its answer ends (the seam's tests).
    #[cfg(test)]
    pub(crate) fn with_after_answer(
        &self,
        work: impl Fn() -> Box<dyn crate::admission::AfterAnswer> + Send + Sync + 'static,
    ) -> Self {
        let policy = self.shared.policy.clone().with_after_answer(work);
        Self::new(
            Arc::clone(&self.shared.limiter),
            policy,
            self.shared.client_ip.clone(),
        )
    }

    /// The scope's name.
    pub fn scope(&self) -> &str {
        self.shared.policy.limits().scope()
    }

    /// The limits, in the order they were added.
    pub fn limits(&self) -> &LimitSet {
        self.shared.policy.limits()
    }

    /// The limiter, e.g. to report [`RateLimiter::fallback_active`] in a readiness check.
    pub fn limiter(&self) -> &Arc<RateLimiter> {
        &self.shared.limiter
    }
}

impl<S> Layer<S> for RateLimitLayer {
    type Service = RateLimit<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit::new(inner, self)
    }
}
