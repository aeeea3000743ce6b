//! The store settings a limiter is built from (the config's `store:`), and building it.

use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "redis")]
use super::store::RedisStore;
use super::store::{StoreError, WhenFull};
use super::{Backend, Clock, OnError, RateLimiter, SystemClock};

/// Which store holds limit state. `Redis` is a setting like any other, whatever the build: a limiter built from it
/// without the crate's `redis` feature is refused ([`StoreError::NoRedis`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// Redis (standalone, Sentinel or Cluster, by URL scheme).
    Redis,
    /// In-process.
    Memory,
}

/// Where limit state lives and what happens when it cannot be reached (the config's `store:`).
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// Default `memory`.
    pub backend: BackendKind,
    /// Default `redis://127.0.0.1:6379`.
    pub url: String,
    /// Budget for one limiter call, default 25ms.
    pub timeout: Duration,
    /// Default `local`.
    pub on_error: OnError,
    /// Default `tollgate:`.
    pub key_prefix: String,
    /// Bound of the in-process store, default 1,000,000.
    pub max_keys: usize,
    /// A new key's request when the in-process store is full of keys it may not displace, default `deny`.
    pub when_full: WhenFull,
    /// Redis connections, default 4.
    pub pool_size: usize,
    /// Keys one limit may hold in the in-process store, default a quarter of `max_keys`: past it, that limit's
    /// new keys are decided by `when_full` and the other limits go on unaffected.
    pub max_keys_per_limit: usize,
}

// === impl StoreSettings ===

impl StoreSettings {
    /// Redis at `url` (`redis://`, `rediss://`, `redis-cluster://`, `redis-sentinel://`), every other setting at
    /// its default: the in-process store answers while Redis fails (`on_error: local`).
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), tollgate_limiter::store::StoreError> {
    /// use tollgate_limiter::{RateLimiter, StoreSettings};
    ///
    /// let limiter = RateLimiter::from_settings(&StoreSettings::redis("redis://127.0.0.1:6379"))?;
    /// # Ok(()) }
    /// ```
    pub fn redis(url: impl Into<String>) -> Self {
        Self {
            backend: BackendKind::Redis,
            url: url.into(),
            ..Self::default()
        }
    }
}

impl Default for StoreSettings {
    /// The in-process store, with the config file's defaults.
    fn default() -> Self {
        Self {
            backend: BackendKind::Memory,
            url: "redis://127.0.0.1:6379".to_owned(),
            timeout: Duration::from_millis(25),
            on_error: OnError::Local,
            key_prefix: "tollgate:".to_owned(),
            max_keys: 1_000_000,
            when_full: WhenFull::Deny,
            pool_size: 4,
            max_keys_per_limit: 250_000,
        }
    }
}

// === impl RateLimiter ===

impl RateLimiter {
    /// The limiter `store` describes, on the system clock. With Redis, connecting happens in the background (and
    /// goes on until Redis answers), so this must be called within a tokio runtime; it fails only for settings
    /// that cannot name a Redis (a malformed URL), or that name one in a build without the `redis` feature.
    pub fn from_settings(store: &StoreSettings) -> Result<Self, StoreError> {
        Self::from_settings_on(store, Arc::new(SystemClock))
    }

    /// [`from_settings`](Self::from_settings) with the in-process store on `clock` (a simulation's, a test's);
    /// Redis keeps its own clock.
    pub fn from_settings_on(
        store: &StoreSettings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, StoreError> {
        let backend = match store.backend {
            BackendKind::Memory => Backend::Memory,
            #[cfg(feature = "redis")]
            BackendKind::Redis => Backend::Redis(
                RedisStore::connect(&store.url, store.pool_size, store.timeout)?
                    .with_key_prefix(&store.key_prefix),
            ),
            #[cfg(not(feature = "redis"))]
            BackendKind::Redis => return Err(StoreError::NoRedis),
        };
        let limiter = Self::new(
            backend,
            store.timeout,
            store.on_error,
            store.max_keys,
            clock,
        );
        limiter.local().set_when_full(store.when_full);
        limiter
            .local()
            .set_max_keys_per_limit(store.max_keys_per_limit);
        Ok(limiter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "redis"))]
    #[test]
    fn settings_that_name_redis_are_refused_without_the_redis_store() {
        let refused = RateLimiter::from_settings(&StoreSettings::redis("redis://127.0.0.1:6379"));
        assert!(matches!(refused, Err(StoreError::NoRedis)), "{refused:?}");
    }

    #[test]
    fn the_default_settings_build_the_memory_store() {
        let limiter = RateLimiter::from_settings(&StoreSettings::default()).expect("memory");
        assert_eq!(limiter.backend().name(), "memory");
    }
}
