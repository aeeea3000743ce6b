//! Rate limiting independent of HTTP: limits, decisions, the algorithms and the stores that keep their state.

pub mod algorithms;
mod breaker;
mod carry_over;
mod clock;
mod decision;
mod deny_cache;
mod giver;
mod last_reported;
mod limit;
mod rate_limiter;
mod settings;
mod slot_queues;
pub mod store;
mod units;
mod written;

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
pub(crate) use written::{replaced, Replaced, WrittenAlgorithm, WrittenQueue};
