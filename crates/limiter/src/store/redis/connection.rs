//! The pool's side of the Redis store: fred clients with the gateway's settings, script calls, batches.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::config::{Config as FredConfig, ReconnectPolicy, UnresponsiveConfig};
use fred::types::scripts::Script;
use fred::types::CustomCommand;
use tokio::time::Instant;

use super::cluster::join_all;
use super::evictions::Evictions;
use super::lost::{cluster_marker, Epoch, DEFAULT_MARKER};
use super::migration::{self, Migrations};
use super::outage::Link;
use super::RedisTopology;
use crate::last_reported::LastReported;
use crate::store::batcher::{Pending, RunBatch};
use crate::store::redis_clock::RedisClock;
use crate::store::script::{self, EncodedRequest, Marker};
use crate::store::{LimitCheck, StoreError};
use crate::Outcome;

/// What runs script calls: the pool and the script. Shared with the batching task.
pub(super) struct Connection {
    /// What the pool was built from, for the subscriber that hears resets.
    pub(super) config: FredConfig,
    pub(super) pool: Pool,
    pub(super) script: Script,
    /// The script's SHA1 as an argument, built once.
    pub(super) sha: Value,
    pub(super) topology: RedisTopology,
    /// Set while a forced reconnection (after a failover) is under way, so failing requests start only one.
    pub(super) reconnecting: Arc<AtomicBool>,
    /// What the connections last said (why they fail, the eviction policy), and the outage's log.
    pub(super) link: Arc<Link>,
    /// The evictions Redis reported, read by the once-a-second health check.
    pub(super) evictions: Arc<Evictions>,
    /// Redis's time as the replies tell it, for the deadlines the script keeps.
    pub(super) clock: RedisClock,
    /// Where the Cluster slots being migrated go, for the calls Redis redirects there.
    pub(super) migrations: Migrations,
    /// Where the script announces that a slot of a full key with a queue came free (`<key_prefix>slots`), set
    /// once by [`RedisStore::with_key_prefix`](super::RedisStore::with_key_prefix); `tollgate:slots` until then.
    pub(super) slots_channel: std::sync::OnceLock<Value>,
    /// The key every call checks to tell whether Redis lost its data (`<key_prefix>epoch`), set once by
    /// [`RedisStore::with_key_prefix`](super::RedisStore::with_key_prefix); `tollgate:epoch` until then.
    pub(super) marker: std::sync::OnceLock<Value>,
    /// The gateway's `key_prefix`, set once with the marker: on Redis Cluster each hash slot has a marker of its
    /// own under it (see [`cluster_marker`]); `tollgate:` until then.
    pub(super) key_prefix: std::sync::OnceLock<String>,
    /// The epoch of Redis's data as the replies tell it.
    pub(super) epoch: Epoch,
    /// What is told each key's state as the calls leave it (each limiter's under `on_error: local`).
    pub(super) reports: parking_lot::Mutex<Vec<Weak<LastReported>>>,
}

// === impl Connection ===

impl Connection {
    /// A script call of its own for one request (`timeout` as for [`run_script`](Self::run_script)).
    pub(super) async fn run_one(
        &self,
        checks: &[LimitCheck<'_>],
        request: EncodedRequest,
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Result<Outcome, StoreError> {
        let deadline = self.deadline(now_ms, timeout);
        self.run_encoded(self.slot_of(checks), &request, deadline, now_ms, timeout)
            .await
            .map(|(_, outcome)| outcome)
    }

    /// The deadline, in Redis's ms, of a call that may take `timeout` from now (none for explicit times, a test's,
    /// or without a timeout).
    pub(super) fn deadline(&self, now_ms: Option<i64>, timeout: Duration) -> u64 {
        if now_ms.is_none() && !timeout.is_zero() {
            self.clock.redis_ms(Instant::now() + timeout)
        } else {
            0
        }
    }

    /// A script call of its own for one encoded request on `slot`: the time it was decided at (Redis's ms), and
    /// its outcome. Sent again while Redis answers that its keys are split between the two nodes of a slot being
    /// migrated (see [`migration::Unstable`]).
    pub(super) async fn run_encoded(
        &self,
        slot: Option<u16>,
        request: &EncodedRequest,
        deadline: u64,
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Result<(i64, Outcome), StoreError> {
        let mut unstable = migration::Unstable::new(timeout);
        let mut result = self
            .run_script(
                self.pool.next(),
                slot,
                &[request],
                &[deadline],
                now_ms,
                timeout,
            )
            .await;
        while let Some(left) = unstable.again(&result).await {
            result = self
                .run_script(
                    self.pool.next(),
                    slot,
                    &[request],
                    &[deadline],
                    now_ms,
                    left,
                )
                .await;
        }
        let (decided_at, mut outcomes) = result?;
        let outcome = outcomes
            .pop()
            .ok_or_else(|| StoreError::Reply("no outcome for the request".to_owned()))??;
        Ok((decided_at, outcome))
    }

    /// One script call for `requests`, whose keys must all hash to `slot` on Redis Cluster: an outcome per
    /// request, [`StoreError::Late`] for those Redis reached past their deadline (Redis's ms, 0: none).
    ///
    /// Past `timeout` (none when zero) the call fails, and fred drops it unsent if it has not been written yet.
    /// That alone cannot keep a late call from counting: fred marks a command abandoned only when its own timer
    /// fires, not when the caller drops it (the batch's deadline often comes first), a command that passed
    /// fred's fail-fast check just before a disconnection waits in its queue through the reconnection and is then
    /// written, and a command already written runs whenever Redis gets to it (`CLIENT PAUSE`, a stall). The
    /// deadlines the script itself checks cover every such path.
    pub(super) async fn run_script(
        &self,
        client: &Client,
        slot: Option<u16>,
        requests: &[&EncodedRequest],
        deadlines: &[u64],
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Result<(i64, Vec<Result<Outcome, StoreError>>), StoreError> {
        let runs = script::runs(requests);
        let channel = self
            .slots_channel
            .get_or_init(|| Value::from(super::DEFAULT_SLOTS_CHANNEL));
        let command = script::command(
            &self.sha,
            now_ms,
            || self.clock.redis_ms(Instant::now()) as i64,
            requests,
            deadlines,
            &runs,
            channel,
            self.marker(now_ms, slot),
        );
        let reply = self.evalsha(client, slot, command, timeout).await?;
        let received = Instant::now();
        let reply = script::unpack_reply(&reply)?;
        let (epoch, recovering_until) = script::epoch_of(&reply);
        self.epoch.observe(
            slot,
            epoch,
            recovering_until,
            reply.first().copied().unwrap_or(0),
        );
        let decided_at = reply.first().copied().unwrap_or_default();
        if now_ms.is_none() {
            self.clock.observe(decided_at, received);
        }
        let outcomes = script::parse_reply(&reply, requests, &runs)?;
        self.report(requests, &runs, &outcomes);
        Ok((decided_at, outcomes))
    }

    /// Tells what listens for reports (see [`LastReported`]) the state each committing call left its keys in: of
    /// a run of identical requests, only its last decision, which says the state the run left.
    fn report(
        &self,
        requests: &[&EncodedRequest],
        runs: &[usize],
        outcomes: &[Result<Outcome, StoreError>],
    ) {
        let listeners = self.reports.lock();
        if listeners.is_empty() {
            return;
        }
        for reported in listeners.iter().filter_map(Weak::upgrade) {
            let now_ms = reported.now_ms();
            let mut end = 0;
            for &count in runs {
                end += count;
                let (Some(request), Some(Ok(outcome))) =
                    (requests.get(end - 1), outcomes.get(end - 1))
                else {
                    continue;
                };
                for (limit, key) in request.seeding_keys() {
                    if let Some(decision) = outcome.decisions.get(limit) {
                        reported.remember(key, decision, now_ms);
                    }
                }
            }
        }
    }

    /// The marker a call on `slot` checks, with the epoch this instance knows of it: on Redis Cluster the marker of
    /// that hash slot (none for a call without keys), elsewhere the one every call shares; none with a test's
    /// explicit time.
    fn marker(&self, now_ms: Option<i64>, slot: Option<u16>) -> Option<Marker> {
        if now_ms.is_some() {
            return None;
        }
        if self.topology == RedisTopology::Cluster {
            let slot = slot?;
            let prefix = self.key_prefix.get().map_or("tollgate:", String::as_str);
            return Some(Marker {
                key: Value::from(cluster_marker(prefix, slot)),
                known: self.epoch.known(Some(slot)),
                per_hash_slot: true,
            });
        }
        let marker = self.marker.get_or_init(|| Value::from(DEFAULT_MARKER));
        Some(Marker {
            key: marker.clone(),
            known: self.epoch.known(None),
            per_hash_slot: false,
        })
    }

    /// Runs the script by hash on the node owning `slot`; on Redis Cluster, a call that Redis redirected because
    /// its slot is on the move is followed there (see [`follow_migration`](Self::follow_migration)).
    async fn evalsha(
        &self,
        client: &Client,
        slot: Option<u16>,
        command: Vec<Value>,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        let started = Instant::now();
        let result = Box::pin(self.evalsha_on_owner(client, slot, &command, timeout)).await;
        match (slot, &result) {
            (Some(slot), Err(StoreError::Redis(error)))
                if self.topology == RedisTopology::Cluster && migration::redirected(error) =>
            {
                let deadline = (!timeout.is_zero()).then(|| started + timeout);
                Box::pin(self.follow_migration(client, slot, command, result, deadline)).await
            }
            _ => result,
        }
    }

    /// Runs the script by hash, loading it first when Redis does not know it (restart, `SCRIPT FLUSH`, failover).
    /// On Redis Cluster the load goes to every primary.
    ///
    /// A call that fails because its connection is down is tried once more on a connection of the pool that is up.
    pub(super) async fn evalsha_on_owner(
        &self,
        client: &Client,
        slot: Option<u16>,
        command: &[Value],
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        let result = Box::pin(eval_on(client, slot, command.to_vec(), timeout)).await;
        let (client, result) = match result {
            // This connection is down or still reconnecting (each of the pool reconnects on its own schedule):
            // another may be up already.
            Err(error) if error.kind() == &ErrorKind::Canceled && self.pool.size() > 1 => {
                let other = self.pool.next_connected();
                if !other.is_connected() {
                    return Err(error.into());
                }
                (
                    other,
                    Box::pin(eval_on(other, slot, command.to_vec(), timeout)).await,
                )
            }
            other => (client, other),
        };
        match result {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                Box::pin(self.script.load(client)).await?;
                Ok(Box::pin(eval_on(client, slot, command.to_vec(), timeout)).await?)
            }
            Err(error) if error.details().contains("READONLY") => {
                self.reconnect_to_primary("redis refused a write (READONLY)");
                Err(error.into())
            }
            other => Ok(other?),
        }
    }

    /// A sentinel announced `primary` as the new primary: reconnect unless every connection of the pool is there
    /// already (another sentinel said so first, or the pool reconnected on its own).
    pub(super) fn follow_primary(&self, primary: &Server) {
        let connected = self.pool.active_connections();
        let there = |server: &Server| server.host == primary.host && server.port == primary.port;
        if !connected.is_empty() && connected.iter().all(there) {
            return;
        }
        self.reconnect_to_primary("sentinel announced a new primary");
    }

    /// The server we write to is no longer the primary (a Sentinel failover demoted it, `why` says how we know):
    /// reconnect now, which asks Sentinel for the new primary, instead of writing into errors, or into a server
    /// about to be demoted, until the old primary drops us.
    fn reconnect_to_primary(&self, why: &str) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!("{why}: reconnecting to the current primary");
        let pool = self.pool.clone();
        let reconnecting = Arc::clone(&self.reconnecting);
        tokio::spawn(async move {
            if let Err(error) = pool.force_reconnection().await {
                tracing::warn!(%error, "forced reconnection failed");
            }
            reconnecting.store(false, Ordering::Release);
        });
    }

    /// What the script is sent for each of `pending`, in place of a deadline: its deadline on Redis's clock (one
    /// reading of it for them all), or for a settlement the time its request was decided.
    pub(super) fn script_deadlines(&self, pending: &[Pending]) -> Vec<u64> {
        let clock = self.clock.reading();
        pending
            .iter()
            .map(|pending| {
                pending
                    .decided_ms
                    .unwrap_or_else(|| clock.redis_ms(pending.deadline))
            })
            .collect()
    }

    /// One call for the requests of `batch` that share a hash slot, given up at `deadline`.
    async fn run_batch_slot(self: &Arc<Self>, batch: Vec<Pending>, deadline: Instant) {
        let slot = batch.first().and_then(|pending| pending.slot);
        let requests: Vec<&EncodedRequest> = batch.iter().map(|p| &p.request).collect();
        let deadlines = self.script_deadlines(&batch);
        // At least a millisecond: zero would mean no timeout at all.
        let timeout = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let result = self
            .run_script(self.pool.next(), slot, &requests, &deadlines, None, timeout)
            .await;
        match result {
            // Requests on keys on both nodes of a slot being migrated: each set of keys goes on its own.
            Err(StoreError::Redis(error)) if migration::unstable(&error) => {
                self.run_split(batch, deadline).await;
            }
            result => answer_all(batch, result),
        }
    }
}

/// Answers each request of `batch` with its outcome, or all with the call's failure.
pub(super) fn answer_all(
    batch: Vec<Pending>,
    result: Result<(i64, Vec<Result<Outcome, StoreError>>), StoreError>,
) {
    match result {
        Ok((_, outcomes)) => {
            for (pending, outcome) in batch.into_iter().zip(outcomes) {
                pending.answer(outcome);
            }
        }
        Err(error) => {
            for pending in batch {
                pending.answer(Err(error.clone()));
            }
        }
    }
}

impl RunBatch for Connection {
    async fn run(self: Arc<Self>, batch: Vec<Pending>, deadline: Instant) {
        if self.topology == RedisTopology::Cluster {
            // No script call may touch keys of two slots: one call per slot, concurrently, each in queue order.
            let mut by_slot: Vec<(Option<u16>, Vec<Pending>)> = Vec::new();
            for pending in batch {
                match by_slot.iter_mut().find(|(slot, _)| *slot == pending.slot) {
                    Some((_, members)) => members.push(pending),
                    None => by_slot.push((pending.slot, vec![pending])),
                }
            }
            join_all(
                by_slot
                    .into_iter()
                    .map(|(_, members)| self.run_batch_slot(members, deadline)),
            )
            .await;
        } else {
            self.run_batch_slot(batch, deadline).await;
        }
    }
}

/// How long a give-back may take: it has no deadline (it must land whenever it can, once), but a stalled
/// connection must not hold its task forever.
pub(super) const GIVE_BACK_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest wait between two attempts to reconnect, in ms: Redis answering again must not wait for a long backoff
/// (limiting is to be shared again within 300 ms of it), and an attempt that fails on loopback or a LAN costs one
/// refused connection or one refused `AUTH`.
const RECONNECT_CAP_MS: u32 = 100;
/// Random share of a wait between attempts, in ms (within the cap): the instances of a deployment, and the
/// connections of a pool, do not all knock at once on a Redis that just came back.
const RECONNECT_JITTER_MS: u32 = 50;

/// A client builder for `config` with the gateway's connection settings, for the pool and the subscribers.
pub fn client_builder(config: FredConfig) -> Builder {
    let mut builder = Builder::from_config(config);
    let mut policy = ReconnectPolicy::new_exponential(0, 10, RECONNECT_CAP_MS, 2);
    policy.set_jitter(RECONNECT_JITTER_MS);
    builder
        .with_config(|c| {
            // fred's default gives up for good when the very first connection fails: a gateway started before
            // Redis, or before Redis took its password, would then never connect. The reconnection policy applies
            // from the first attempt instead.
            c.fail_fast = false;
        })
        .with_connection_config(|c| {
            c.connection_timeout = Duration::from_secs(2);
            c.internal_command_timeout = Duration::from_secs(2);
            // The caller's timeout and fallback decide what happens to a request: never replay it later.
            c.max_command_attempts = 1;
            // A Redis Cluster redirection fails the call back to us instead of being followed by fred (a MOVED
            // still makes fred read the slot map again first): fred follows an ASK by writing ASKING on a
            // connection other commands are pipelined on and reading the next reply as its answer, which shifted
            // every later reply on that connection by one, so that every call on the moving slot timed out until
            // a restart. The store follows redirections itself (`migration.rs`), with ASKING and the call in one
            // pipeline.
            c.max_redirections = 0;
            c.unresponsive = UnresponsiveConfig {
                max_timeout: Some(Duration::from_secs(2)),
                interval: Duration::from_millis(500),
            };
        })
        // Forever, quickly at first, and never more than RECONNECT_CAP_MS apart.
        .set_policy(policy);
    builder
}

/// `EVALSHA` with `command` on `client`, failing at once while it is not connected (a queued command would run
/// after the request was already answered by the fallback) and never sent once `timeout` passed (zero: none).
/// `slot` routes it to the node owning the keys.
///
/// The caller boxes the future: fred's are kilobytes each, and held inline they would make every batch's task
/// that large (a task's future is copied on each spawn).
async fn eval_on(
    client: &Client,
    slot: Option<u16>,
    command: Vec<Value>,
    timeout: Duration,
) -> Result<Value, Error> {
    let fail_fast = client.with_options(&Options {
        fail_fast: true,
        timeout: Some(timeout),
        ..Default::default()
    });
    fail_fast
        .custom::<Value, Value>(CustomCommand::new("EVALSHA", slot, false), command)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rediss_urls_connect_with_rustls() {
        for url in [
            "rediss://127.0.0.1:6380",
            "rediss://user:pass@127.0.0.1:6380/1",
        ] {
            let config = FredConfig::from_url(url).expect("valid URL");
            assert!(config.uses_rustls(), "{url}");
        }
        let plain = FredConfig::from_url("redis://127.0.0.1:6379").expect("valid URL");
        assert!(!plain.uses_tls());
    }
}
