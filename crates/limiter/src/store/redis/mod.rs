//! The Redis store: one Lua script evaluation covers all of a route's limits, atomically, with Redis's clock, so
//! that every gateway instance shares one truth; concurrent requests share evaluations (on Redis Cluster, one
//! per hash slot).

mod cluster;
mod connection;
mod evictions;
mod leases;
mod lost;
mod migration;
mod outage;
mod resets;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::{Config as FredConfig, ServerConfig};
use fred::types::scripts::Script;
use tokio::time::Instant;

use self::cluster::{join_all, slot_groups};
pub use self::connection::client_builder;
use self::connection::{Connection, GIVE_BACK_TIMEOUT};
use self::leases::Leases;
pub use self::outage::plain_words;
use self::outage::Link;
pub use self::resets::{Announcement, ResetNotice, DEFAULT_RESET_CHANNEL, DEFAULT_SLOTS_CHANNEL};
use super::batcher::{Batcher, Landed};
use super::redis_clock::RedisClock;
use super::script::{EncodedRequest, Mode, CHECK_SCRIPT};
use super::sentinel;
use super::{LimitCheck, StoreError};
use crate::last_reported::LastReported;
use crate::{Algorithm, Decision, Limit, Outcome};

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

/// The key [`RedisStore::probe`] asks about unless [`RedisStore::with_key_prefix`] names another.
const DEFAULT_PROBE_KEY: &str = "tollgate:probe";

/// A pool of connections to Redis, the limiter script, and the queue that coalesces concurrent checks.
#[derive(Clone)]
pub struct RedisStore {
    connection: Arc<Connection>,
    batcher: Batcher,
    /// How long a check waits for Redis at most (`store.timeout`).
    budget: Duration,
    /// Where [`reset`](Self::reset) tells every instance sharing this Redis that a key was reset.
    reset_channel: Arc<str>,
    /// The key [`probe`](Self::probe) asks about, and its limit.
    probe_key: Arc<str>,
    probe_limit: Arc<Limit>,
    /// The leases of this instance's requests in flight (`concurrency` limits).
    leases: Arc<Leases>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("topology", &self.connection.topology)
            .field("connections", &self.connection.pool.size())
            .finish()
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// Builds a pool for `url` and starts connecting in the background; requests made before Redis answers fail
    /// fast (and so fall back) instead of queueing.
    ///
    /// Checks go out as batches, one script call at a time (see `batcher`), and wait at most `budget` (the
    /// limiter's `store.timeout`) for their decision; the connections of the pool share the rest (peeks, resets,
    /// the cross-slot calls of Redis Cluster). Must be called within a tokio runtime.
    pub fn connect(url: &str, pool_size: usize, budget: Duration) -> Result<Self, StoreError> {
        let config = FredConfig::from_url(url)?;
        let topology = match config.server {
            ServerConfig::Clustered { .. } => RedisTopology::Cluster,
            ServerConfig::Sentinel { .. } => RedisTopology::Sentinel,
            _ => RedisTopology::Standalone,
        };
        let pool = client_builder(config.clone()).build_pool(pool_size.max(1))?;
        // Subscribed before connecting, on every client: the first failure (a refused certificate, a wrong
        // password) may come from any connection of the pool.
        let link = Arc::new(Link::default());
        link.listen(pool.clients());
        let evictions = Arc::new(evictions::Evictions::default());
        evictions.read_on_connect(pool.clients(), topology);
        // Connection tasks run for the life of the pool and reconnect on their own.
        let _handles = pool.connect_pool();
        let script = Script::from_lua(CHECK_SCRIPT);
        let connection = Arc::new(Connection {
            config,
            sha: Value::from(script.sha1().clone()),
            pool,
            script,
            topology,
            reconnecting: Arc::new(AtomicBool::new(false)),
            link,
            evictions,
            clock: RedisClock::default(),
            migrations: migration::Migrations::default(),
            slots_channel: std::sync::OnceLock::new(),
            marker: std::sync::OnceLock::new(),
            key_prefix: std::sync::OnceLock::new(),
            epoch: if topology == RedisTopology::Cluster {
                lost::Epoch::per_hash_slot()
            } else {
                lost::Epoch::default()
            },
            reports: parking_lot::Mutex::default(),
        });
        if topology == RedisTopology::Sentinel {
            let weak = Arc::downgrade(&connection);
            sentinel::follow_failovers(&connection.config, client_builder, move |primary| {
                weak.upgrade()
                    .map(|connection| connection.follow_primary(primary))
                    .is_some()
            })?;
        }
        let batcher = Batcher::start(connection.clone());
        let leases = Arc::new(Leases::new());
        // Held weakly: the connection must not keep alive what holds it.
        let (held, weak) = (Arc::downgrade(&leases), Arc::downgrade(&connection));
        connection.epoch.on_lost(move |slot| {
            let (Some(leases), Some(connection)) = (held.upgrade(), weak.upgrade()) else {
                return;
            };
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                let which = leases::Which::Lost(slot);
                runtime.spawn(async move { leases::put_back(&leases, &connection, which).await });
            }
        });
        Ok(Self {
            connection,
            batcher,
            budget,
            reset_channel: Arc::from(DEFAULT_RESET_CHANNEL),
            probe_key: Arc::from(DEFAULT_PROBE_KEY),
            probe_limit: Arc::new(probe_limit()?),
            leases,
        })
    }

    /// Names the keys of this store's own after `prefix` (the gateway's `store.key_prefix`): resets are announced
    /// on `<prefix>resets`, slots freed for waiting requests on `<prefix>slots`, the probe asks about
    /// `<prefix>probe`, and whether Redis lost its data is told by `<prefix>epoch`, so that deployments sharing one
    /// Redis under
    /// different prefixes keep apart, and an ACL user limited to the prefix's keys may probe.
    #[must_use]
    pub fn with_key_prefix(self, prefix: &str) -> Self {
        // Slots freed on full keys are announced on `<prefix>slots` (the first prefix given, for the store's life).
        let channel = Value::from(format!("{prefix}slots"));
        let _ = self.connection.slots_channel.set(channel);
        // And whether Redis lost its data is told by `<prefix>epoch`.
        let _ = self
            .connection
            .marker
            .set(Value::from(format!("{prefix}epoch")));
        // On Redis Cluster, by `<prefix>{<tag>}epoch` in each hash slot.
        let _ = self.connection.key_prefix.set(prefix.to_owned());
        Self {
            probe_key: Arc::from(format!("{prefix}probe")),
            ..self.with_reset_channel(&format!("{prefix}resets"))
        }
    }

    /// Announces resets on `channel` instead of `tollgate:resets`: the gateway uses
    /// `<key_prefix>resets`, so that deployments sharing one Redis under different prefixes keep apart.
    #[must_use]
    pub fn with_reset_channel(mut self, channel: &str) -> Self {
        self.reset_channel = Arc::from(channel);
        self
    }

    /// The deployment kind named by the URL.
    pub fn topology(&self) -> RedisTopology {
        self.connection.topology
    }

    /// Waits up to `within` for the first connection; true when connected.
    pub async fn wait_connected(&self, within: Duration) -> bool {
        matches!(
            tokio::time::timeout(within, self.connection.pool.wait_for_connect()).await,
            Ok(Ok(()))
        )
    }

    /// Checks every limit of one request with Redis's clock, or with `now_ms` when given (tests).
    ///
    /// With Redis's clock this is [`check_within`](Self::check_within) the budget given to
    /// [`connect`](Self::connect). With `now_ms`, a test's clock, the request has a script call of its own and
    /// waits as long as Redis takes.
    pub async fn check(
        &self,
        checks: &[LimitCheck<'_>],
        now_ms: Option<i64>,
    ) -> Result<Outcome, StoreError> {
        if now_ms.is_none() {
            return self.check_within(checks, self.budget).await;
        }
        // Boxed: a future holds its largest await point inline, and the gateway's checks should not carry these.
        let connection = &self.connection;
        if connection.topology == RedisTopology::Cluster {
            if let Some(groups) = slot_groups(checks) {
                let across = Arc::clone(connection).check_across_slots(
                    checks,
                    &groups,
                    now_ms,
                    Duration::ZERO,
                    0,
                );
                return Box::pin(across).await;
            }
        }
        let request = EncodedRequest::new(checks, Mode::Commit);
        Box::pin(connection.run_one(checks, request, now_ms, Duration::ZERO)).await
    }

    /// Checks every limit of one request with Redis's clock, waiting at most `budget` for the decision (then
    /// [`StoreError::Timeout`]).
    ///
    /// The request joins the next script call together with the other requests waiting for one. One script call
    /// covers all its limits, except on Redis Cluster when their keys hash to several slots (limits keyed by
    /// different values): then a dry run per slot, and the commits only if all admit.
    pub async fn check_within(
        &self,
        checks: &[LimitCheck<'_>],
        budget: Duration,
    ) -> Result<Outcome, StoreError> {
        self.check_leased(checks, budget, 0).await
    }

    /// [`check_within`](Self::check_within), the slots of its `concurrency` limits held under `lease` (from
    /// [`new_lease`](Self::new_lease); 0 when it has none).
    pub async fn check_leased(
        &self,
        checks: &[LimitCheck<'_>],
        budget: Duration,
        lease: u64,
    ) -> Result<Outcome, StoreError> {
        let connection = &self.connection;
        if connection.topology == RedisTopology::Cluster {
            if let Some(groups) = slot_groups(checks) {
                // Boxed, as are the rare paths of `check`.
                let across =
                    Arc::clone(connection).check_across_slots(checks, &groups, None, budget, lease);
                return Box::pin(tokio::time::timeout(budget, across))
                    .await
                    .unwrap_or(Err(StoreError::Timeout(budget)));
            }
        }
        let mut request = EncodedRequest::new(checks, Mode::Commit);
        if lease != 0 {
            request = request.leased(lease);
        }
        self.batcher
            .check(connection.slot_of(checks), request, budget)
            .await
    }

    /// Tells `reported` the state every committing call leaves its keys in, for as long as it lives (a limiter's
    /// under `on_error: local`, which starts its fallback from them).
    pub(crate) fn report_to(&self, reported: &Arc<LastReported>) {
        let mut listeners = self.connection.reports.lock();
        listeners.retain(|listener| listener.strong_count() > 0);
        listeners.push(Arc::downgrade(reported));
    }

    /// A lease id for one request with `concurrency` limits: unique to it among every instance's.
    pub fn new_lease(&self) -> u64 {
        self.leases.next_id()
    }

    /// This instance's name in the leases it holds (`GET /limits` shows who holds a slot).
    pub fn instance(&self) -> String {
        self.leases.instance()
    }

    /// How many slots of `key` (a `concurrency` limit's) each instance holds, by instance name (see
    /// [`instance`](Self::instance)), as Redis has them now; expired leases not yet freed included.
    pub async fn lease_holders(
        &self,
        key: &str,
    ) -> Result<std::collections::BTreeMap<String, u64>, StoreError> {
        let slot = (self.connection.topology == RedisTopology::Cluster)
            .then(|| fred::util::redis_keyslot(key.as_bytes()));
        let command = fred::types::CustomCommand::new_static("ZRANGE", slot, false);
        let args = vec![Value::from(key), Value::from(0), Value::from(-1)];
        let members: Vec<String> = self.connection.pool.next().custom(command, args).await?;
        let mut holders = std::collections::BTreeMap::new();
        for member in members {
            let id = member.parse::<u64>().unwrap_or(0);
            *holders.entry(Leases::instance_of(id)).or_insert(0) += 1;
        }
        Ok(holders)
    }

    /// Calls `wake` whenever a recovery window after a loss of Redis's data ends (concurrency limits admitted no new
    /// slot during it): the requests waiting for a slot ask again.
    pub fn on_recovery_end(&self, wake: impl Fn() + Send + Sync + 'static) {
        self.connection.epoch.on_window_end(wake);
    }

    /// How many slots of `key` (a `concurrency` limit's) this instance's requests in flight hold through Redis:
    /// what the in-process fallback counts as taken while Redis is away.
    pub fn slots_held(&self, key: &str) -> u64 {
        self.leases.held_on(key)
    }

    /// Keeps the slots an admitted request holds under `lease` renewed (see [`release`](Self::release)).
    pub fn hold(&self, lease: u64, held: Vec<(String, Limit)>) {
        self.leases.hold(&self.connection, lease, held, true);
    }

    /// Remembers the slots a request the in-process fallback admitted holds under `lease` (Redis was away), so that
    /// Redis adopts them when it answers again ([`adopt_leases`](Self::adopt_leases)) and counts them until the
    /// request ends ([`release_outside`](Self::release_outside)).
    pub fn hold_outside(&self, lease: u64, held: Vec<(String, Limit)>) {
        self.leases.hold(&self.connection, lease, held, false);
    }

    /// Releases the slots a request the fallback admitted held under `lease`: in Redis too if Redis adopted them.
    pub fn release_outside(&self, lease: u64, held: Vec<(String, Limit)>) {
        if self.leases.release(lease) {
            self.send_release(lease, held);
        }
    }

    /// Releases the slots a request held under `lease`: renewed no more, and removed from Redis by a give-back
    /// queued with the other checks, off the caller's path. One that fails leaves the slot until its lease ends.
    pub fn release(&self, lease: u64, held: Vec<(String, Limit)>) {
        self.leases.release(lease);
        self.send_release(lease, held);
    }

    /// Removes the slots `held` under `lease` from Redis: queued for the next script call with the checks (one per
    /// hash slot on Cluster), off the caller's path and with no task of its own. One that fails leaves the slot
    /// until its lease ends.
    fn send_release(&self, lease: u64, held: Vec<(String, Limit)>) {
        let connection = &self.connection;
        let all = checks(&held);
        let groups = match slot_groups(&all) {
            Some(groups) if connection.topology == RedisTopology::Cluster => groups,
            _ => vec![(0..all.len()).collect()],
        };
        for group in groups {
            let subset: Vec<LimitCheck<'_>> = group.iter().map(|&i| all[i]).collect();
            let request = EncodedRequest::new(&subset, Mode::GiveBack).leased(lease);
            let landed = Landed::new(GIVE_BACK_TIMEOUT, |result| {
                if let Err(error) = result {
                    tracing::debug!(%error, "a slot was not released, its lease will end it");
                }
            });
            // On Redis's clock, as the slot was taken.
            self.batcher
                .settle_then(connection.slot_of(&subset), request, None, landed);
        }
    }

    /// Decides several requests in one script call at `now_ms` (Redis's clock when `None`), one after another
    /// as a batch of the gateway's would be: the decisions are those of separate calls in this order.
    ///
    /// On Redis Cluster every key of every request must hash to one slot.
    pub async fn check_batch(
        &self,
        requests: &[&[LimitCheck<'_>]],
        now_ms: Option<i64>,
    ) -> Result<Vec<Outcome>, StoreError> {
        let encoded: Vec<EncodedRequest> = requests
            .iter()
            .map(|checks| EncodedRequest::new(checks, Mode::Commit))
            .collect();
        let slot = requests
            .iter()
            .find_map(|checks| self.connection.slot_of(checks));
        let connection = &self.connection;
        connection
            .run_script(
                connection.pool.next(),
                slot,
                &encoded.iter().collect::<Vec<_>>(),
                &vec![0; encoded.len()],
                now_ms,
                Duration::ZERO,
            )
            .await?
            .1
            .into_iter()
            .collect()
    }

    /// Redis's time, in ms, at `instant` of this process's clock, as the replies tell it (never later than the
    /// true one): what [`give_back`](Self::give_back) takes an admission's time in.
    pub fn redis_time_of(&self, instant: Instant) -> i64 {
        self.connection.clock.redis_ms(instant) as i64
    }

    /// Gives back what `checks` took when they were admitted at `at_ms` (Redis's ms), on the window they took it
    /// from, at Redis's time (or `now_ms`, a test's): a request held by a `leaky_bucket` in delay mode whose client
    /// went away. One call per hash slot on Redis Cluster. A give-back is sent once and never retried: one whose
    /// fate is unknown must not run twice.
    pub async fn give_back(
        &self,
        checks: &[LimitCheck<'_>],
        at_ms: i64,
        now_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        self.settle_in(checks, Mode::GiveBack, at_ms, now_ms).await
    }

    /// [`give_back`](Self::give_back) queued without waiting, at Redis's time, for what a request decided at
    /// `at_ms` took (`taken`: store key and limit, the amount as its cost): it joins the next script call (one per
    /// hash slot on Redis Cluster), is sent at most once, and `landed` is told, for the limits of each call, whether
    /// Redis confirmed it (from the task that ran the call; a call that fails or times out is not sent again).
    pub fn give_back_queued<F>(&self, taken: Vec<(String, Limit)>, at_ms: i64, landed: F)
    where
        F: Fn(Vec<(String, Limit)>, Result<(), StoreError>) + Clone + Send + 'static,
    {
        self.queue_settlement(taken, Mode::GiveBack, at_ms, landed);
    }

    /// [`add_debts`](Self::add_debts) queued without waiting, as [`give_back_queued`](Self::give_back_queued).
    pub fn add_debts_queued<F>(&self, owed: Vec<(String, Limit)>, at_ms: i64, landed: F)
    where
        F: Fn(Vec<(String, Limit)>, Result<(), StoreError>) + Clone + Send + 'static,
    {
        self.queue_settlement(owed, Mode::Debt, at_ms, landed);
    }

    /// Queues `limits` in `mode` for a request decided at `at_ms`, one queued request per hash slot.
    fn queue_settlement<F>(&self, limits: Vec<(String, Limit)>, mode: Mode, at_ms: i64, landed: F)
    where
        F: Fn(Vec<(String, Limit)>, Result<(), StoreError>) + Clone + Send + 'static,
    {
        let connection = &self.connection;
        let at = u64::try_from(at_ms).unwrap_or(0);
        let groups = match slot_groups(&checks(&limits)) {
            Some(groups) if connection.topology == RedisTopology::Cluster => groups,
            _ => {
                let group = checks(&limits);
                let request = EncodedRequest::new(&group, mode);
                let slot = connection.slot_of(&group);
                let landed = Landed::new(GIVE_BACK_TIMEOUT, move |result| landed(limits, result));
                self.batcher.settle_then(slot, request, Some(at), landed);
                return;
            }
        };
        let mut limits: Vec<Option<(String, Limit)>> = limits.into_iter().map(Some).collect();
        for group in groups {
            let subset: Vec<(String, Limit)> =
                group.iter().filter_map(|&i| limits[i].take()).collect();
            let checks = checks(&subset);
            let request = EncodedRequest::new(&checks, mode);
            let slot = connection.slot_of(&checks);
            let landed = landed.clone();
            let then = Landed::new(GIVE_BACK_TIMEOUT, move |result| landed(subset, result));
            self.batcher.settle_then(slot, request, Some(at), then);
        }
    }

    /// Adds a debt on each of `checks` (its limit's cost is the amount owed) for a request admitted at `at_ms`
    /// (Redis's ms) that settled for more than it reserved, on the window it landed in, at Redis's time (or
    /// `now_ms`, a test's). One call per hash slot on Redis Cluster; sent once and never retried.
    pub async fn add_debts(
        &self,
        checks: &[LimitCheck<'_>],
        at_ms: i64,
        now_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        self.settle_in(checks, Mode::Debt, at_ms, now_ms).await
    }

    /// One call per hash slot for `checks` in `mode` (a give-back or a debt) for an admission at `at_ms`.
    async fn settle_in(
        &self,
        checks: &[LimitCheck<'_>],
        mode: Mode,
        at_ms: i64,
        now_ms: Option<i64>,
    ) -> Result<(), StoreError> {
        let connection = &self.connection;
        let at = u64::try_from(at_ms).unwrap_or(0);
        let groups = match slot_groups(checks) {
            Some(groups) if connection.topology == RedisTopology::Cluster => groups,
            _ => vec![(0..checks.len()).collect()],
        };
        let calls = groups.iter().map(|group| {
            let subset: Vec<LimitCheck<'_>> = group.iter().map(|&i| checks[i]).collect();
            let request = EncodedRequest::new(&subset, mode);
            let slot = connection.slot_of(&subset);
            async move {
                match now_ms {
                    // With Redis's clock, in the next batch with the other requests' checks and settlements.
                    None => {
                        self.batcher
                            .settle(slot, request, at, GIVE_BACK_TIMEOUT)
                            .await
                    }
                    Some(_) => connection
                        .run_encoded(slot, &request, at, now_ms, GIVE_BACK_TIMEOUT)
                        .await
                        .map(drop),
                }
            }
        });
        join_all(calls).await.into_iter().collect()
    }

    /// The state of one limit for one key as it stands, consuming nothing (a dry run of the script).
    pub async fn peek(&self, check: LimitCheck<'_>) -> Result<Decision, StoreError> {
        let checks = [check];
        let request = EncodedRequest::new(&checks, Mode::DryRun);
        let outcome = self
            .connection
            .run_one(&checks, request, None, Duration::ZERO)
            .await?;
        outcome
            .decisions
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::Reply("no decision for the peeked limit".to_owned()))
    }

    /// A limiter call that consumes nothing, as the circuit breaker's probe: the script, in a dry run, on a key of
    /// its own. It fails where requests would (out of memory, read-only, refused by an ACL), where `PING` would
    /// succeed; and it fails at once while disconnected.
    pub async fn probe(&self, timeout: Duration) -> Result<(), StoreError> {
        let checks = [LimitCheck {
            key: &self.probe_key,
            limit: &self.probe_limit,
        }];
        let connection = &self.connection;
        let request = EncodedRequest::new(&checks, Mode::DryRun);
        let requests = [&request];
        let client = connection.pool.next_connected();
        // A dry run counts nothing, late or not.
        let deadlines = [0];
        let call = connection.run_script(
            client,
            connection.slot_of(&checks),
            &requests,
            &deadlines,
            None,
            timeout,
        );
        Box::pin(call)
            .await?
            .1
            .pop()
            .map_or(Ok(()), |outcome| outcome.map(drop))
    }

    /// Logs a failed limiter call's `reason` at WARN, once per outage whatever logged it first (the connections
    /// log why they cannot connect, with or without calls); the outage's first line also says `consequence`.
    pub fn log_failure(&self, reason: &str, consequence: &str) {
        self.connection.link.log_failure(reason, consequence);
    }

    /// Logs the end of the outage under way, if any (one line).
    pub fn log_recovery(&self) {
        self.connection.link.log_recovery();
    }

    /// What puts limits at risk although calls succeed: an eviction policy that may evict tollgate's keys, as
    /// read at the last connection, and evictions seen lately (see [`read_evictions`](Self::read_evictions)).
    pub fn warnings(&self) -> Vec<String> {
        let policy = self.connection.link.eviction();
        let evicting = self.connection.evictions.warning();
        policy.into_iter().chain(evicting).collect()
    }

    /// Reads how many keys Redis evicted (INFO's `evicted_keys`, on every primary), waiting at most `timeout` for
    /// each: a rise is a WARN once per episode, counted in `tollgate_store_evicted_keys_total`, and named in
    /// [`warnings`](Self::warnings) while the episode lasts. A Redis that does not answer is read next time.
    pub async fn read_evictions(&self, timeout: Duration) {
        let connection = &self.connection;
        let client = connection.pool.next_connected();
        connection
            .evictions
            .read(client, connection.topology, timeout)
            .await;
    }

    /// Why no connection of the pool is up (the last attempt's failure, in Redis's words), or `None` while one is.
    pub fn disconnected(&self) -> Option<String> {
        let clients = self.connection.pool.clients();
        if clients.iter().any(|client| client.is_connected()) {
            return None;
        }
        Some(self.connection.link.describe())
    }

    /// Why `error` happened, in Redis's own words where Redis gave any (`WRONGPASS ...`, `OOM ...`, `READONLY
    /// ...`, `NOPERM ...`); a connection that is down is described by why the last attempt to connect failed.
    /// `None` for [`StoreError::CircuitOpen`], which is no news.
    pub fn describe(&self, error: &StoreError) -> Option<String> {
        Some(match error {
            StoreError::Redis(error) => match error.kind() {
                ErrorKind::Canceled | ErrorKind::IO => self.connection.link.describe(),
                ErrorKind::Timeout => "redis did not answer in time".to_owned(),
                _ => error.details().to_owned(),
            },
            StoreError::CircuitOpen => return None,
            other => other.to_string(),
        })
    }
}

/// The limit the probe asks about: any would do, as a dry run consumes nothing.
fn probe_limit() -> Result<Limit, StoreError> {
    let window = Algorithm::FixedWindow {
        limit: 1,
        period_ms: 1_000,
    };
    Limit::new("probe", window, 1).map_err(|error| StoreError::Reply(error.to_string()))
}

/// The checks of `limits` (store key and limit each).
fn checks(limits: &[(String, Limit)]) -> Vec<LimitCheck<'_>> {
    limits
        .iter()
        .map(|(key, limit)| LimitCheck { key, limit })
        .collect()
}
