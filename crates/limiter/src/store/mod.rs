//! Where limit state lives: in Redis, shared by every gateway instance, or in this process.

#[cfg(feature = "redis")]
mod batcher;
mod memory;
#[cfg(feature = "redis")]
mod redis;
#[cfg(feature = "redis")]
mod redis_clock;
#[cfg(feature = "redis")]
mod script;
#[cfg(feature = "redis")]
mod sentinel;

use thiserror::Error;

pub use self::memory::{MemoryStore, WhenFull};
/// Keys hashed once, as the in-process store holds them, for the limiter's other per-key maps.
#[cfg(feature = "redis")]
pub(crate) mod memory_keys {
    pub(crate) use super::memory::keys::{KeyRef, StoredHash, StoredKey};
    pub(crate) use super::memory::SHARDS;
}
#[cfg(feature = "redis")]
pub use self::redis::{Announcement, RedisStore, RedisTopology, ResetNotice};
// For the other users of Redis (the consumer directory): one way to build clients and to word their failures.
#[cfg(feature = "redis")]
pub use self::redis::{client_builder, plain_words};
use super::Limit;

/// Limits per request that per-request lists hold inline (routes with more spill to the heap).
pub const INLINE_LIMITS: usize = 4;

/// One limit to check for one request: the limit and the store key of the client it applies to.
#[derive(Debug, Clone, Copy)]
pub struct LimitCheck<'a> {
    /// The full store key, `<prefix><route>:<limit>:{<value>}`.
    pub key: &'a str,
    /// The limit to apply.
    pub limit: &'a Limit,
}

/// Why a store could not decide. Non-exhaustive: `Redis` exists only with the crate's `redis` feature.
#[derive(Debug, Clone, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Redis answered with an error or the connection failed.
    #[error("redis: {0}")]
    #[cfg(feature = "redis")]
    Redis(#[from] fred::error::Error),
    /// The settings name Redis, and this build has no Redis store (the crate's `redis` feature is off).
    #[error(
        "store.backend is redis, but this build has no redis store (the `redis` feature is off)"
    )]
    NoRedis,
    /// Redis did not answer within the budget.
    #[error("redis did not answer within {0:?}")]
    Timeout(std::time::Duration),
    /// Redis is known to be down (the circuit breaker is open): not asked.
    #[error("redis is down (circuit open), not asked")]
    CircuitOpen,
    /// More checks are waiting for Redis than the queue holds (Redis is far behind): not asked.
    #[error("too many checks waiting for redis, not asked")]
    Busy,
    /// Redis ran the check after its deadline, when its request had been answered without Redis already: the
    /// script left it undecided and counted nothing.
    #[error("redis reached the check after its deadline, not counted")]
    Late,
    /// Redis answered something the script never returns.
    #[error("unexpected reply from the limiter script: {0}")]
    Reply(String),
}
