//! The Redis store: one Lua script evaluation per request covers all of a route's limits, atomically, with Redis's
//! clock, so that every gateway instance shares one truth.

use std::time::Duration;

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::config::{
    Config as FredConfig, ReconnectPolicy, ServerConfig, UnresponsiveConfig,
};
use fred::types::scripts::Script;
use fred::types::CustomCommand;
use fred::util::redis_keyslot;

use super::{LimitCheck, StoreError};
use crate::limiter::algorithms::gcra::Ticks;
use crate::limiter::{Algorithm, Decision, LeakyMode, Outcome};

/// The script, reviewed as Lua in its own file.
const CHECK_SCRIPT: &str = include_str!("../scripts/check.lua");

/// Fields per limit in the script's reply.
const REPLY_FIELDS: usize = 6;
/// Arguments per limit: algorithm id, four parameters, cost.
const ARGS_PER_LIMIT: usize = 6;

/// Which kind of Redis deployment the URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisTopology {
    /// One server (`redis://`, `rediss://`).
    Standalone,
    /// Redis Cluster (`redis-cluster://`).
    Cluster,
    /// Sentinel-managed primary (`redis-sentinel://`).
    Sentinel,
}

/// A pool of connections to Redis and the limiter script.
#[derive(Clone)]
pub struct RedisStore {
    pool: Pool,
    script: Script,
    topology: RedisTopology,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("topology", &self.topology)
            .field("connections", &self.pool.size())
            .finish()
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// Builds a pool for `url` and starts connecting in the background; requests made before Redis answers fail
    /// fast (and so fall back) instead of queueing.
    pub fn connect(url: &str, pool_size: usize) -> Result<Self, StoreError> {
        let config = FredConfig::from_url(url)?;
        let topology = match config.server {
            ServerConfig::Clustered { .. } => RedisTopology::Cluster,
            ServerConfig::Sentinel { .. } => RedisTopology::Sentinel,
            _ => RedisTopology::Standalone,
        };
        let pool = Builder::from_config(config)
            .with_connection_config(|c| {
                c.connection_timeout = Duration::from_secs(2);
                c.internal_command_timeout = Duration::from_secs(2);
                // The caller's timeout and fallback decide what happens to a request: never replay it later.
                c.max_command_attempts = 1;
                c.unresponsive = UnresponsiveConfig {
                    max_timeout: Some(Duration::from_secs(2)),
                    interval: Duration::from_millis(500),
                };
            })
            // Retry forever, quickly at first: limiting must come back to Redis soon after it does.
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 1_000, 2))
            .build_pool(pool_size.max(1))?;
        // Connection tasks run for the life of the pool and reconnect on their own.
        let _handles = pool.connect_pool();
        Ok(Self {
            pool,
            script: Script::from_lua(CHECK_SCRIPT),
            topology,
        })
    }

    /// The deployment kind named by the URL.
    pub fn topology(&self) -> RedisTopology {
        self.topology
    }

    /// Waits up to `within` for the first connection; true when connected.
    pub async fn wait_connected(&self, within: Duration) -> bool {
        matches!(
            tokio::time::timeout(within, self.pool.wait_for_connect()).await,
            Ok(Ok(()))
        )
    }

    /// Checks every limit of one request with Redis's clock, or with `now_ms` when given (tests).
    pub async fn check(
        &self,
        checks: &[LimitCheck<'_>],
        now_ms: Option<i64>,
    ) -> Result<Outcome, StoreError> {
        let keys: Vec<&str> = checks.iter().map(|c| c.key).collect();
        let mut args: Vec<Value> = Vec::with_capacity(1 + checks.len() * ARGS_PER_LIMIT);
        args.push(now_ms.map_or_else(|| Value::from(""), Value::from));
        for check in checks {
            let [id, a, b, c, d] = script_params(check.limit.algorithm());
            args.extend([id, a, b, c, d, check.limit.cost()].map(|v| Value::from(v as i64)));
        }
        let reply: Vec<i64> = self.eval(keys, args).await?;
        parse_reply(&reply, checks.len())
    }

    /// Asks Redis for `PING`, failing fast while disconnected: the circuit breaker's probe.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let client = self.pool.next();
        let fail_fast = client.with_options(&Options {
            fail_fast: true,
            ..Default::default()
        });
        let _: String = fail_fast.ping(None).await?;
        Ok(())
    }

    /// Runs the script by hash, loading it first when Redis does not know it (restart, `SCRIPT FLUSH`, failover).
    ///
    /// Sent as a custom command so that it can fail fast while disconnected: a queued command would run after
    /// the request was already answered by the fallback.
    async fn eval(&self, keys: Vec<&str>, args: Vec<Value>) -> Result<Vec<i64>, StoreError> {
        let client = self.pool.next();
        let fail_fast = client.with_options(&Options {
            fail_fast: true,
            ..Default::default()
        });
        let slot = keys.first().map(|k| redis_keyslot(k.as_bytes()));
        let mut command: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
        command.push(Value::from(self.script.sha1().clone()));
        command.push(Value::from(keys.len() as i64));
        command.extend(keys.iter().map(|k| Value::from(*k)));
        command.extend(args);
        let evalsha = || {
            fail_fast.custom::<Vec<i64>, Value>(
                CustomCommand::new("EVALSHA", slot, false),
                command.clone(),
            )
        };
        match evalsha().await {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                self.script.load(client).await?;
                Ok(evalsha().await?)
            }
            other => Ok(other?),
        }
    }
}

/// The script's algorithm id and four parameters for a limit (see the header of `check.lua`).
fn script_params(algorithm: &Algorithm) -> [u64; 5] {
    match *algorithm {
        Algorithm::SlidingWindow { limit, period_ms } => [1, limit, period_ms, 0, 0],
        Algorithm::SlidingLog { limit, period_ms } => [2, limit, period_ms, 0, 0],
        Algorithm::TokenBucket { rate, burst } => [3, burst, rate.count(), rate.period_ms(), 0],
        Algorithm::FixedWindow { limit, period_ms } => [4, limit, period_ms, 0, 0],
        Algorithm::Gcra { rate, burst } => {
            let ticks = Ticks::of(rate);
            [5, burst, ticks.ticks_per_ms, ticks.interval, 0]
        }
        Algorithm::LeakyBucket { rate, burst, mode } => {
            let max_delay_ms = match mode {
                LeakyMode::Reject => 0,
                LeakyMode::Delay { max_delay_ms } => max_delay_ms,
            };
            [6, burst, rate.count(), rate.period_ms(), max_delay_ms]
        }
    }
}

fn parse_reply(reply: &[i64], limits: usize) -> Result<Outcome, StoreError> {
    if reply.len() != 2 + limits * REPLY_FIELDS {
        return Err(StoreError::Reply(format!(
            "{} values for {limits} limits",
            reply.len()
        )));
    }
    let as_u64 = |v: i64| u64::try_from(v).unwrap_or(0);
    let decisions = reply[2..]
        .chunks_exact(REPLY_FIELDS)
        .map(|f| Decision {
            allowed: f[0] == 1,
            limit: as_u64(f[1]),
            remaining: as_u64(f[2]),
            retry_after_ms: as_u64(f[3]),
            reset_after_ms: as_u64(f[4]),
            delay_ms: as_u64(f[5]),
        })
        .collect();
    Ok(Outcome {
        allowed: reply[1] == 1,
        decisions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithms::gcra::EPOCH_MS;

    #[test]
    fn script_and_rust_share_the_gcra_epoch() {
        assert!(CHECK_SCRIPT.contains(&format!("local GCRA_EPOCH_MS = {EPOCH_MS}\n")));
    }
}
