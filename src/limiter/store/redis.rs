//! The Redis store: one Lua script evaluation covers all of a route's limits, atomically, with Redis's clock, so
//! that every gateway instance shares one truth; concurrent requests share evaluations (on Redis Cluster, one
//! per hash slot).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::config::{
    Config as FredConfig, ReconnectPolicy, ServerConfig, UnresponsiveConfig,
};
use fred::types::scripts::Script;
use fred::types::CustomCommand;
use fred::util::redis_keyslot;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::batcher::{Batcher, Pending, RunBatch};
use super::redis_clock::RedisClock;
use super::script::{self, EncodedRequest, Mode, CHECK_SCRIPT};
use super::sentinel;
use super::{LimitCheck, StoreError};
use crate::limiter::{Algorithm, Decision, Limit, Outcome};

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

/// The channel resets are announced on unless [`RedisStore::with_reset_channel`] names another.
pub const DEFAULT_RESET_CHANNEL: &str = "tollgate:resets";
/// The key [`RedisStore::probe`] asks about unless [`RedisStore::with_key_prefix`] names another.
const DEFAULT_PROBE_KEY: &str = "tollgate:probe";

/// What [`RedisStore::on_reset`] hears.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetNotice<'a> {
    /// An instance reset this key.
    Key(&'a str),
    /// Announcements may have been missed (the subscriber reconnected, or fell behind): any key may have been reset.
    MaybeMissed,
}

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
}

/// What runs script calls: the pool and the script. Shared with the batching task.
struct Connection {
    /// What the pool was built from, for the subscriber that hears resets.
    config: FredConfig,
    pool: Pool,
    script: Script,
    /// The script's SHA1 as an argument, built once.
    sha: Value,
    topology: RedisTopology,
    /// Set while a forced reconnection (after a failover) is under way, so failing requests start only one.
    reconnecting: Arc<AtomicBool>,
    /// What the connections last said (why they fail, the eviction policy), and the outage's log.
    link: Arc<Link>,
    /// Redis's time as the replies tell it, for the deadlines the script keeps.
    clock: RedisClock,
}

/// What the pool last heard of its connections: why the last attempt to connect failed, in Redis's own words,
/// until one succeeds (requests only ever see "not connected", as they fail fast); and, from the last connection,
/// whether Redis may evict tollgate's keys.
#[derive(Debug, Default)]
struct Link {
    cause: std::sync::Mutex<Option<String>>,
    eviction: std::sync::Mutex<Option<String>>,
    /// What was logged of the outage under way, by the connections or by the limiter's calls.
    outage: std::sync::Mutex<OutageLog>,
}

/// An outage as logged: when it began and the reasons already told, each once.
///
/// Outages that follow each other closely are one episode in the log: a reason told in the last
/// [`QUIET_AFTER_RECOVERY`] is not told again, and an outage that told nothing ends without a line. A Cluster slot
/// on the move fails the calls on that slot while the others succeed, which would otherwise log a failure and a
/// recovery per request.
#[derive(Debug, Default)]
struct OutageLog {
    since: Option<std::time::Instant>,
    logged: Vec<String>,
    /// Whether the outage under way has logged a line (so its end gets one).
    told: bool,
    /// When the last outage ended.
    recovered: Option<std::time::Instant>,
}

/// How a failure is told in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Told {
    /// The first line of an outage.
    First,
    /// Another reason during the same outage.
    Still,
}

impl OutageLog {
    /// A call failed for `reason` at `now`: the line to log, if any.
    fn failure(&mut self, reason: &str, now: std::time::Instant) -> Option<Told> {
        let first = self.since.is_none();
        if first {
            self.since = Some(now);
            let episode_over = self
                .recovered
                .is_none_or(|at| now.saturating_duration_since(at) >= QUIET_AFTER_RECOVERY);
            if episode_over {
                self.logged.clear();
            }
        }
        if self.logged.iter().any(|logged| logged == reason)
            || self.logged.len() >= MAX_LOGGED_REASONS
        {
            return None;
        }
        self.logged.push(reason.to_owned());
        self.told = true;
        Some(if first { Told::First } else { Told::Still })
    }

    /// Calls succeed again at `now`: how long the outage lasted, if it was told (its end is then told too).
    fn recovery(&mut self, now: std::time::Instant) -> Option<std::time::Duration> {
        let since = self.since.take()?;
        self.recovered = Some(now);
        std::mem::take(&mut self.told).then(|| now.saturating_duration_since(since))
    }
}

/// How long after an outage's end its reasons stay told.
const QUIET_AFTER_RECOVERY: std::time::Duration = std::time::Duration::from_secs(10);

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
            clock: RedisClock::default(),
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
        Ok(Self {
            connection,
            batcher,
            budget,
            reset_channel: Arc::from(DEFAULT_RESET_CHANNEL),
            probe_key: Arc::from(DEFAULT_PROBE_KEY),
            probe_limit: Arc::new(probe_limit()?),
        })
    }

    /// Names the keys of this store's own after `prefix` (the gateway's `store.key_prefix`): resets are announced
    /// on `<prefix>resets` and the probe asks about `<prefix>probe`, so that deployments sharing one Redis under
    /// different prefixes keep apart, and an ACL user limited to the prefix's keys may probe.
    #[must_use]
    pub fn with_key_prefix(self, prefix: &str) -> Self {
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
        let connection = &self.connection;
        if connection.topology == RedisTopology::Cluster {
            if let Some(groups) = slot_groups(checks) {
                // Boxed, as are the rare paths of `check`.
                let across =
                    Arc::clone(connection).check_across_slots(checks, &groups, None, budget);
                return Box::pin(tokio::time::timeout(budget, across))
                    .await
                    .unwrap_or(Err(StoreError::Timeout(budget)));
            }
        }
        let request = EncodedRequest::new(checks, Mode::Commit);
        self.batcher
            .check(connection.slot_of(checks), request, budget)
            .await
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
        let connection = &self.connection;
        let at = u64::try_from(at_ms).unwrap_or(0);
        let groups = match slot_groups(checks) {
            Some(groups) if connection.topology == RedisTopology::Cluster => groups,
            _ => vec![(0..checks.len()).collect()],
        };
        let calls = groups.iter().map(|group| {
            let subset: Vec<LimitCheck<'_>> = group.iter().map(|&i| checks[i]).collect();
            let request = EncodedRequest::new(&subset, Mode::GiveBack);
            let slot = connection.slot_of(&subset);
            async move {
                connection
                    .run_encoded(slot, &request, at, now_ms, GIVE_BACK_TIMEOUT)
                    .await
            }
        });
        join_all(calls)
            .await
            .into_iter()
            .try_for_each(|given| given.map(drop))
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

    /// Deletes the state of `key`; true if there was any. Then publishes `key` on the reset channel, so that every
    /// instance listening ([`on_reset`](Self::on_reset)), this one included, forgets what it remembers of the key
    /// in-process.
    pub async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        let client = self.connection.pool.next();
        let deleted: i64 = client.del(key).await?;
        // The key is reset in Redis whatever happens here: a failed announcement (an ACL user without the
        // channel, say) is worth a warning, not a failed reset.
        let announced: Result<i64, _> = client.publish(&*self.reset_channel, key).await;
        if let Err(error) = announced {
            tracing::warn!(%error, channel = %self.reset_channel, "reset not announced to other instances");
        }
        Ok(deleted > 0)
    }

    /// Calls `forget` with each key reset by any instance on this Redis, heard on a subscriber connection of its
    /// own, until `forget` returns false. The subscription is made again after every reconnection, and
    /// [`ResetNotice::MaybeMissed`] then says that resets announced meanwhile were not heard.
    pub fn on_reset(
        &self,
        forget: impl Fn(ResetNotice<'_>) -> bool + Send + 'static,
    ) -> Result<(), StoreError> {
        let subscriber =
            client_builder(self.connection.config.clone()).build_subscriber_client()?;
        let channel = self.reset_channel.to_string();
        let _connection = subscriber.connect();
        let _resubscriptions = subscriber.manage_subscriptions();
        tokio::spawn(async move {
            let mut messages = subscriber.message_rx();
            let mut reconnections = subscriber.reconnect_rx();
            // Only a subscription that succeeded is made again on reconnection, so the first is retried until it
            // does: Redis may not be up yet, or an ACL user may lack the channel until an operator grants it.
            let mut warned = false;
            while let Err(error) = subscriber.subscribe(channel.as_str()).await {
                // Redis being down is reported by the pool already; a refusal by Redis itself is news.
                let unreachable = matches!(
                    error.kind(),
                    ErrorKind::IO
                        | ErrorKind::Canceled
                        | ErrorKind::Timeout
                        | ErrorKind::Backpressure
                );
                if unreachable || std::mem::replace(&mut warned, true) {
                    tracing::debug!(%error, %channel, "subscribing to resets failed; retrying");
                } else {
                    tracing::warn!(%error, %channel, "cannot hear other instances' resets; retrying");
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            loop {
                let go_on = tokio::select! {
                    message = messages.recv() => match message {
                        Ok(message) => match message.value.as_str() {
                            Some(key) => forget(ResetNotice::Key(&key)),
                            None => true,
                        },
                        Err(RecvError::Lagged(_)) => forget(ResetNotice::MaybeMissed),
                        Err(RecvError::Closed) => false,
                    },
                    // Down for a while: whatever was announced meanwhile went unheard.
                    reconnected = reconnections.recv() => match reconnected {
                        Ok(_) | Err(RecvError::Lagged(_)) => forget(ResetNotice::MaybeMissed),
                        Err(RecvError::Closed) => false,
                    },
                };
                if !go_on {
                    break;
                }
            }
            let _ = subscriber.quit().await;
        });
        Ok(())
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
    /// read at the last connection.
    pub fn warnings(&self) -> Vec<String> {
        self.connection.link.eviction().into_iter().collect()
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

// === impl Connection ===

impl Connection {
    /// The hash slot that routes a call for `checks` on Redis Cluster; `None` elsewhere.
    fn slot_of(&self, checks: &[LimitCheck<'_>]) -> Option<u16> {
        match self.topology {
            RedisTopology::Cluster => checks.first().map(|c| redis_keyslot(c.key.as_bytes())),
            _ => None,
        }
    }

    /// A script call of its own for one request (`timeout` as for [`run_script`](Self::run_script)).
    async fn run_one(
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

    /// Checks limits whose keys live in several hash slots (so possibly on several Cluster nodes), which no
    /// single script call may touch: all-or-nothing as one call would be.
    ///
    /// First every slot is asked in a dry run, concurrently, which decides without consuming; a denial there
    /// ends it. Only if every slot admits are the committing calls sent, again one per slot and concurrently.
    /// Between the dry run and the commit another request may take the room a slot had: that slot's commit then
    /// denies (each commit decides again, so no limit ever admits more than it allows), and the slots whose commit
    /// admitted give back what they took, on the window they took it from, before the answer is given. A commit
    /// that reaches Redis past the request's deadline counts nothing (see `run_script`), and one that failed is
    /// given back by no one: a call whose fate is unknown is never undone, lest a give-back free what was not
    /// taken.
    ///
    /// The commits and give-backs run in a task of their own, so that a request that stops waiting (its time ran
    /// out) never leaves one slot's commit standing while another's denied.
    async fn check_across_slots(
        self: Arc<Self>,
        checks: &[LimitCheck<'_>],
        groups: &[Vec<usize>],
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Result<Outcome, StoreError> {
        let subsets: Vec<Vec<LimitCheck<'_>>> = groups
            .iter()
            .map(|group| group.iter().map(|&i| checks[i]).collect())
            .collect();
        let deadline = self.deadline(now_ms, timeout);
        let dry_runs = join_all(subsets.iter().map(|subset| {
            let request = EncodedRequest::new(subset, Mode::DryRun);
            let slot = self.slot_of(subset);
            let connection = &self;
            async move {
                connection
                    .run_encoded(slot, &request, deadline, now_ms, timeout)
                    .await
                    .map(|(_, outcome)| outcome)
            }
        }))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        if !dry_runs.iter().all(|outcome| outcome.allowed) {
            return merge(checks.len(), groups, dry_runs);
        }
        let commits: Vec<(Option<u16>, EncodedRequest)> = subsets
            .iter()
            .map(|subset| {
                (
                    self.slot_of(subset),
                    EncodedRequest::new(subset, Mode::Commit),
                )
            })
            .collect();
        let (answer, decided) = tokio::sync::oneshot::channel();
        let connection = Arc::clone(&self);
        tokio::spawn(async move {
            let results = connection
                .commit_all_or_give_back(&commits, deadline, now_ms, timeout)
                .await;
            let _ = answer.send(results);
        });
        let commits = decided
            .await
            .map_err(|_| StoreError::Reply("the commits' task ended unanswered".to_owned()))?
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?;
        merge(checks.len(), groups, commits)
    }

    /// Commits every slot's share of one request, concurrently; unless all admitted, gives back what the
    /// admitting ones took. Each slot's outcome (or why its call failed), in order.
    async fn commit_all_or_give_back(
        &self,
        commits: &[(Option<u16>, EncodedRequest)],
        deadline: u64,
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Vec<Result<Outcome, StoreError>> {
        let results =
            join_all(commits.iter().map(|(slot, request)| {
                self.run_encoded(*slot, request, deadline, now_ms, timeout)
            }))
            .await;
        let all_admitted = results
            .iter()
            .all(|result| matches!(result, Ok((_, outcome)) if outcome.allowed));
        if !all_admitted {
            let give_backs = commits.iter().zip(&results).filter_map(|((slot, request), result)| {
                let (at, outcome) = result.as_ref().ok().filter(|(_, o)| o.allowed)?;
                let give_back = request.give_back(outcome.decisions.iter().map(|d| d.allowed));
                let at = u64::try_from(*at).unwrap_or(0);
                Some(async move {
                    let given = self
                        .run_encoded(*slot, &give_back, at, now_ms, GIVE_BACK_TIMEOUT)
                        .await;
                    if let Err(error) = given {
                        tracing::warn!(
                            %error,
                            "a denied request's share on another hash slot could not be given back"
                        );
                    }
                })
            });
            join_all(give_backs).await;
        }
        results
            .into_iter()
            .map(|result| {
                result.map(|(_, outcome)| {
                    if all_admitted {
                        return outcome;
                    }
                    // Given back: the request is denied and consumed nothing.
                    Outcome {
                        allowed: false,
                        ..outcome
                    }
                })
            })
            .collect()
    }

    /// The deadline, in Redis's ms, of a call that may take `timeout` from now (none for explicit times, a test's,
    /// or without a timeout).
    fn deadline(&self, now_ms: Option<i64>, timeout: Duration) -> u64 {
        if now_ms.is_none() && !timeout.is_zero() {
            self.clock.redis_ms(Instant::now() + timeout)
        } else {
            0
        }
    }

    /// A script call of its own for one encoded request on `slot`: the time it was decided at (Redis's ms), and
    /// its outcome.
    async fn run_encoded(
        &self,
        slot: Option<u16>,
        request: &EncodedRequest,
        deadline: u64,
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Result<(i64, Outcome), StoreError> {
        let (decided_at, mut outcomes) = self
            .run_script(
                self.pool.next(),
                slot,
                &[request],
                &[deadline],
                now_ms,
                timeout,
            )
            .await?;
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
    async fn run_script(
        &self,
        client: &Client,
        slot: Option<u16>,
        requests: &[&EncodedRequest],
        deadlines: &[u64],
        now_ms: Option<i64>,
        timeout: Duration,
    ) -> Result<(i64, Vec<Result<Outcome, StoreError>>), StoreError> {
        let runs = script::runs(requests);
        let command = script::command(&self.sha, now_ms, requests, deadlines, &runs);
        let reply = self.evalsha(client, slot, command, timeout).await?;
        let received = Instant::now();
        let reply = script::unpack_reply(&reply)?;
        let decided_at = reply.first().copied().unwrap_or_default();
        if now_ms.is_none() {
            self.clock.observe(decided_at, received);
        }
        Ok((decided_at, script::parse_reply(&reply, requests, &runs)?))
    }

    /// Runs the script by hash, loading it first when Redis does not know it (restart, `SCRIPT FLUSH`, failover).
    /// On Redis Cluster the load goes to every primary.
    ///
    /// A call that fails because its connection is down is tried once more on a connection of the pool that is up.
    async fn evalsha(
        &self,
        client: &Client,
        slot: Option<u16>,
        command: Vec<Value>,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        let result = Box::pin(eval_on(client, slot, command.clone(), timeout)).await;
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
                    Box::pin(eval_on(other, slot, command.clone(), timeout)).await,
                )
            }
            other => (client, other),
        };
        match result {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                Box::pin(self.script.load(client)).await?;
                Ok(Box::pin(eval_on(client, slot, command, timeout)).await?)
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
    fn follow_primary(&self, primary: &Server) {
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

    /// One call for the requests of `batch` that share a hash slot, given up at `deadline`.
    async fn run_batch_slot(&self, batch: Vec<Pending>, deadline: Instant) {
        let slot = batch.first().and_then(|pending| pending.slot);
        let requests: Vec<&EncodedRequest> = batch.iter().map(|p| &p.request).collect();
        let deadlines: Vec<u64> = batch
            .iter()
            .map(|p| self.clock.redis_ms(p.deadline))
            .collect();
        // At least a millisecond: zero would mean no timeout at all.
        let timeout = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let result = self
            .run_script(self.pool.next(), slot, &requests, &deadlines, None, timeout)
            .await;
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
const GIVE_BACK_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest wait between two attempts to reconnect, in ms: Redis answering again must not wait for a long backoff
/// (limiting is to be shared again within 300 ms of it), and an attempt that fails on loopback or a LAN costs one
/// refused connection or one refused `AUTH`.
const RECONNECT_CAP_MS: u32 = 100;
/// Random share of a wait between attempts, in ms (within the cap): the instances of a deployment, and the
/// connections of a pool, do not all knock at once on a Redis that just came back.
const RECONNECT_JITTER_MS: u32 = 50;

/// Distinct failure reasons logged per outage at most: each is news once, a Redis alternating between a few is
/// not worth a line each time, and a reason that changes on every call (it never should) cannot flood the log.
const MAX_LOGGED_REASONS: usize = 8;

/// A client builder for `config` with the gateway's connection settings, for the pool and the subscribers.
pub(crate) fn client_builder(config: FredConfig) -> Builder {
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
            // A Redis Cluster redirection fails the call (the request goes to `on_error`) instead of being
            // followed by fred: a MOVED still makes fred read the slot map again first, so the next call goes to
            // the slot's new node, but fred follows an ASK by writing ASKING on a connection other commands are
            // pipelined on and reading the next reply as its answer, which shifted every later reply on that
            // connection by one: every call on the moving slot timed out until a restart. Failing the few calls
            // of a slot between its keys' MIGRATE and its SETSLOT NODE costs less.
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

// === impl Link ===

impl Link {
    /// Follows the connection events of `clients`, and reads the eviction policy each time the first connects.
    fn listen(self: &Arc<Self>, clients: &[Client]) {
        if let Some(first) = clients.first() {
            let (link, client) = (Arc::clone(self), first.clone());
            let _checks = first.on_reconnect(move |_| {
                let (link, client) = (Arc::clone(&link), client.clone());
                async move {
                    link.check_eviction(&client).await;
                    Ok(())
                }
            });
        }
        for client in clients {
            let link = Arc::clone(self);
            let _errors = client.on_error(move |(error, server)| {
                link.failed(&error, server.as_ref());
                async { Ok(()) }
            });
            let link = Arc::clone(self);
            let _reconnects = client.on_reconnect(move |_| {
                link.set(None);
                link.log_recovery();
                async { Ok(()) }
            });
        }
    }

    /// Remembers why a connection failed, and logs it once per outage (with the limiter's failures: see
    /// [`RedisStore::log_failure`]). A connection that closed says nothing of why (Redis stopped, a network cut,
    /// `CLIENT KILL`): the next attempt to connect will, and meanwhile the cause already known stays.
    fn failed(&self, error: &Error, server: Option<&Server>) {
        let server = server.map_or_else(String::new, |s| format!(" ({s})"));
        tracing::debug!("redis connection failed{server}: {error}");
        if !closed_without_cause(error) {
            let cause = format!("{}{server}", plain_words(error.details()));
            self.log_failure(&cause, "");
            self.set(Some(cause));
        } else if self.lock().is_none() {
            self.set(Some(format!("connection to redis lost{server}")));
        }
    }

    /// Logs `reason` at WARN unless this outage logged it already; the outage's first line also says
    /// `consequence` (what requests get meanwhile), when given.
    fn log_failure(&self, reason: &str, consequence: &str) {
        let told = self.log().failure(reason, std::time::Instant::now());
        match (told, consequence.is_empty()) {
            (None, _) => {}
            (Some(Told::First), true) => tracing::warn!("redis failed: {reason}"),
            (Some(Told::First), false) => tracing::warn!("redis failed: {reason}; {consequence}"),
            (Some(Told::Still), _) => tracing::warn!("redis still failing: {reason}"),
        }
    }

    /// Ends the outage under way, if any, with one line.
    fn log_recovery(&self) {
        if let Some(lasted) = self.log().recovery(std::time::Instant::now()) {
            tracing::info!("redis answers again after {lasted:.1?}: limiting is shared again");
        }
    }

    fn log(&self) -> std::sync::MutexGuard<'_, OutageLog> {
        self.outage
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Reads `maxmemory` and `maxmemory-policy`: a policy that evicts, with a memory limit, may evict tollgate's
    /// keys (all of them have an expiry, so `volatile-*` policies may too), and a limit whose state is evicted
    /// starts afresh: it over-admits. Warned once per policy seen; a Redis that refuses `CONFIG` (an ACL, a managed
    /// service) is not asked again until it reconnects.
    async fn check_eviction(&self, client: &Client) {
        let args: Vec<Value> = ["GET", "maxmemory", "maxmemory-policy"]
            .into_iter()
            .map(Value::from)
            .collect();
        let command = CustomCommand::new_static("CONFIG", None, false);
        let settings: Result<HashMap<String, String>, _> = client.custom(command, args).await;
        let settings = match settings {
            Ok(settings) => settings,
            Err(error) => {
                tracing::debug!(%error, "cannot read redis's maxmemory-policy");
                return;
            }
        };
        let policy = settings.get("maxmemory-policy").map_or("", String::as_str);
        let limited = settings.get("maxmemory").is_some_and(|m| m != "0");
        let warning = (limited && !policy.is_empty() && policy != "noeviction").then(|| {
            format!(
                "maxmemory-policy {policy}: redis may evict limit state when full, and an evicted limit starts \
                 afresh (over-admits); use noeviction"
            )
        });
        let mut eviction = self
            .eviction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if warning != *eviction {
            if let Some(warning) = &warning {
                tracing::warn!("{warning}");
            }
            *eviction = warning;
        }
    }

    fn eviction(&self) -> Option<String> {
        self.eviction
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set(&self, cause: Option<String>) {
        *self.lock() = cause;
    }

    fn describe(&self) -> String {
        self.lock()
            .clone()
            .unwrap_or_else(|| "not connected to redis".to_owned())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // A panic elsewhere while holding it left a string: still a cause worth showing.
        self.cause
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// An I/O error as fred words it (`Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }`, the
/// `Debug` of the system's error) in the system's words (`Connection refused (os error 111)`), a resolver's
/// (`Custom { kind: Uncategorized, error: "failed to lookup address information: ..." }`) in its own; others
/// unchanged.
pub(crate) fn plain_words(details: &str) -> String {
    if let Some(custom) = details.strip_prefix("Custom {") {
        if let Some(start) = custom.find("error: \"") {
            let message = custom[start + 8..]
                .trim_end()
                .trim_end_matches('}')
                .trim_end();
            return message.trim_end_matches('"').replace("\\\"", "\"");
        }
    }
    let field = |name: &str| {
        let start = details.find(name)? + name.len();
        let rest = &details[start..];
        Some(&rest[..rest.find([',', '}'])?])
    };
    match (
        details.starts_with("Os {"),
        field("message: \""),
        field("code: "),
    ) {
        (true, Some(message), Some(code)) => {
            format!(
                "{} (os error {})",
                message.trim().trim_end_matches('"'),
                code.trim()
            )
        }
        _ => details.to_owned(),
    }
}

/// Whether `error` only says that a connection closed (or that a command met a closed one), not why.
fn closed_without_cause(error: &Error) -> bool {
    match error.kind() {
        ErrorKind::Canceled => true,
        ErrorKind::IO => {
            let details = error.details().to_ascii_lowercase();
            details.contains("closed")
                || details.contains("broken pipe")
                || details.contains("reset by peer")
        }
        _ => false,
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

/// The request's checks grouped by the hash slot of their keys (indices into `checks`, in order), or `None`
/// when all keys share one slot: the common case, then one script call covers them all.
fn slot_groups(checks: &[LimitCheck<'_>]) -> Option<Vec<Vec<usize>>> {
    let slot = |check: &LimitCheck<'_>| redis_keyslot(check.key.as_bytes());
    let first = slot(checks.first()?);
    if checks[1..].iter().all(|check| slot(check) == first) {
        return None;
    }
    let mut groups: Vec<(u16, Vec<usize>)> = Vec::new();
    for (i, check) in checks.iter().enumerate() {
        let slot = slot(check);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, members)) => members.push(i),
            None => groups.push((slot, vec![i])),
        }
    }
    Some(groups.into_iter().map(|(_, members)| members).collect())
}

/// Puts the per-slot outcomes back in the order of the request's checks; admitted only if every slot admitted.
fn merge(
    limits: usize,
    groups: &[Vec<usize>],
    outcomes: Vec<Outcome>,
) -> Result<Outcome, StoreError> {
    let mut decisions: Vec<Option<Decision>> = vec![None; limits];
    let mut allowed = true;
    for (group, outcome) in groups.iter().zip(outcomes) {
        allowed &= outcome.allowed;
        for (&i, decision) in group.iter().zip(outcome.decisions) {
            decisions[i] = Some(decision);
        }
    }
    let decisions = decisions
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| StoreError::Reply(format!("missing decisions for {limits} limits")))?;
    Ok(Outcome { allowed, decisions })
}

/// Polls every future concurrently and returns their outputs in order (the per-slot calls go to different
/// nodes: waiting for them one after another would add a round trip per slot).
async fn join_all<F: Future>(futures: impl Iterator<Item = F>) -> Vec<F::Output> {
    let mut pending: Vec<Pin<Box<F>>> = futures.map(Box::pin).collect();
    let mut outputs: Vec<Option<F::Output>> = pending.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut done = true;
        for (future, output) in pending.iter_mut().zip(outputs.iter_mut()) {
            if output.is_none() {
                match future.as_mut().poll(cx) {
                    Poll::Ready(value) => *output = Some(value),
                    Poll::Pending => done = false,
                }
            }
        }
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    outputs.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn outages_that_follow_each_other_closely_are_told_once() {
        use std::time::{Duration, Instant};
        let mut log = OutageLog::default();
        let start = Instant::now();
        let at = |ms| start + Duration::from_millis(ms);
        // A slot on the move: a failure, a success, a failure... every few milliseconds for a second.
        let mut lines = Vec::new();
        for i in 0..100 {
            lines.extend(
                log.failure("Too many redirections.", at(i * 10))
                    .map(|t| format!("{t:?}")),
            );
            lines.extend(log.recovery(at(i * 10 + 5)).map(|_| "recovered".to_owned()));
        }
        assert_eq!(lines, ["First", "recovered"]);
        // Another reason within the quiet time is told, with its end.
        assert_eq!(log.failure("OOM", at(2_000)), Some(Told::First));
        assert_eq!(log.failure("OOM", at(2_001)), None);
        assert_eq!(log.failure("READONLY", at(2_002)), Some(Told::Still));
        assert!(log.recovery(at(2_100)).is_some());
        // Past it, a new outage with an old reason is told again.
        assert_eq!(
            log.failure("Too many redirections.", at(12_200)),
            Some(Told::First)
        );
        assert_eq!(log.recovery(at(12_300)), Some(Duration::from_millis(100)));
    }

    use super::*;
    use crate::limiter::{Algorithm, Limit};

    fn limit() -> Limit {
        Limit::new(
            "l",
            Algorithm::FixedWindow {
                limit: 1,
                period_ms: 1_000,
            },
            1,
        )
        .expect("valid")
    }

    #[test]
    fn keys_sharing_a_hash_tag_need_one_call() {
        let limit = limit();
        let checks =
            ["p:r:a:{v}", "p:r:b:{v}", "p:r:c:{v}"].map(|key| LimitCheck { key, limit: &limit });
        assert_eq!(slot_groups(&checks), None);
        assert_eq!(slot_groups(&checks[..1]), None);
        assert_eq!(slot_groups(&[]), None);
    }

    #[test]
    fn keys_in_several_slots_are_grouped_in_request_order() {
        let limit = limit();
        let checks = ["p:r:a:{x}", "p:r:b:{y}", "p:r:c:{x}", "p:r:d:{z}"]
            .map(|key| LimitCheck { key, limit: &limit });
        assert_eq!(
            slot_groups(&checks),
            Some(vec![vec![0, 2], vec![1], vec![3]])
        );
    }

    #[test]
    fn merged_outcomes_keep_the_request_order_and_admit_only_if_every_slot_does() {
        let decision = |remaining| Decision {
            allowed: remaining > 0,
            limit: 9,
            remaining,
            retry_after_ms: 0,
            reset_after_ms: 0,
            delay_ms: 0,
        };
        let groups = vec![vec![0, 2], vec![1]];
        let outcomes = vec![
            Outcome {
                allowed: true,
                decisions: vec![decision(1), decision(3)],
            },
            Outcome {
                allowed: false,
                decisions: vec![decision(0)],
            },
        ];
        let merged = merge(3, &groups, outcomes).expect("complete");
        assert!(!merged.allowed);
        let remaining: Vec<u64> = merged.decisions.iter().map(|d| d.remaining).collect();
        assert_eq!(remaining, [1, 0, 3]);
        assert!(merge(3, &groups[..1], Vec::new()).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn join_all_runs_futures_concurrently_and_keeps_their_order() {
        let started = tokio::time::Instant::now();
        let outputs = join_all([30u64, 10, 20].into_iter().map(|ms| async move {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            ms
        }))
        .await;
        assert_eq!(outputs, [30, 10, 20]);
        // Paused clock: one after another would take 60 ms.
        assert_eq!(started.elapsed(), Duration::from_millis(30));
    }

    #[test]
    fn system_errors_are_told_in_the_systems_words() {
        assert_eq!(
            plain_words(
                r#"Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#
            ),
            "Connection refused (os error 111)"
        );
        let wrongpass = "WRONGPASS invalid username-password pair or user is disabled.";
        assert_eq!(plain_words(wrongpass), wrongpass);
        // An unresolvable host, as `tokio::net::lookup_host` fails and fred words it.
        assert_eq!(
            plain_words(
                r#"Custom { kind: Uncategorized, error: "failed to lookup address information: Name or service not known" }"#
            ),
            "failed to lookup address information: Name or service not known"
        );
    }

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
