//! The directory kept in Redis: records in one hash, a change counter counted with each write, an announcement
//! per change, and the checks that bring an instance back in step after a missed announcement or a reconnection.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::{Config as FredConfig, Options, ServerConfig};
use fred::types::scripts::Script;
use fred::types::CustomCommand;
use fred::util::redis_keyslot;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{watch, Notify};

use super::point::Point;
use super::record::ConsumerRecord;
use super::tables::Tables;
use super::{DirectoryError, Edit, Origin, View};
use crate::limiter::store::{client_builder, plain_words};

/// How often each instance compares the store's change counter with its own: a change whose announcement was
/// lost is read within this (plus one full read), well within the second a change may take to reach everyone.
const CHECK_EVERY: Duration = Duration::from_millis(250);
/// How long a read of the directory may take before it counts as failed (the next check tries again).
const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// Records asked for per page of a full read (a hint to HSCAN): a page of under half a MB, read in a millisecond
/// or two. Larger pages save little time and leave their larger buffers to the allocator.
const PAGE_FIELDS: &str = "2000";
/// Records parsed in one go during a full read, between turns for requests: about a millisecond.
const RECORDS_PER_TURN: usize = 500;
/// How long a change may wait for Redis before the admin call fails.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a change waits for a connection that is not up before failing.
const CONNECT_WAIT: Duration = Duration::from_millis(500);
/// Lookups of keys and records asked of Redis at once (before the first full read, and with a cache).
const LOOKUPS_AT_ONCE: usize = 32;
/// Attempts of one change against concurrent changes of the same record.
const WRITE_ATTEMPTS: usize = 8;

const READ_SCRIPT: &str = include_str!("scripts/read.lua");
// The scripts that change records keep the key index as they do: digests.lua's part, written once, comes first.
const WRITE_SCRIPT: &str = concat!(
    "#!lua\n",
    include_str!("scripts/digests.lua"),
    include_str!("scripts/write.lua")
);
const IMPORT_SCRIPT: &str = concat!(
    "#!lua\n",
    include_str!("scripts/digests.lua"),
    include_str!("scripts/import.lua")
);
const INDEX_SCRIPT: &str = include_str!("scripts/index.lua");
/// Keys indexed per call of the index script.
const INDEX_BATCH: usize = 5000;
/// Records per call of the import script: large enough that a million take a thousand calls, small enough that
/// one call holds Redis for a millisecond or so.
const IMPORT_BATCH: usize = 1000;
/// Keys asked for per call when checking whom keys belong to: a short hold of Redis each.
const HOLDERS_PER_CALL: usize = 1000;

/// The Redis side of a directory: a client for reads and writes, a subscriber for announcements, and the task
/// that keeps the view in step. The tasks end when this is dropped.
pub(super) struct RedisSync {
    redis: Arc<Redis>,
    /// Turns for lookups (before the first full read, and with a cache): a flood of requests asks Redis a bounded
    /// number of questions at once.
    lookups: tokio::sync::Semaphore,
    /// Dropped with the directory, which tells the tasks to stop.
    _stop: watch::Sender<()>,
}

/// What the tasks and the writers share.
struct Redis {
    client: Client,
    /// `<prefix>{consumers}`: the hash of records, field = consumer id, value = the record's JSON.
    records: String,
    /// `<prefix>{consumers}:version`: counted up by each change, atomically with it. Both keys share one hash tag,
    /// so that on Redis Cluster the scripts that touch both run on one node.
    version: String,
    /// `<prefix>{consumers}:lineage`: a random token set when the counter is created, so that a counter that
    /// starts again (a flush, a new empty Redis) is never taken for the one an instance read, whatever it counts.
    lineage: String,
    /// `<prefix>{consumers}:keys`: the index of runtime API keys, field = a key's SHA-256 in hex, value = the
    /// consumer id holding it; kept by the scripts that change records, so that a key is found without reading
    /// the whole directory.
    key_index: String,
    /// `<prefix>{consumers}:indexed`: set once the key index holds every record's keys.
    indexed: String,
    /// `<prefix>consumers:changed`: each change is announced there as `<version> <consumer id>`.
    channel: String,
    /// The hash slot of both keys on Redis Cluster (routes the scripts), `None` elsewhere.
    slot: Option<u16>,
    read: Script,
    write: Script,
    import: Script,
    index: Script,
    view: Arc<View>,
    /// Asks the sync task for a full read now.
    resync: Notify,
    /// Asks the sync task to compare the change counter now (a full read follows only if it moved: a full read
    /// already under way for the same change is not followed by a second).
    check_soon: Notify,
}

/// What the key index says of a key.
pub(super) enum KeyLookup {
    /// The key is this consumer's, whose record is this.
    Found(String, ConsumerRecord),
    /// No consumer holds it.
    Absent,
    /// The index cannot tell: not complete yet (a directory written before it), or behind its record.
    Unknown,
}

/// What a compare-and-set write did.
enum Written {
    /// The change is in, counted as this version of this lineage.
    At(u64, String),
    /// The record changed since it was read.
    Changed,
}

impl std::fmt::Debug for RedisSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSync")
            .field("records", &self.redis.records)
            .field("connected", &self.redis.client.is_connected())
            .finish()
    }
}

// === impl RedisSync ===

impl RedisSync {
    /// Starts connecting to `url` in the background, and the tasks that keep `view` in step with Redis.
    pub(super) fn start(url: &str, prefix: &str, view: Arc<View>) -> Result<Self, DirectoryError> {
        let unavailable = |error: Error| DirectoryError::Unavailable(plain_words(error.details()));
        let config = FredConfig::from_url(url).map_err(unavailable)?;
        let cluster = matches!(config.server, ServerConfig::Clustered { .. });
        let builder = client_builder(config);
        let client = builder.build().map_err(unavailable)?;
        let subscriber = builder.build_subscriber_client().map_err(unavailable)?;
        let records = format!("{prefix}{{consumers}}");
        let redis = Arc::new(Redis {
            client,
            slot: cluster.then(|| redis_keyslot(records.as_bytes())),
            version: format!("{records}:version"),
            lineage: format!("{records}:lineage"),
            key_index: format!("{records}:keys"),
            indexed: format!("{records}:indexed"),
            records,
            channel: format!("{prefix}consumers:changed"),
            read: Script::from_lua(READ_SCRIPT),
            write: Script::from_lua(WRITE_SCRIPT),
            import: Script::from_lua(IMPORT_SCRIPT),
            index: Script::from_lua(INDEX_SCRIPT),
            view,
            resync: Notify::new(),
            check_soon: Notify::new(),
        });
        // Shown from the start, so that an alert on any increase has a series to watch.
        metrics::counter!("tollgate_consumer_directory_resets_total").increment(0);
        let (stop, stopped) = watch::channel(());
        // Whatever was announced while disconnected went unheard, and the Redis may be another one (restarted
        // empty, failed over): read everything again on every connection.
        let weak = Arc::downgrade(&redis);
        let _reconnections = redis.client.on_reconnect(move |_| {
            if let Some(redis) = weak.upgrade() {
                redis.resync_after_reconnection();
            }
            async { Ok(()) }
        });
        let _connection = redis.client.connect();
        tokio::spawn(Arc::clone(&redis).keep_in_step(stopped.clone()));
        tokio::spawn(Arc::clone(&redis).follow_announcements(subscriber, stopped));
        Ok(Self {
            redis,
            lookups: tokio::sync::Semaphore::new(LOOKUPS_AT_ONCE),
            _stop: stop,
        })
    }

    /// Applies `edit` to `id`'s record in Redis, compare-and-set: read the record, write the edited one only if
    /// it is still what was read (else read again), counting the change; then applies it here and announces it.
    pub(super) async fn change<T>(
        &self,
        id: &str,
        replaces_unreadable: bool,
        mut edit: impl FnMut(Option<&ConsumerRecord>) -> Edit<T>,
    ) -> Result<(Option<ConsumerRecord>, T), DirectoryError> {
        let redis = &self.redis;
        // Just started, or reconnecting after a blip: worth a moment before failing the admin's call; a Redis that
        // is down fails it after this.
        connected(&redis.client, CONNECT_WAIT).await;
        for _ in 0..WRITE_ATTEMPTS {
            let (_, _, stored) = redis.read_one(id, WRITE_TIMEOUT).await?;
            let before = match stored
                .as_deref()
                .map(serde_json::from_str::<ConsumerRecord>)
            {
                None => None,
                Some(Ok(record)) => Some(record),
                Some(Err(_)) if replaces_unreadable => None,
                Some(Err(error)) => {
                    return Err(DirectoryError::Unreadable {
                        id: id.to_owned(),
                        reason: error.to_string(),
                    })
                }
            };
            let (after, outcome) = edit(before.as_ref())?;
            if after == before && (after.is_some() || stored.is_none()) {
                return Ok((before, outcome));
            }
            let json = match &after {
                Some(record) => serde_json::to_string(record)
                    .map_err(|error| DirectoryError::Unavailable(error.to_string()))?,
                None => String::new(),
            };
            match redis.write(id, stored.as_deref(), &json).await? {
                Written::At(version, lineage) => {
                    let lineage = Some(lineage.as_str());
                    if !redis
                        .view
                        .apply(id, after, (version, version), lineage, Origin::Written)
                    {
                        redis.resync.notify_one();
                    }
                    redis.announce(version, lineage, id).await;
                    return Ok((before, outcome));
                }
                Written::Changed => continue,
            }
        }
        Err(DirectoryError::Contended(id.to_owned()))
    }

    /// Looks up the runtime API key whose SHA-256 is `digest` (see [`Redis::look_up_key`]), in turn.
    pub(super) async fn look_up_key(&self, digest: &[u8; 32]) -> Result<KeyLookup, DirectoryError> {
        let _turn = self.turn().await?;
        self.redis.look_up_key(digest).await
    }

    /// Whom keys belong to by the key index (see [`Redis::key_holders`]).
    pub(super) async fn key_holders(
        &self,
        digests: &[[u8; 32]],
    ) -> Result<Option<Vec<Option<String>>>, DirectoryError> {
        // Asked by the admin calls that add keys (an import's first step): as they do, worth a moment at start.
        connected(&self.redis.client, CONNECT_WAIT).await;
        self.redis.key_holders(digests).await
    }

    /// Looks up consumer `id`'s record, in turn.
    pub(super) async fn look_up_consumer(
        &self,
        id: &str,
    ) -> Result<Option<ConsumerRecord>, DirectoryError> {
        let _turn = self.turn().await?;
        self.redis.look_up_consumer(id).await
    }

    /// A turn to ask Redis, waited for as long as a lookup may take (the connection too, at start).
    async fn turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, DirectoryError> {
        let client = &self.redis.client;
        let turn = async {
            connected(client, READ_TIMEOUT).await;
            self.lookups.acquire().await
        };
        match tokio::time::timeout(READ_TIMEOUT, turn).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(DirectoryError::Unavailable(
                "too many consumer directory lookups waiting".to_owned(),
            )),
        }
    }

    /// Writes `records` in batches of [`IMPORT_BATCH`], and counts them as one change with the last (or, when a
    /// batch fails, with a call of its own for those written before it): counting each batch would have every
    /// instance read the whole directory again after each. This instance then compares the counter at once and
    /// reads it again (once, even when a counter check had already begun to); the others see the counter move at
    /// their next check and do too.
    pub(super) async fn import(
        &self,
        records: Vec<(String, ConsumerRecord)>,
    ) -> Result<(), DirectoryError> {
        let redis = &self.redis;
        connected(&redis.client, CONNECT_WAIT).await;
        if records.is_empty() {
            return Ok(());
        }
        let batches = records.len().div_ceil(IMPORT_BATCH);
        let mut written = Ok(());
        for (number, batch) in records.chunks(IMPORT_BATCH).enumerate() {
            let last = number + 1 == batches;
            written = redis.import_batch(batch, last).await;
            if written.is_err() {
                break;
            }
        }
        if written.is_err() {
            // Whatever was written is counted, so that every instance reads it; the failure is still reported.
            let _ = redis.import_batch(&[], true).await;
        }
        written?;
        redis.check_soon.notify_one();
        Ok(())
    }
}

/// Waits at most `within` for `client` to be connected; whether it is. A command sent while it connects fails at
/// once (fail-fast), and fred's `wait_for_connect` is not enough at start: an admin call that came while the
/// client's first attempt had not begun failed at once (`tests/large_directory.rs`, with a fast build). So the
/// state is looked at, a few milliseconds apart, until it says connected.
async fn connected(client: &Client, within: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    while !client.is_connected() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    true
}

// === impl Redis ===

impl Redis {
    /// Compares the change counter with the snapshot's every [`CHECK_EVERY`], and reads everything when they
    /// differ or when asked (a reconnection, a change heard out of turn), until `stopped`.
    async fn keep_in_step(self: Arc<Self>, mut stopped: watch::Receiver<()>) {
        // The first check comes at once: on the first connection, not before it (a command sent while the client
        // connects fails at once).
        connected(&self.client, CONNECT_WAIT).await;
        let mut ticks = tokio::time::interval(CHECK_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing: Option<String> = None;
        loop {
            let full = tokio::select! {
                _ = stopped.changed() => break,
                _ = ticks.tick() => false,
                () = self.resync.notified() => true,
                () = self.check_soon.notified() => false,
            };
            let result = if full {
                self.read_again().await
            } else {
                self.check().await
            };
            match result {
                Ok(()) => {
                    if failing.take().is_some() {
                        tracing::info!("consumer directory read from redis again");
                    }
                }
                Err(reason) => {
                    // Redis being down is logged by the limiter's connections; a refusal (an ACL without the
                    // directory's keys, a record that is not JSON) is news, once per reason.
                    if failing.as_ref() != Some(&reason) {
                        if self.client.is_connected() {
                            tracing::warn!(%reason, "cannot read the consumer directory from redis; serving the last one read");
                        } else {
                            tracing::debug!(%reason, "cannot read the consumer directory from redis");
                        }
                        failing = Some(reason);
                    }
                }
            }
        }
        let _ = self.client.quit().await;
    }

    /// Asks for a full read after a (re)connection, when something was read before it: the first connection's
    /// read is the first counter check's, and a second one would read a large directory twice at start.
    fn resync_after_reconnection(&self) {
        if self.view.point.lock().last.is_some() {
            self.resync.notify_one();
        }
    }

    /// Reads everything when the change counter (its count or its lineage) is not the snapshot's.
    async fn check(&self) -> Result<(), String> {
        let reply = self
            .eval(&self.read, &["head", ""], READ_TIMEOUT)
            .await
            .map_err(|error| plain_words(error.details()))?;
        let Reply {
            version, lineage, ..
        } = Reply::split(reply)?;
        if self.view.point.lock().is_at(version, lineage.as_deref()) {
            return Ok(());
        }
        self.read_again().await
    }

    /// Brings the view to the store's present: a whole directory reads everything again; a cache forgets what it
    /// holds (records are read again as they are asked for), once the key index can answer for every key (a
    /// directory written before the index is read whole once, to index it).
    async fn read_again(&self) -> Result<(), String> {
        if self.view.cache.is_none() {
            return self.read_all().await;
        }
        let begun = self.view.begin_read();
        let reply = self
            .eval(&self.read, &["head", ""], READ_TIMEOUT)
            .await
            .map_err(|error| plain_words(error.details()))?;
        let Reply {
            version,
            lineage,
            indexed,
            ..
        } = Reply::split(reply)?;
        if !indexed {
            return self.read_all().await;
        }
        let point = Point::at(version, lineage.as_deref());
        let lost = self.view.replace_all(Arc::default(), point, &begun);
        self.noticed_loss(lost, 0);
        Ok(())
    }

    /// Replaces the snapshot with every record, read a page per call, and the change counter as the first page
    /// found it. A record that is not a record is left out, with a warning. A change made while the pages are read
    /// is in them or not, but it is announced, and counted past the snapshot's counter, so it is applied (or the
    /// whole read again) as any change is.
    async fn read_all(&self) -> Result<(), String> {
        let mut cursor = "0".to_owned();
        let mut start: Option<(u64, Option<String>, bool)> = None;
        // Packed as read: a full read never holds the records twice, however many there are. HSCAN may return a
        // field twice (the hash grew while it was scanned): the last one read stands.
        let mut tables = None;
        let begun = self.view.begin_read();
        loop {
            let reply = self
                .eval(&self.read, &["page", &cursor, PAGE_FIELDS], READ_TIMEOUT)
                .await
                .map_err(|error| plain_words(error.details()))?;
            let Reply {
                version,
                part: page,
                lineage,
                indexed,
                size,
            } = Reply::split(reply)?;
            if let Some((first, first_lineage, _)) = &start {
                if *first_lineage != lineage || version < *first {
                    // Flushed or replaced while being read: what was read may be of two directories.
                    return Err("the consumer directory was replaced while being read".to_owned());
                }
            } else {
                start = Some((version, lineage, indexed));
            }
            // Sized once for what the first page counts: tables that grew as they filled would leave their
            // smaller selves behind, freed but still held by the allocator.
            let tables =
                tables.get_or_insert_with(|| Arc::new(Tables::with_capacity(size.unwrap_or(0))));
            let mut page = page.into_array().into_iter();
            let (Some(next), Some(fields)) = (page.next(), page.next()) else {
                return Err("unexpected page from the directory's read script".to_owned());
            };
            // A page is tens of milliseconds of parsing: taken a slice at a time, each followed by a turn for the
            // requests on this thread, which must not wait behind a read (a million consumers are a hundred pages).
            for slice in fields.into_array().chunks(2 * RECORDS_PER_TURN) {
                take_page(tables, slice);
                tokio::task::yield_now().await;
            }
            cursor = next
                .as_string()
                .ok_or("unexpected cursor from the directory's read script")?;
            if cursor == "0" {
                break;
            }
        }
        let (Some((version, lineage, indexed)), Some(tables)) = (start, tables) else {
            return Err("the directory's read script answered no page".to_owned());
        };
        let count = tables.len();
        if !indexed {
            // A directory written before the key index: index what was just read (once, by whichever instance
            // reads it first), so that the next instance to start finds keys without reading it whole.
            self.index_keys(&tables, version, lineage.as_deref()).await;
        }
        // A cache keeps none of it: it was read to be indexed.
        let kept = if self.view.cache.is_some() {
            Arc::default()
        } else {
            tables
        };
        let lost = self
            .view
            .replace_all(kept, Point::at(version, lineage.as_deref()), &begun);
        self.noticed_loss(lost, count);
        tracing::debug!(
            consumers = count,
            version,
            "consumer directory read from redis"
        );
        Ok(())
    }

    /// Counts and logs a store found to have lost the `lost` consumers the tables held (it holds `count` now).
    fn noticed_loss(&self, lost: Option<usize>, count: usize) {
        if let Some(lost) = lost {
            self.view.count_reset();
            tracing::warn!(
                lost,
                consumers = count,
                "the consumer directory in redis lost its data (flushed, an empty redis, or a restart without \
                 persistence): runtime plans, overrides, blocks and keys are gone on every instance until \
                 re-seeded (PUT /consumers/{{id}}/record with the records kept from GET /consumers)"
            );
        }
    }

    /// Hears the announcements of changes, on a subscriber connection of its own, and re-reads each changed
    /// record; asks for a full read when announcements may have been missed. Until `stopped`.
    async fn follow_announcements(
        self: Arc<Self>,
        subscriber: fred::clients::SubscriberClient,
        mut stopped: watch::Receiver<()>,
    ) {
        let _connection = subscriber.connect();
        let _resubscriptions = subscriber.manage_subscriptions();
        let mut messages = subscriber.message_rx();
        let mut reconnections = subscriber.reconnect_rx();
        // Only a subscription that succeeded is made again on reconnection, so the first is retried until it
        // does (Redis may not be up yet). Meanwhile the counter checks keep the directory in step.
        loop {
            tokio::select! {
                _ = stopped.changed() => {
                    let _ = subscriber.quit().await;
                    return;
                }
                subscribed = subscriber.subscribe(self.channel.as_str()) => match subscribed {
                    Ok(()) => break,
                    Err(error) => {
                        tracing::debug!(%error, channel = %self.channel, "subscribing to directory changes failed; retrying");
                    }
                },
            }
            tokio::select! {
                _ = stopped.changed() => {
                    let _ = subscriber.quit().await;
                    return;
                }
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
        loop {
            tokio::select! {
                _ = stopped.changed() => break,
                message = messages.recv() => match message {
                    Ok(message) => {
                        if let Some(text) = message.value.as_string() {
                            self.heard(&text).await;
                        }
                    }
                    Err(RecvError::Lagged(_)) => self.resync.notify_one(),
                    Err(RecvError::Closed) => break,
                },
                reconnected = reconnections.recv() => match reconnected {
                    Ok(_) | Err(RecvError::Lagged(_)) => self.resync_after_reconnection(),
                    Err(RecvError::Closed) => break,
                },
            }
        }
        let _ = subscriber.quit().await;
    }

    /// Re-reads the record an announcement (`<version> <consumer id>`) names, and applies it.
    async fn heard(&self, announcement: &str) {
        let Some((change, announced_lineage, id)) = parse_announcement(announcement) else {
            tracing::debug!(announcement, "not a directory change announcement; ignored");
            return;
        };
        let current = self.view.point.lock().clone();
        if current.lineage.as_deref() == Some(announced_lineage)
            && current.version.is_some_and(|applied| change <= applied)
        {
            // This instance's own change, or one a full read already brought.
            return;
        }
        let applied = match self.read_one(id, READ_TIMEOUT).await {
            Ok((version, lineage, Some(json))) => {
                match serde_json::from_str::<ConsumerRecord>(&json) {
                    Ok(record) => self.view.apply(
                        id,
                        Some(record),
                        (change, version),
                        lineage.as_deref(),
                        Origin::Heard,
                    ),
                    Err(error) => {
                        tracing::warn!(consumer = %id, %error, "a consumer's record in redis is not a record; ignored");
                        self.view.apply(
                            id,
                            None,
                            (change, version),
                            lineage.as_deref(),
                            Origin::Heard,
                        )
                    }
                }
            }
            Ok((version, lineage, None)) => self.view.apply(
                id,
                None,
                (change, version),
                lineage.as_deref(),
                Origin::Heard,
            ),
            // The counter checks will bring the change.
            Err(_) => false,
        };
        if !applied {
            self.resync.notify_one();
        }
    }

    /// The change counter, its lineage and `id`'s record as stored (its JSON, `None` when there is none), read in
    /// one step.
    async fn read_one(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<(u64, Option<String>, Option<String>), DirectoryError> {
        let reply = self
            .eval(&self.read, &["one", id], timeout)
            .await
            .map_err(|error| self.unavailable(&error))?;
        let Reply {
            version,
            part: record,
            lineage,
            ..
        } = Reply::split(reply).map_err(DirectoryError::Unavailable)?;
        Ok((version, lineage, record.as_string()))
    }

    /// Looks up the runtime API key whose SHA-256 is `digest` in the key index, and its consumer's record.
    async fn look_up_key(&self, digest: &[u8; 32]) -> Result<KeyLookup, DirectoryError> {
        let hex = crate::consumers::digest_hex(digest);
        let reply = self
            .eval(&self.read, &["key", &hex], READ_TIMEOUT)
            .await
            .map_err(|error| self.unavailable(&error))?;
        let Reply { part, indexed, .. } =
            Reply::split(reply).map_err(DirectoryError::Unavailable)?;
        let mut part = part.into_array().into_iter();
        let (id, json) = (
            part.next().and_then(|id| id.as_string()),
            part.next().and_then(|json| json.as_string()),
        );
        let record = json.and_then(|json| serde_json::from_str::<ConsumerRecord>(&json).ok());
        Ok(match (id, record) {
            // The index is a pointer; the record is the truth (an index written before a change is not).
            (Some(id), Some(record)) if record.key_digests().any(|held| held == *digest) => {
                KeyLookup::Found(id, record)
            }
            (None, _) if indexed => KeyLookup::Absent,
            _ => KeyLookup::Unknown,
        })
    }

    /// The consumers whose records hold each of the keys whose SHA-256 are `digests` (`None` for a key none
    /// holds), by the key index; `None` when the index cannot tell (a directory written before it).
    pub(super) async fn key_holders(
        &self,
        digests: &[[u8; 32]],
    ) -> Result<Option<Vec<Option<String>>>, DirectoryError> {
        let mut holders = Vec::with_capacity(digests.len());
        for chunk in digests.chunks(HOLDERS_PER_CALL) {
            let hex: Vec<String> = chunk.iter().map(crate::consumers::digest_hex).collect();
            let mut args = vec!["holders"];
            args.extend(hex.iter().map(String::as_str));
            let reply = self
                .eval(&self.read, &args, READ_TIMEOUT)
                .await
                .map_err(|error| self.unavailable(&error))?;
            let Reply { part, indexed, .. } =
                Reply::split(reply).map_err(DirectoryError::Unavailable)?;
            if !indexed {
                return Ok(None);
            }
            holders.extend(part.into_array().into_iter().map(|id| id.as_string()));
        }
        Ok(Some(holders))
    }

    /// Looks up consumer `id`'s record: `None` when it has none.
    async fn look_up_consumer(&self, id: &str) -> Result<Option<ConsumerRecord>, DirectoryError> {
        let (_, _, json) = self.read_one(id, READ_TIMEOUT).await?;
        Ok(json.and_then(|json| serde_json::from_str(&json).ok()))
    }

    /// Writes the key index of a directory written before it existed, from `records` read whole at change
    /// `version` of `lineage`; gives up (for the next full read) when the directory changes meanwhile.
    async fn index_keys(&self, tables: &Tables, version: u64, lineage: Option<&str>) {
        let mut pairs: Vec<(String, String)> = Vec::new();
        tables.for_each_key(|digest, id| {
            pairs.push((crate::consumers::digest_hex(&digest), id.to_owned()));
        });
        let version = version.to_string();
        let lineage = lineage.unwrap_or_default();
        let batches = pairs.len().div_ceil(INDEX_BATCH).max(1);
        for number in 0..batches {
            let batch = pairs.iter().skip(number * INDEX_BATCH).take(INDEX_BATCH);
            let last = if number + 1 == batches {
                "last"
            } else {
                "more"
            };
            let mut args = vec![version.as_str(), lineage, last];
            args.extend(batch.flat_map(|(digest, id)| [digest.as_str(), id.as_str()]));
            match self.eval(&self.index, &args, WRITE_TIMEOUT).await {
                Ok(Value::Integer(1)) => {}
                Ok(_) => return,
                Err(error) => {
                    tracing::debug!(error = %error.details(), "indexing the consumer directory's keys failed; the next full read tries again");
                    return;
                }
            }
        }
        tracing::info!(
            keys = pairs.len(),
            "indexed the runtime API keys of a consumer directory written before the key index"
        );
    }

    /// Writes `json` as `id`'s record (deletes it when empty) if the record stored is still `stored`.
    async fn write(
        &self,
        id: &str,
        stored: Option<&str>,
        json: &str,
    ) -> Result<Written, DirectoryError> {
        let expect = match stored {
            None => ["absent", ""],
            Some(stored) => ["is", stored],
        };
        let fresh = super::record::lineage_token()?;
        let reply = self
            .eval(
                &self.write,
                &[id, expect[0], expect[1], json, &fresh],
                WRITE_TIMEOUT,
            )
            .await
            .map_err(|error| self.unavailable(&error))?;
        if reply.as_i64().is_some() {
            return Ok(Written::Changed);
        }
        let unexpected = || {
            DirectoryError::Unavailable(format!(
                "unexpected reply from the directory's write script: {reply:?}"
            ))
        };
        let parts = reply.clone().into_array();
        match parts.as_slice() {
            [Value::Integer(version), lineage] if *version > 0 => {
                let lineage = lineage.as_string().ok_or_else(unexpected)?;
                Ok(Written::At(version.unsigned_abs(), lineage))
            }
            _ => Err(unexpected()),
        }
    }

    /// Writes one batch of an import; `count`s the import as a change when it is the last.
    async fn import_batch(
        &self,
        batch: &[(String, ConsumerRecord)],
        count: bool,
    ) -> Result<(), DirectoryError> {
        let mut args: Vec<String> = Vec::with_capacity(2 + batch.len() * 2);
        args.push(if count { "count" } else { "hold" }.to_owned());
        args.push(super::record::lineage_token()?);
        for (id, record) in batch {
            args.push(id.clone());
            args.push(
                serde_json::to_string(record)
                    .map_err(|error| DirectoryError::Unavailable(error.to_string()))?,
            );
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.eval(&self.import, &args, WRITE_TIMEOUT)
            .await
            .map_err(|error| self.unavailable(&error))?;
        Ok(())
    }

    /// Tells every instance that change `version` was to `id`'s record. The change is made whatever happens here:
    /// an instance that does not hear of it reads it at its next counter check.
    async fn announce(&self, version: u64, lineage: Option<&str>, id: &str) {
        let options = Options {
            fail_fast: true,
            timeout: Some(WRITE_TIMEOUT),
            ..Default::default()
        };
        let announced: Result<i64, _> = self
            .client
            .with_options(&options)
            .publish(
                &self.channel,
                format!("{version}:{} {id}", lineage.unwrap_or_default()),
            )
            .await;
        if let Err(error) = announced {
            tracing::warn!(%error, channel = %self.channel, "directory change not announced; other instances read it within a second");
        }
    }

    /// Runs `script` on the directory's keys with `args`, failing at once while disconnected and after
    /// `timeout`; loads it first when Redis does not know it (a new, restarted or failed-over Redis).
    async fn eval(
        &self,
        script: &Script,
        args: &[&str],
        timeout: Duration,
    ) -> Result<Value, Error> {
        let mut command: Vec<Value> = Vec::with_capacity(7 + args.len());
        command.push(Value::from(script.sha1().clone()));
        command.push(Value::Integer(5));
        command.push(Value::from(self.records.as_str()));
        command.push(Value::from(self.version.as_str()));
        command.push(Value::from(self.lineage.as_str()));
        command.push(Value::from(self.key_index.as_str()));
        command.push(Value::from(self.indexed.as_str()));
        command.extend(args.iter().map(|arg| Value::from(*arg)));
        let client = self.client.with_options(&Options {
            fail_fast: true,
            timeout: Some(timeout),
            ..Default::default()
        });
        let evalsha = || CustomCommand::new("EVALSHA", self.slot, false);
        match client
            .custom::<Value, Value>(evalsha(), command.clone())
            .await
        {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                script.load(&self.client).await?;
                client.custom(evalsha(), command).await
            }
            Err(error) if error.details().contains("READONLY") => {
                // A Sentinel failover demoted the server this client writes to: reconnecting asks for the new
                // primary.
                let client = self.client.clone();
                tokio::spawn(async move { client.force_reconnection().await });
                Err(error)
            }
            other => other,
        }
    }

    fn unavailable(&self, error: &Error) -> DirectoryError {
        let words = plain_words(error.details());
        DirectoryError::Unavailable(if self.client.is_connected() || !words.is_empty() {
            format!("redis: {words}")
        } else {
            "not connected to redis".to_owned()
        })
    }
}

/// Puts part of a page of a full read (consumer id, record JSON, consumer id...) into `tables`, leaving out with a warning
/// each record that is not one.
fn take_page(tables: &Tables, fields: &[Value]) {
    for pair in fields.chunks_exact(2) {
        let (Some(id), Some(json)) = (pair[0].as_str(), pair[1].as_str()) else {
            continue;
        };
        match serde_json::from_str::<ConsumerRecord>(&json) {
            Ok(record) => tables.set(&id, Some(&record)),
            Err(error) => tracing::warn!(
                consumer = %id,
                %error,
                "a consumer's record in redis is not a record; ignored until replaced or deleted"
            ),
        }
    }
}

/// An announcement, `<version>:<lineage> <consumer id>`: the change, the lineage it counts in, the consumer.
fn parse_announcement(announcement: &str) -> Option<(u64, &str, &str)> {
    let (change, id) = announcement.split_once(' ')?;
    let (version, lineage) = change.split_once(':')?;
    Some((version.parse().ok()?, lineage, id))
}

/// A read script's reply.
struct Reply {
    /// The change counter.
    version: u64,
    /// What the call asked for: a page, a record, a key's consumer and record.
    part: Value,
    /// The counter's lineage, when it has one.
    lineage: Option<String>,
    /// Whether the key index holds every record's keys.
    indexed: bool,
    /// How many records there are (with the first page).
    size: Option<usize>,
}

impl Reply {
    fn split(reply: Value) -> Result<Self, String> {
        let mut parts = reply.into_array().into_iter();
        let (Some(version), Some(part), lineage, indexed, size) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err("unexpected reply from the directory's read script".to_owned());
        };
        let version = match &version {
            Value::Integer(number) => u64::try_from(*number).ok(),
            other => other.as_str().and_then(|text| text.parse().ok()),
        }
        .ok_or_else(|| format!("the directory's change counter is not a number: {version:?}"))?;
        Ok(Self {
            version,
            part,
            lineage: lineage.and_then(|lineage| lineage.as_string()),
            indexed: indexed.and_then(|indexed| indexed.as_i64()) == Some(1),
            size: size
                .and_then(|size| size.as_u64())
                .and_then(|size| usize::try_from(size).ok()),
        })
    }
}
