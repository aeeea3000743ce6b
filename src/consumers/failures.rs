//! Failed credentials per client address (`consumers.failed_credentials`): past the limit, an address's
//! credentials are refused unchecked for a while, so that keys cannot be guessed and forged tokens cost nothing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use crate::key::{key_head, push_client_key};
use crate::limiter::store::LimitCheck;
use crate::limiter::{Algorithm, Limit, LimitError, RateLimiter};

/// Addresses remembered as over the limit, at most: past it, the store alone keeps counting them.
const MAX_BLOCKED: usize = 100_000;

/// The limit on failed credentials, and the addresses known to be over it.
#[derive(Debug)]
pub struct FailureLimit {
    limit: Limit,
    /// `<prefix>consumer:!failed:{`: `!` is in no limit name, so no plan limit shares these keys.
    key_head: String,
    /// Per address key, until when its credentials are refused. In-process: an instance learns of an address
    /// over the (shared) limit at its first failure from it.
    blocked: parking_lot::Mutex<HashMap<String, Instant, foldhash::fast::RandomState>>,
}

/// `consumers.failed_credentials`: at most `limit` failures per `period_ms` per client address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureSettings {
    /// Failures allowed in any `period_ms`.
    pub limit: u64,
    /// The period, in milliseconds.
    pub period_ms: u64,
}

// === impl FailureLimit ===

impl FailureLimit {
    /// The limit `settings` describe, keyed under `key_prefix`.
    pub fn new(settings: FailureSettings, key_prefix: &str) -> Result<Self, LimitError> {
        let algorithm = Algorithm::SlidingWindow {
            limit: settings.limit,
            period_ms: settings.period_ms,
        };
        Ok(Self {
            limit: Limit::new("failed_credentials", algorithm, 1)?,
            key_head: key_head(key_prefix, crate::key::PLAN_KEY_SCOPE, "!failed"),
            blocked: parking_lot::Mutex::default(),
        })
    }

    /// How long `client`'s credentials are still refused unchecked, if they are (IPv6 clients by their network of
    /// `ipv6_prefix` bits, as keys take them).
    pub fn blocked_for(&self, client: IpAddr, ipv6_prefix: u8) -> Option<Duration> {
        let key = self.key(client, ipv6_prefix);
        let now = Instant::now();
        let mut blocked = self.blocked.lock();
        let until = *blocked.get(&key)?;
        if until <= now {
            blocked.remove(&key);
            return None;
        }
        Some(until - now)
    }

    /// Counts a failed credential of `client`: `Some(wait)` when that puts it over the limit (its credentials are
    /// refused unchecked for `wait` from now on), `None` while under it, or when the store could not count.
    pub async fn count(
        &self,
        limiter: &RateLimiter,
        client: IpAddr,
        ipv6_prefix: u8,
    ) -> Option<Duration> {
        let key = self.key(client, ipv6_prefix);
        let check = LimitCheck {
            key: &key,
            limit: &self.limit,
        };
        let outcome = limiter.check(&[check]).await.ok()?;
        if outcome.allowed {
            return None;
        }
        let wait = outcome
            .decisions
            .first()
            .map_or(Duration::from_secs(1), |d| d.retry_after())
            .max(Duration::from_millis(1));
        let now = Instant::now();
        let mut blocked = self.blocked.lock();
        if blocked.len() >= MAX_BLOCKED {
            blocked.retain(|_, until| *until > now);
        }
        if blocked.len() < MAX_BLOCKED {
            blocked.insert(key, now + wait);
        }
        Some(wait)
    }

    fn key(&self, client: IpAddr, ipv6_prefix: u8) -> String {
        let mut key = String::with_capacity(self.key_head.len() + 24);
        key.push_str(&self.key_head);
        push_client_key(&mut key, client, ipv6_prefix);
        key.push('}');
        key
    }
}
