//! The runtime consumer directory: what the admin API sets per consumer (plan, overrides, blocked, API keys),
//! read by every request, kept in this process or shared by every instance through Redis.

mod cache;
mod point;
mod record;
#[cfg(feature = "redis")]
mod redis;
mod stored;
mod tables;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use thiserror::Error;

use self::cache::{Absent, Recency};
use self::point::Point;
pub use self::record::{ConsumerRecord, KeyRecord, LimitOverride, RandomError, KEY_PREFIX};
#[cfg(feature = "redis")]
use self::redis::{KeyLookup, RedisSync};
pub use self::stored::StoredRecord;
use self::tables::Tables;
use crate::limiter::{BackendKind, StoreSettings};

/// The consumers' runtime settings. Requests read them ([`record`](Self::record), [`key_owner`](Self::key_owner))
/// under a shard's read lock; changes ([`put`](Self::put) and the others) edit them in place.
///
/// In memory, changes apply to this process only. On Redis they are written there first (and fail when Redis
/// cannot take them), then reach every instance sharing the Redis within a second: each hears the change
/// announced and re-reads that record, and checks the store's change counter a few times a second, reading
/// everything again when it missed a change (a lost message, a reconnection, a Redis restarted empty).
pub struct Directory {
    view: Arc<View>,
    store: Store,
}

/// Why a change could not be made.
#[derive(Debug, Error)]
pub enum DirectoryError {
    /// Redis did not take the change (down, timed out, refused it): nothing changed.
    #[error("the consumer directory is unavailable: {0}")]
    Unavailable(String),
    /// The consumer's record in Redis is not a record (written by hand?): only deleting it is possible.
    #[error("the stored record of consumer {id:?} cannot be read ({reason}); delete it first")]
    Unreadable { id: String, reason: String },
    /// Other writers kept changing the same record while this change was tried.
    #[error("consumer {0:?} changed concurrently too many times; try again")]
    Contended(String),
    /// The settings name Redis, and this build has no Redis store (the `redis` feature is off).
    #[error(
        "store.backend is redis, but this build has no redis store (the `redis` feature is off)"
    )]
    NoRedis,
    /// No random key could be made.
    #[error(transparent)]
    Random(#[from] RandomError),
}

/// What the directory knows of a key or of a consumer's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known<T> {
    /// It is this.
    Is(T),
    /// There is none.
    None,
    /// Not read: the directory in Redis is still being read whole (at start), or holds only some consumers
    /// (`consumers.cache`), and this was not looked up.
    Unread,
}

/// The records readers see, the moment of the store they are complete for, and the lock writers take to change
/// them one at a time.
// Without Redis, the directory is in memory: always complete, never a cache.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug, Default)]
struct View {
    /// Every record read: changed in place by each change, replaced whole by each full read.
    tables: ArcSwap<Tables>,
    point: parking_lot::Mutex<Point>,
    /// Whether `point` has a version (the tables hold every record of the store): read by every request.
    complete: AtomicBool,
    replacing: parking_lot::Mutex<()>,
    /// Times the store was found to have lost what had been read from it.
    resets: AtomicU64,
    /// The keys and consumers looked up lately and found to have no record (all are known after a full read).
    absent: parking_lot::Mutex<Absent>,
    /// Told when the directory is read (whole, or for a cache, when Redis's key index can answer).
    read_whole: tokio::sync::Notify,
    /// With `consumers.cache`: the most recently used consumers are kept, the others looked up when asked for.
    cache: Option<Recency>,
    /// The last changes applied, which a full read begun before them must not undo (see `replace_all`).
    recent: parking_lot::Mutex<Recent>,
}

/// The last changes applied, and how many were applied in all: a full read notes the count as it begins.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug, Default)]
struct Recent {
    changes: Vec<Applied>,
    count: u64,
}

/// A change applied to the tables: `id`'s record as of change `change` of `lineage`, the `order`th applied.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug)]
struct Applied {
    id: Box<str>,
    record: Option<ConsumerRecord>,
    change: u64,
    lineage: Option<Arc<str>>,
    order: u64,
    origin: Origin,
}

/// What a full read notes as it begins: how many changes were applied so far, and the moment the tables were then
/// complete for. A loss is judged against that moment: changes applied while the read is under way may take the
/// tables past the moment it reads, and that is no loss.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug)]
struct ReadBegun {
    changes: u64,
    point: Point,
}

/// Where a change applied to the tables comes from.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// This instance wrote it: when the write returned, it was the store's newest state of the record.
    Written,
    /// Another instance announced it, and the record was read from the store: as of a moment that may be before
    /// or after the tables' own.
    Heard,
}

/// Changes kept for the next full read at most: a read outlived by more than this many changes has missed
/// announcements as well, and another read follows it.
#[cfg(feature = "redis")]
const RECENT_CHANGES: usize = 64;

#[cfg(feature = "redis")]
/// How long a request whose key the index cannot tell (a directory written before the index) waits for the
/// first full read before it is answered 503.
const READ_WHOLE_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// Where changes are made.
#[derive(Debug)]
enum Store {
    Memory,
    #[cfg(feature = "redis")]
    Redis(RedisSync),
}

/// What a change does to a record: the record after from the record before (`None`: there is none), and what
/// the caller learns.
type Edit<T> = Result<(Option<ConsumerRecord>, T), DirectoryError>;

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("store", &self.store)
            .field("consumers", &self.len())
            .field("version", &self.view.point.lock().version)
            .finish()
    }
}

// === impl Directory ===

impl Directory {
    /// A directory kept in this process only.
    pub fn in_memory() -> Arc<Self> {
        Arc::new(Self {
            view: Arc::default(),
            store: Store::Memory,
        })
    }

    /// A directory kept in the Redis that `store` names (its URL, topology and credentials), under its
    /// `key_prefix`. Connects in the background, and keeps reconnecting for as long as the directory lives;
    /// until the first read it holds no consumer. Must be called within a tokio runtime; fails only for a URL
    /// that names no Redis.
    #[cfg(feature = "redis")]
    pub fn redis(store: &StoreSettings) -> Result<Arc<Self>, DirectoryError> {
        Self::on_redis(store, None)
    }

    /// A directory kept in Redis as [`redis`](Self::redis), holding at most `capacity` consumers in memory, the
    /// most recently used: the others are looked up in Redis when a request names them (one lookup, then held),
    /// and a key Redis has no consumer for is remembered as such for a few seconds. Ready once Redis's key index
    /// answers, whatever the directory's size.
    #[cfg(feature = "redis")]
    pub fn redis_cached(
        store: &StoreSettings,
        capacity: usize,
    ) -> Result<Arc<Self>, DirectoryError> {
        Self::on_redis(store, Some(capacity.max(1)))
    }

    #[cfg(feature = "redis")]
    fn on_redis(store: &StoreSettings, cache: Option<usize>) -> Result<Arc<Self>, DirectoryError> {
        let view = Arc::new(View {
            cache: cache.map(Recency::new),
            ..View::default()
        });
        let sync = RedisSync::start(&store.url, &store.key_prefix, Arc::clone(&view))?;
        Ok(Arc::new(Self {
            view,
            store: Store::Redis(sync),
        }))
    }

    /// The directory that goes with the limiter `store` describes: in Redis when limits are, else in memory.
    pub fn from_settings(store: &StoreSettings) -> Result<Arc<Self>, DirectoryError> {
        Self::from_settings_cached(store, None)
    }

    /// [`from_settings`](Self::from_settings), holding at most `cache` consumers in memory when it is in Redis
    /// ([`redis_cached`](Self::redis_cached); `consumers.cache`).
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub fn from_settings_cached(
        store: &StoreSettings,
        cache: Option<usize>,
    ) -> Result<Arc<Self>, DirectoryError> {
        match store.backend {
            #[cfg(feature = "redis")]
            BackendKind::Redis => Self::on_redis(store, cache),
            #[cfg(not(feature = "redis"))]
            BackendKind::Redis => Err(DirectoryError::NoRedis),
            BackendKind::Memory => Ok(Self::in_memory()),
        }
    }

    /// The runtime settings of consumer `id`, if any.
    pub fn consumer(&self, id: &str) -> Option<ConsumerRecord> {
        self.view
            .tables
            .load()
            .consumer(id)
            .map(|record| record.record())
    }

    /// The consumer owning the runtime-issued API key whose SHA-256 is `digest`.
    pub fn consumer_of_key(&self, digest: &[u8; 32]) -> Option<Arc<str>> {
        match self.key_owner(digest) {
            Known::Is(id) => Some(id),
            Known::None | Known::Unread => None,
        }
    }

    /// Whom the runtime API key whose SHA-256 is `digest` names, or [`Known::Unread`] while the directory is
    /// being read and the key has not been looked up ([`read_through_key`](Self::read_through_key)).
    pub fn key_owner(&self, digest: &[u8; 32]) -> Known<Arc<str>> {
        match self.view.tables.load().holder_of_key(digest) {
            // The id as callers carry it, shared from here on.
            Some(holder) => Known::Is(Arc::from(holder.id())),
            None if self.holds_all() || self.view.absent.lock().key(digest) => Known::None,
            None => Known::Unread,
        }
    }

    /// Consumer `id`'s runtime record, or [`Known::Unread`] while the directory is being read and `id` has not
    /// been looked up ([`read_through_consumer`](Self::read_through_consumer)).
    pub fn record(&self, id: &str) -> Known<StoredRecord> {
        match self.view.tables.load().consumer(id) {
            Some(record) => Known::Is(record),
            None if self.holds_all() || self.view.absent.lock().consumer(id) => Known::None,
            None => Known::Unread,
        }
    }

    /// Whether every record is in memory: always in the in-process directory, on Redis once read whole (never
    /// with `consumers.cache`). Where not, what is not there is looked up.
    pub fn holds_all(&self) -> bool {
        self.view.cache.is_none() && self.synced()
    }

    /// Looks up the key whose SHA-256 is `digest` in Redis, before the directory is read whole: afterwards
    /// [`key_owner`](Self::key_owner) knows it. When the key index cannot tell (a directory written before it),
    /// waits for the whole directory instead, a few seconds at most. Fails when Redis does not answer.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub async fn read_through_key(&self, digest: &[u8; 32]) -> Result<(), DirectoryError> {
        match &self.store {
            Store::Memory => Ok(()),
            #[cfg(feature = "redis")]
            Store::Redis(sync) => match counted(sync.look_up_key(digest).await)? {
                KeyLookup::Found(id, record) => {
                    self.view.learn(&id, record);
                    Ok(())
                }
                KeyLookup::Absent => {
                    self.view.absent.lock().remember_key(*digest);
                    Ok(())
                }
                KeyLookup::Unknown => self.until_read_whole().await,
            },
        }
    }

    /// Looks up consumer `id`'s record in Redis, before the directory is read whole: afterwards
    /// [`record`](Self::record) knows it. Fails when Redis does not answer.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    pub async fn read_through_consumer(&self, id: &str) -> Result<(), DirectoryError> {
        match &self.store {
            Store::Memory => Ok(()),
            #[cfg(feature = "redis")]
            Store::Redis(sync) => {
                match counted(sync.look_up_consumer(id).await)? {
                    Some(record) => self.view.learn(id, record),
                    None => self.view.absent.lock().remember_consumer(id),
                }
                Ok(())
            }
        }
    }

    /// Which consumer holds each of the runtime API keys whose SHA-256 are `digests` (`None` for a key none
    /// holds): what a record's keys are checked against before it is set. On Redis the store answers (a cache
    /// holds only some of the records, and another instance may have just set one); for a directory written
    /// before the key index, this instance answers once it has read it whole.
    pub async fn key_holders(
        &self,
        digests: &[[u8; 32]],
    ) -> Result<Vec<Option<Arc<str>>>, DirectoryError> {
        #[cfg(feature = "redis")]
        if let Store::Redis(sync) = &self.store {
            match sync.key_holders(digests).await? {
                Some(holders) => {
                    return Ok(holders
                        .into_iter()
                        .map(|holder| holder.map(Arc::from))
                        .collect());
                }
                None if !self.holds_all() => self.until_read_whole().await?,
                None => {}
            }
        }
        Ok(digests
            .iter()
            .map(|digest| self.consumer_of_key(digest))
            .collect())
    }

    /// Waits until the directory is read whole, [`READ_WHOLE_WAIT`] at most.
    #[cfg(feature = "redis")]
    async fn until_read_whole(&self) -> Result<(), DirectoryError> {
        let read = self.view.read_whole.notified();
        tokio::pin!(read);
        read.as_mut().enable();
        if self.synced() {
            return Ok(());
        }
        tokio::time::timeout(READ_WHOLE_WAIT, read)
            .await
            .map_err(|_| {
                DirectoryError::Unavailable("the consumer directory is still being read".to_owned())
            })
    }

    /// The runtime records in order of consumer id, those after `after` (all when `None`), at most `limit`: a page
    /// of the listing an operator keeps as a backup.
    pub fn records(&self, after: Option<&str>, limit: usize) -> Vec<(String, ConsumerRecord)> {
        self.view.tables.load().page(after, limit)
    }

    /// How many consumers have runtime settings.
    pub fn len(&self) -> usize {
        self.view.tables.load().len()
    }

    /// Consumer `id`'s runtime settings, read from Redis when they are not in memory (a cache, or a directory
    /// still being read).
    pub async fn read(&self, id: &str) -> Result<Option<ConsumerRecord>, DirectoryError> {
        match &self.store {
            #[cfg(feature = "redis")]
            Store::Redis(sync) if !self.holds_all() => sync.look_up_consumer(id).await,
            _ => Ok(self.consumer(id)),
        }
    }

    /// How many consumers the directory holds in memory at most, when it holds only some (`consumers.cache`).
    pub fn cache_capacity(&self) -> Option<usize> {
        self.view.cache.as_ref().map(Recency::capacity)
    }

    /// Whether no consumer has runtime settings.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the directory holds what the store holds as of some moment: always in memory; on Redis once a
    /// full read succeeded (and while no change is known to be missed).
    pub fn synced(&self) -> bool {
        match self.store {
            Store::Memory => true,
            #[cfg(feature = "redis")]
            Store::Redis(_) => self.view.complete.load(Ordering::Acquire),
        }
    }

    /// How many times the store was found to have lost the directory (flushed, replaced by an empty Redis,
    /// restarted without persistence, or restored from an older save) since this directory started: each is
    /// logged at WARN and counted in `tollgate_consumer_directory_resets_total`.
    pub fn resets(&self) -> u64 {
        self.view.resets.load(Ordering::Relaxed)
    }

    /// Sets `id`'s plan, overrides and blocked flag to `record`'s; the consumer's keys stay as they are (`record`'s
    /// are ignored). Returns the record before, if any.
    pub async fn put(
        &self,
        id: &str,
        record: ConsumerRecord,
    ) -> Result<Option<ConsumerRecord>, DirectoryError> {
        let (before, ()) = self
            .change(id, false, |before| {
                let keys = before.map(|b| b.keys.clone()).unwrap_or_default();
                Ok((
                    Some(ConsumerRecord {
                        keys,
                        ..record.clone()
                    }),
                    (),
                ))
            })
            .await?;
        Ok(before)
    }

    /// Replaces `id`'s whole record with `record`, keys included (their digests): re-seeds a directory from a
    /// listing kept as a backup. Returns the record before, if any.
    pub async fn restore(
        &self,
        id: &str,
        record: ConsumerRecord,
    ) -> Result<Option<ConsumerRecord>, DirectoryError> {
        let (before, ()) = self
            .change(id, true, |_| Ok((Some(record.clone()), ())))
            .await?;
        Ok(before)
    }

    /// Removes `id`'s runtime settings and keys (back to what the config and its credential say). Returns the
    /// record before, if any.
    pub async fn delete(&self, id: &str) -> Result<Option<ConsumerRecord>, DirectoryError> {
        let (before, ()) = self.change(id, true, |_| Ok((None, ()))).await?;
        Ok(before)
    }

    /// Issues a new random API key for `id` (creating its record if it has none): returns the key's record and
    /// the key itself, which is not kept anywhere (only its SHA-256 is) and must be shown to the caller now.
    pub async fn add_key(&self, id: &str) -> Result<(KeyRecord, String), DirectoryError> {
        let mut issued = None;
        self.change(id, false, |before| {
            let mut record = before.cloned().unwrap_or_default();
            let (key, text) = KeyRecord::issue(&record.keys)?;
            record.keys.push(key.clone());
            issued = Some((key, text));
            Ok((Some(record), ()))
        })
        .await?;
        // `change` ran the edit at least once, and its last run is the one written.
        issued.ok_or_else(|| DirectoryError::Contended(id.to_owned()))
    }

    /// Revokes `id`'s key `key_id`; false when there was no such key.
    pub async fn revoke_key(&self, id: &str, key_id: &str) -> Result<bool, DirectoryError> {
        let (_, revoked) = self
            .change(id, false, |before| {
                let Some(before) = before else {
                    return Ok((None, false));
                };
                let mut record = before.clone();
                record.keys.retain(|key| key.id != key_id);
                let revoked = record.keys.len() < before.keys.len();
                Ok((Some(record), revoked))
            })
            .await?;
        Ok(revoked)
    }

    /// Sets the whole records (keys included) of many consumers at once: a bulk import, for loading a directory
    /// from another system. In memory it sets them one after the other; on Redis it writes them in batches, each
    /// counted as one change, and every instance (this one too) then reads the directory again. Returns how many
    /// records were set. A failure on Redis may leave the batches before it written.
    pub async fn import(
        &self,
        records: Vec<(String, ConsumerRecord)>,
    ) -> Result<usize, DirectoryError> {
        let count = records.len();
        match &self.store {
            Store::Memory => {
                let _replacing = self.view.replacing.lock();
                let tables = self.view.tables.load();
                for (id, record) in &records {
                    tables.set(id, Some(record));
                }
            }
            #[cfg(feature = "redis")]
            Store::Redis(sync) => sync.import(records).await?,
        }
        Ok(count)
    }

    /// Applies `edit` to `id`'s record where changes are made. With `replaces_unreadable`, a record that cannot
    /// be read counts as none (deleting must always be possible); otherwise it fails the change.
    // In memory every record is readable: only Redis's records can be unreadable.
    #[cfg_attr(not(feature = "redis"), allow(unused_variables))]
    async fn change<T>(
        &self,
        id: &str,
        replaces_unreadable: bool,
        mut edit: impl FnMut(Option<&ConsumerRecord>) -> Edit<T>,
    ) -> Result<(Option<ConsumerRecord>, T), DirectoryError> {
        match &self.store {
            Store::Memory => {
                let _replacing = self.view.replacing.lock();
                let tables = self.view.tables.load();
                let before = tables.consumer(id).map(|record| record.record());
                let (after, outcome) = edit(before.as_ref())?;
                if after != before {
                    tables.set(id, after.as_ref());
                }
                Ok((before, outcome))
            }
            #[cfg(feature = "redis")]
            Store::Redis(sync) => sync.change(id, replaces_unreadable, edit).await,
        }
    }
}

/// Sets `tollgate_consumer_directory_consumers`, the consumers whose records `tables` hold.
#[cfg(feature = "redis")]
fn held(tables: &Tables) {
    metrics::gauge!("tollgate_consumer_directory_consumers").set(tables.len() as f64);
}

/// `lookup`, counted in `tollgate_consumer_directory_lookups_total{result}` (`found`, `absent`, `failed`).
#[cfg(feature = "redis")]
fn counted<T: Found>(lookup: Result<T, DirectoryError>) -> Result<T, DirectoryError> {
    let result = match &lookup {
        Ok(found) if found.found() => "found",
        Ok(_) => "absent",
        Err(_) => "failed",
    };
    metrics::counter!("tollgate_consumer_directory_lookups_total", "result" => result).increment(1);
    lookup
}

/// Whether a lookup found a record.
#[cfg(feature = "redis")]
trait Found {
    fn found(&self) -> bool;
}

#[cfg(feature = "redis")]
impl Found for KeyLookup {
    fn found(&self) -> bool {
        matches!(self, KeyLookup::Found(..))
    }
}

#[cfg(feature = "redis")]
impl Found for Option<ConsumerRecord> {
    fn found(&self) -> bool {
        self.is_some()
    }
}

// === impl View ===

// The directory's Redis sync changes the view's tables as it reads changes, and replaces them when it reads
// everything; in memory, changes edit them directly (`Directory::change`).
#[cfg(feature = "redis")]
impl View {
    /// Puts `id`'s record as read at change `version` of the store (after change `change`, which was to this
    /// record) into the tables. False when they are not complete afterwards, and everything should be read again.
    fn apply(
        &self,
        id: &str,
        record: Option<ConsumerRecord>,
        (change, version): (u64, u64),
        lineage: Option<&str>,
        origin: Origin,
    ) -> bool {
        let _replacing = self.replacing.lock();
        let mut point = self.point.lock();
        // Counts compare only within one lineage: after a flush the counter starts again, and its change 3 is not
        // the change 3 these tables have.
        let same_lineage = point.lineage.as_deref() == lineage;
        if same_lineage && point.version.is_some_and(|applied| version <= applied) {
            // Complete for a later moment already: they have this record as new or newer.
            return true;
        }
        // Of another lineage than the tables read: the store was flushed or replaced since they were read, or since
        // this record was (an announcement heard late). The tables are then complete for no moment (what they lack
        // is looked up in the store) until the full read the caller asks for. A record this instance wrote goes in
        // (only a flush at the same moment could have outdated it, and that read corrects it); one heard of does
        // not, as which is newer is not known here.
        let foreign = !same_lineage && point.last.is_some();
        if foreign {
            point.lose_completeness();
            self.complete.store(false, Ordering::Release);
        }
        let tables = self.tables.load();
        // A cache keeps only the records it holds up to date; the others are read when asked for.
        if (!foreign || origin == Origin::Written) && (self.cache.is_none() || tables.holds(id)) {
            tables.set(id, record.as_ref());
            held(&tables);
        }
        let digests = record.iter().flat_map(ConsumerRecord::key_digests);
        self.absent.lock().forget(id, digests);
        let mut recent = self.recent.lock();
        if recent.changes.len() >= RECENT_CHANGES {
            recent.changes.remove(0);
        }
        recent.count += 1;
        let order = recent.count;
        recent.changes.push(Applied {
            id: id.into(),
            record,
            change,
            lineage: lineage.map(Arc::from),
            order,
            origin,
        });
        // Complete again only when the one change since their moment is this one; otherwise another record
        // changed too, and its announcement may be lost.
        let complete = same_lineage
            && point
                .version
                .is_some_and(|applied| change == applied + 1 && version == change);
        if complete {
            point.version = Some(version);
            point.last = Some(version);
        }
        complete
    }

    /// What a full read notes before its first page, for [`replace_all`](Self::replace_all).
    fn begin_read(&self) -> ReadBegun {
        let _replacing = self.replacing.lock();
        let changes = self.recent.lock().count;
        ReadBegun {
            changes,
            point: self.point.lock().clone(),
        }
    }

    /// Replaces the tables with everything the store held at `point`, read by a read that began as `begun` says.
    /// Returns how many consumers the tables replaced held when the store lost them: its counter started again
    /// (another lineage) or went back (a Redis restarted from an older save) since the moment the read began from.
    /// Changes applied while the read was under way may have taken the tables past the moment it read, which is no
    /// loss.
    ///
    /// The changes applied since `point` (a read takes a while, and this instance's own changes are applied as they
    /// are written) are applied again over what was read: a read begun before an admin's change must not undo it,
    /// as the next read would only later. Those of `point`'s lineage are since `point` when counted past it. One of
    /// another lineage applied after the read began was made after the read's first page found another lineage
    /// (or none: the first change to an empty store starts one), or before it, should the store have been flushed
    /// in between: the tables are then complete for no moment (what they lack is looked up in the store) until the
    /// next check reads everything again, and only a change this instance wrote is applied again, as
    /// [`apply`](Self::apply) puts one in.
    fn replace_all(
        &self,
        tables: Arc<Tables>,
        mut point: Point,
        begun: &ReadBegun,
    ) -> Option<usize> {
        let _replacing = self.replacing.lock();
        let lost = point
            .version
            .is_some_and(|version| begun.point.lost_by(version, point.lineage.as_deref()));
        {
            let mut recent = self.recent.lock();
            let since = |c: &Applied| match point.version {
                Some(at) if c.lineage == point.lineage => c.change > at,
                _ => c.order > begun.changes,
            };
            recent.changes.retain(since);
            for change in &recent.changes {
                let foreign = change.lineage != point.lineage;
                if foreign {
                    point.lose_completeness();
                }
                if (!foreign || change.origin == Origin::Written)
                    && (self.cache.is_none() || tables.holds(&change.id))
                {
                    tables.set(&change.id, change.record.as_ref());
                }
            }
        }
        held(&tables);
        let before = self.tables.swap(tables);
        let complete = point.version.is_some();
        *self.point.lock() = point;
        self.complete.store(complete, Ordering::Release);
        // Everything is known now (or, for a cache, forgotten): what was looked up before is in the tables or
        // absent from them.
        *self.absent.lock() = Absent::default();
        if let Some(cache) = &self.cache {
            cache.clear();
        }
        self.read_whole.notify_waiters();
        lost.then_some(before.len())
    }

    /// Puts `id`'s record, looked up, into the tables: before the first full read (which replaces them), or into
    /// a cache, evicting the least recently used beyond its capacity.
    fn learn(&self, id: &str, record: ConsumerRecord) {
        let _replacing = self.replacing.lock();
        let tables = self.tables.load();
        match &self.cache {
            Some(cache) => {
                let fresh = !tables.holds(id);
                tables.set(id, Some(&record));
                if fresh {
                    cache.admitted(id, &tables);
                }
                held(&tables);
            }
            None if !self.complete.load(Ordering::Acquire) => tables.set(id, Some(&record)),
            None => {}
        }
    }

    /// The store lost what this view had read from it (see [`Directory::resets`]).
    fn count_reset(&self) {
        self.resets.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("tollgate_consumer_directory_resets_total").increment(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumers::api_key_digest as digest;

    fn pro() -> ConsumerRecord {
        ConsumerRecord {
            plan: Some("pro".to_owned()),
            ..ConsumerRecord::default()
        }
    }

    #[tokio::test]
    async fn in_memory_put_keeps_keys_and_returns_the_record_before() {
        let directory = Directory::in_memory();
        assert_eq!(directory.put("acme", pro()).await.expect("put"), None);
        let (key, text) = directory.add_key("acme").await.expect("key");
        let owner = directory.consumer_of_key(&digest(&text));
        assert_eq!(owner.as_deref(), Some("acme"));
        let blocked = ConsumerRecord {
            blocked: true,
            keys: Vec::new(),
            ..pro()
        };
        let before = directory.put("acme", blocked).await.expect("put");
        assert_eq!(before.map(|b| b.keys), Some(vec![key.clone()]));
        let now = directory.consumer("acme").expect("record");
        assert!(now.blocked);
        assert_eq!(now.keys, [key]);
        assert!(directory.consumer_of_key(&digest(&text)).is_some());
    }

    #[tokio::test]
    async fn in_memory_revoked_and_deleted_keys_stop_identifying() {
        let directory = Directory::in_memory();
        let (first, first_text) = directory.add_key("acme").await.expect("key");
        let (_, second_text) = directory.add_key("acme").await.expect("key");
        assert_eq!(directory.consumer("acme").map(|r| r.keys.len()), Some(2));
        assert!(directory
            .revoke_key("acme", &first.id)
            .await
            .expect("revoke"));
        assert!(!directory
            .revoke_key("acme", &first.id)
            .await
            .expect("revoke"));
        assert!(!directory.revoke_key("nobody", "k_0").await.expect("revoke"));
        assert_eq!(directory.consumer_of_key(&digest(&first_text)), None);
        assert!(directory.consumer_of_key(&digest(&second_text)).is_some());
        let before = directory.delete("acme").await.expect("delete");
        assert_eq!(before.map(|b| b.keys.len()), Some(1));
        assert_eq!(directory.consumer_of_key(&digest(&second_text)), None);
        assert!(directory.is_empty());
        assert_eq!(directory.delete("acme").await.expect("delete"), None);
    }

    #[test]
    #[cfg(feature = "redis")]
    fn a_record_is_applied_and_the_tables_complete_only_after_the_next_change() {
        let view = View::default();
        let version = |view: &View| view.point.lock().version;
        let has = |view: &View, id| view.tables.load().consumer(id).is_some();
        view.replace_all(Arc::default(), Point::at(4, None), &view.begin_read());
        // Change 5 was to acme, and nothing changed since: complete at 5.
        assert!(view.apply("acme", Some(pro()), (5, 5), None, Origin::Written));
        assert_eq!(version(&view), Some(5));
        // Announced change 5 heard late, read at 6: applied, but change 6 (another record's?) is not in.
        assert!(!view.apply("acme", None, (5, 6), None, Origin::Written));
        assert!(!has(&view, "acme"));
        assert_eq!(version(&view), Some(5));
        // Change 8 while the tables are at 5: 6 and 7 are missing.
        assert!(!view.apply("globex", Some(pro()), (8, 8), None, Origin::Written));
        assert_eq!(version(&view), Some(5));
        // Read at or before the tables' moment: nothing to do.
        view.replace_all(
            Arc::new(Tables::from_records(vec![("acme".to_owned(), pro())])),
            Point::at(9, None),
            &view.begin_read(),
        );
        assert!(view.apply("acme", None, (9, 9), None, Origin::Written));
        assert!(has(&view, "acme"));
    }

    #[test]
    #[cfg(feature = "redis")]
    fn a_full_read_begun_before_a_change_does_not_undo_it() {
        let view = View::default();
        let has = |view: &View, id| view.tables.load().consumer(id).is_some();
        // Change 5 (acme set) is applied while a read of the store at 4 is under way: the read lands after it.
        let begun = view.begin_read();
        assert!(!view.apply("acme", Some(pro()), (5, 5), Some("l"), Origin::Written));
        view.replace_all(Arc::default(), Point::at(4, Some("l")), &begun);
        assert!(has(&view, "acme"), "the read at 4 undid change 5");
        // A read at or after a change holds it (here: acme deleted by change 6, read at 6).
        assert!(!view.apply("acme", None, (6, 6), Some("l"), Origin::Written));
        view.replace_all(
            Arc::new(Tables::from_records(vec![("globex".to_owned(), pro())])),
            Point::at(6, Some("l")),
            &view.begin_read(),
        );
        assert!(!has(&view, "acme"));
        assert!(has(&view, "globex"));
        // Changes of another lineage applied before the read began (a store flushed since) are not the read's to
        // keep.
        assert!(!view.apply("initech", Some(pro()), (9, 9), Some("old"), Origin::Written));
        view.replace_all(
            Arc::default(),
            Point::at(2, Some("new")),
            &view.begin_read(),
        );
        assert!(!has(&view, "initech"));
        assert!(view.complete.load(Ordering::Acquire));
    }

    #[test]
    #[cfg(feature = "redis")]
    fn the_first_change_to_an_empty_store_is_not_undone_by_a_read_begun_before_it() {
        let view = View::default();
        let complete = |view: &View| view.complete.load(Ordering::Acquire);
        let has = |view: &View, id| view.tables.load().consumer(id).is_some();
        // A read finds an empty store (no counter, no lineage); before it lands, this instance's first change
        // starts lineage "l" at change 1.
        let begun = &view.begin_read();
        assert!(!view.apply("acme", Some(pro()), (1, 1), Some("l"), Origin::Written));
        view.replace_all(Arc::default(), Point::at(0, None), begun);
        assert!(
            has(&view, "acme"),
            "the read of the empty store undid change 1"
        );
        // The read cannot vouch for a lineage it did not see: complete for no moment (what the tables lack is
        // looked up in the store), until a read of lineage "l" lands.
        assert!(
            !complete(&view),
            "the read of the empty store claims to be complete"
        );
        assert_eq!(view.point.lock().version, None);
        view.replace_all(
            Arc::new(Tables::from_records(vec![("acme".to_owned(), pro())])),
            Point::at(1, Some("l")),
            &view.begin_read(),
        );
        assert!(complete(&view));
        // Once the empty store was read, change 1 is of a lineage the tables are not of: written here, it goes in;
        // heard of, it does not (which is newer is not known); either way the tables are complete no more.
        for (origin, kept) in [(Origin::Written, true), (Origin::Heard, false)] {
            let view = View::default();
            view.replace_all(Arc::default(), Point::at(0, None), &view.begin_read());
            assert!(!view.apply("acme", Some(pro()), (1, 1), Some("l"), origin));
            assert_eq!(has(&view, "acme"), kept, "{origin:?}");
            assert!(!complete(&view), "{origin:?}");
        }
    }

    #[test]
    #[cfg(feature = "redis")]
    fn a_record_heard_late_does_not_outlive_a_flush() {
        let view = View::default();
        let has = |view: &View, id| view.tables.load().consumer(id).is_some();
        view.replace_all(
            Arc::new(Tables::from_records(vec![("globex".to_owned(), pro())])),
            Point::at(4, Some("l")),
            &view.begin_read(),
        );
        // Flushed, and read empty (the one consumer held is lost); then globex's change 4, read before the flush,
        // is heard.
        let lost = view.replace_all(Arc::default(), Point::at(0, None), &view.begin_read());
        assert_eq!(lost, Some(1));
        assert!(!view.apply("globex", Some(pro()), (4, 4), Some("l"), Origin::Heard));
        assert!(!has(&view, "globex"), "a flushed record came back");
        assert!(!view.complete.load(Ordering::Acquire));
        // What was last read is still what a later loss is measured against.
        assert_eq!(view.point.lock().last, Some(0));
    }

    #[test]
    #[cfg(feature = "redis")]
    fn a_read_outrun_by_the_changes_applied_meanwhile_is_no_loss() {
        let view = View::default();
        let has = |view: &View, id| view.tables.load().consumer(id).is_some();
        let begun = view.begin_read();
        assert_eq!(
            view.replace_all(Arc::default(), Point::at(1, Some("l")), &begun),
            None
        );
        // A read begins at 1; changes 2 and 3, written here, take the tables to 3 before it lands with the store
        // as it was at 1.
        let begun = view.begin_read();
        assert!(view.apply("acme", Some(pro()), (2, 2), Some("l"), Origin::Written));
        assert!(view.apply("globex", Some(pro()), (3, 3), Some("l"), Origin::Written));
        assert_eq!(view.point.lock().version, Some(3));
        let lost = view.replace_all(Arc::default(), Point::at(1, Some("l")), &begun);
        assert_eq!(
            lost, None,
            "a read begun before changes 2 and 3 counted as a loss"
        );
        assert!(has(&view, "acme") && has(&view, "globex"));
        // A counter found behind the moment a read began from is one (a Redis restarted from an older save).
        let begun = view.begin_read();
        let lost = view.replace_all(Arc::default(), Point::at(0, Some("l")), &begun);
        assert_eq!(lost, Some(2));
    }

    #[test]
    #[cfg(feature = "redis")]
    fn before_the_first_full_read_nothing_is_complete() {
        let view = View::default();
        assert!(!view.apply("acme", Some(pro()), (1, 1), None, Origin::Written));
        assert!(view.tables.load().consumer("acme").is_some());
        assert_eq!(view.point.lock().version, None);
        assert!(!view.complete.load(Ordering::Acquire));
    }
}
