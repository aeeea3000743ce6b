//! A limit with the key spec that keys it: one entry of a route's or a plan's `limits:`.

use super::KeySpec;
use crate::limiter::Limit;

/// A limit and how it keys requests (one entry of a route's `limits:`).
#[derive(Debug, Clone)]
pub struct LimitSettings {
    /// The validated limit (name, algorithm, cost).
    pub limit: Limit,
    /// How the limit keys requests.
    pub key: KeySpec,
}
