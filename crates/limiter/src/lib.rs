//! Rate limiting independent of HTTP: limits, decisions, the algorithms and the stores that keep their state.
//!
//! `tollgate-limiter` is the core of the tollgate gateway as a crate of its own, with no HTTP, YAML or gRPC in its
//! tree: a [`Limit`] names an [`Algorithm`] and its parameters; a [`RateLimiter`] checks a request's limits, each
//! under its own key, all-or-nothing in one call, on the in-process store or on Redis (standalone, Sentinel or
//! Cluster) shared by every process that uses it, and answers an [`Outcome`]: admitted or not, and per limit a
//! [`Decision`] (what remains, how long to wait). `examples/alone.rs` runs two limits on one client:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use tollgate_limiter::store::LimitCheck;
//! use tollgate_limiter::{Algorithm, Limit, RateLimiter, StoreSettings};
//!
//! let limiter = RateLimiter::from_settings(&StoreSettings::default())?;
//! let per_minute = Limit::new("per-minute", Algorithm::FixedWindow { limit: 2, period_ms: 60_000 }, 1)?;
//! let check = [LimitCheck { key: "per-minute:{203.0.113.7}", limit: &per_minute }];
//! assert!(limiter.check(&check).await?.allowed);
//! assert!(limiter.check(&check).await?.allowed);
//! let refused = limiter.check(&check).await?;
//! assert!(!refused.allowed && refused.decisions[0].retry_after_ms > 0);
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! - `redis` (on by default): the Redis store ([`store::RedisStore`], `Backend::Redis`), its Lua, the fallback and
//!   the circuit breaker, and the `fred` client in the tree. Without it (`default-features = false`) the crate has
//!   the in-process store only and none of the Redis client's crates: [`Backend`] and [`store::StoreError`] lose
//!   their `Redis` variants (both are `#[non_exhaustive]`, so code that matches them builds either way), and
//!   [`RateLimiter::from_settings`] refuses settings whose `backend` is [`BackendKind::Redis`] with
//!   [`store::StoreError::NoRedis`] rather than deciding alone what was meant to be shared.
//! - `calendar` (on by default): calendar windows ([`Algorithm::CalendarWindow`], a [`Calendar`] of days, weeks,
//!   months or years starting at midnight in an IANA time zone), with the zone database compiled in (jiff). Without
//!   it [`Calendar::new`] refuses every calendar with [`calendar::CalendarError::NotBuilt`].

pub mod algorithms;
#[cfg(feature = "redis")]
mod breaker;
pub mod calendar;
#[cfg(feature = "redis")]
mod carry_over;
mod clock;
mod decision;
mod deny_cache;
mod giver;
#[cfg(feature = "redis")]
mod last_reported;
mod limit;
mod rate_limiter;
mod settings;
mod slot_queues;
pub mod store;
mod units;
mod written;

pub use calendar::{Calendar, CalendarUnit, CalendarWindow};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{Decision, Outcome};
pub use deny_cache::DenyCache;
pub use giver::{Giver, Settlement};
pub use limit::{
    format_duration_ms, Algorithm, LeakyMode, Limit, LimitError, Rate, SlotQueue, MAX_LOG_ENTRIES,
    MAX_SCALED, MIN_LEASE_MS, SLOT_RETRY_MS,
};
pub use rate_limiter::{Backend, DecidedBy, OnError, RateLimiter, Readiness, Unavailable};
pub use settings::{BackendKind, StoreSettings};
pub use slot_queues::{Place, SlotQueues};
/// What a full in-process store does with a new key's request (`StoreSettings::when_full`).
pub use store::WhenFull;
pub use units::{parse_duration, parse_rate, UnitError};
pub use written::{replaced, Replaced, WrittenAlgorithm, WrittenQueue};
