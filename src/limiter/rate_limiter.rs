//! The limiter a gateway asks: the configured store, its time budget, and what to do when Redis fails.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;

use super::store::{LimitCheck, MemoryStore, RedisStore, StoreError};
use super::{Clock, Outcome};

/// What to do with a request when Redis fails or exceeds its time budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Admit the request unlimited.
    Allow,
    /// Refuse it with 503.
    Deny,
    /// Decide with the in-process store.
    Local,
}

impl std::fmt::Display for OnError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
        })
    }
}

/// The store behind a limiter.
#[derive(Debug)]
pub enum Backend {
    /// In-process only.
    Memory,
    /// Redis, shared by every instance.
    Redis(RedisStore),
}

/// Decides requests against the configured store, with a time budget and a fallback policy.
#[derive(Debug)]
pub struct RateLimiter {
    backend: Backend,
    local: MemoryStore,
    timeout: Duration,
    on_error: OnError,
    fallback_active: AtomicBool,
}

/// The limiter could not decide and the policy is to refuse.
#[derive(Debug, Error)]
#[error("rate limit store unavailable: {0}")]
pub struct Unavailable(#[source] pub StoreError);

// === impl RateLimiter ===

impl RateLimiter {
    /// A limiter over `backend`; `max_keys` bounds the in-process store (the store itself for `Backend::Memory`,
    /// the fallback otherwise).
    pub fn new(
        backend: Backend,
        timeout: Duration,
        on_error: OnError,
        max_keys: usize,
        clock: Arc<dyn Clock>,
    ) -> Self {
        Self {
            backend,
            local: MemoryStore::new(max_keys, clock),
            timeout,
            on_error,
            fallback_active: AtomicBool::new(false),
        }
    }

    /// Checks every limit of one request; consumes from all of them only if all admit.
    ///
    /// Never waits longer than the store timeout for Redis. When Redis fails, answers per the `on_error` policy:
    /// `Ok` with an empty outcome for `allow`, `Err(Unavailable)` for `deny`, the in-process decision for `local`.
    pub async fn check(&self, checks: &[LimitCheck<'_>]) -> Result<Outcome, Unavailable> {
        if checks.is_empty() {
            return Ok(Outcome {
                allowed: true,
                decisions: Vec::new(),
            });
        }
        let redis = match &self.backend {
            Backend::Memory => return Ok(self.local.check(checks)),
            Backend::Redis(redis) => redis,
        };
        let error = match tokio::time::timeout(self.timeout, redis.check(checks, None)).await {
            Ok(Ok(outcome)) => {
                if self.fallback_active.swap(false, Ordering::Relaxed) {
                    tracing::info!("redis answers again: limiting is shared again");
                }
                return Ok(outcome);
            }
            Ok(Err(error)) => error,
            Err(_) => StoreError::Timeout(self.timeout),
        };
        if !self.fallback_active.swap(true, Ordering::Relaxed) {
            tracing::warn!(%error, on_error = %self.on_error, "redis failed: falling back");
        }
        match self.on_error {
            OnError::Allow => Ok(Outcome {
                allowed: true,
                decisions: Vec::new(),
            }),
            OnError::Deny => Err(Unavailable(error)),
            OnError::Local => Ok(self.local.check(checks)),
        }
    }

    /// True while the last Redis call failed and requests are answered by the `on_error` policy.
    pub fn fallback_active(&self) -> bool {
        self.fallback_active.load(Ordering::Relaxed)
    }

    /// The configured backend.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The in-process store (the store itself for `Backend::Memory`, else the fallback).
    pub fn local(&self) -> &MemoryStore {
        &self.local
    }
}
