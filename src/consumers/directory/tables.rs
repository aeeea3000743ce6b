//! The directory's records in memory: hash tables of packed records by consumer id and by key digest, in shards
//! that requests read under a shard's read lock and changes edit in place, so that a change costs the same at ten
//! million consumers as at one, and a consumer costs about 150 bytes (docs/operations.md).

use std::collections::BinaryHeap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};

use foldhash::fast::RandomState;
use hashbrown::HashTable;
use parking_lot::RwLock;

use super::record::ConsumerRecord;
use super::stored::StoredRecord;

/// Shards: enough that changes and the requests reading seldom meet on one lock.
const SHARDS: usize = 64;

/// Every record the directory holds, by consumer id and by each of its keys' digests.
pub(super) struct Tables {
    shards: Box<[RwLock<Shard>]>,
    hasher: RandomState,
    consumers: AtomicUsize,
}

/// One shard: the records whose id hashes here, and the keys whose digest hashes here (a record is in the shard of
/// its id and in that of each of its keys).
#[derive(Default)]
struct Shard {
    /// Records by consumer id (the record holds it, and whether it was read since a cache last looked: see
    /// [`Tables::evict_unless_used`]).
    consumers: HashTable<StoredRecord>,
    /// Records by the digest of each of their keys, with the digest's hash (a record with two keys here is here
    /// twice, and the table needs each entry's own hash when it grows).
    keys: HashTable<(u64, StoredRecord)>,
}

/// A page's entry, ordered by consumer id.
struct ById(StoredRecord);

impl std::fmt::Debug for Tables {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tables")
            .field("consumers", &self.len())
            .finish()
    }
}

impl Default for Tables {
    fn default() -> Self {
        Self::with_capacity(0)
    }
}

// === impl Tables ===

impl Tables {
    /// Tables sized for `consumers` with one key each (a shard holds a little more or less than its share).
    pub(super) fn with_capacity(consumers: usize) -> Self {
        let share = consumers.div_ceil(SHARDS);
        let per_shard = share + share / 16;
        Self {
            shards: (0..SHARDS)
                .map(|_| {
                    RwLock::new(Shard {
                        consumers: HashTable::with_capacity(per_shard),
                        keys: HashTable::with_capacity(per_shard),
                    })
                })
                .collect(),
            hasher: RandomState::default(),
            consumers: AtomicUsize::new(0),
        }
    }

    /// Tables holding `records` (a consumer listed twice: the last stands).
    #[cfg(test)]
    pub(super) fn from_records(records: Vec<(String, ConsumerRecord)>) -> Self {
        let tables = Self::with_capacity(records.len());
        for (id, record) in records {
            tables.set(&id, Some(&record));
        }
        tables
    }

    /// How many consumers have a record.
    pub(super) fn len(&self) -> usize {
        self.consumers.load(Ordering::Relaxed)
    }

    /// Consumer `id`'s record; noted as used.
    pub(super) fn consumer(&self, id: &str) -> Option<StoredRecord> {
        let hash = self.hasher.hash_one(id);
        let shard = self.shard(hash).read();
        let record = shard.consumers.find(hash, |held| held.id() == id)?;
        record.mark_used();
        Some(record.clone())
    }

    /// Whether consumer `id` has a record here (not noted as used).
    pub(super) fn holds(&self, id: &str) -> bool {
        let hash = self.hasher.hash_one(id);
        let shard = self.shard(hash).read();
        shard.consumers.find(hash, |held| held.id() == id).is_some()
    }

    /// Removes consumer `id` unless it was used since the last call for it (which it is then no longer): the
    /// second chance of a CLOCK cache. True when `id` is gone (removed, or not here).
    pub(super) fn evict_unless_used(&self, id: &str) -> bool {
        let hash = self.hasher.hash_one(id);
        let used = {
            let shard = self.shard(hash).read();
            match shard.consumers.find(hash, |held| held.id() == id) {
                None => return true,
                Some(record) => record.take_used(),
            }
        };
        if !used {
            self.set(id, None);
        }
        !used
    }

    /// The record holding the key whose SHA-256 is `digest`.
    pub(super) fn holder_of_key(&self, digest: &[u8; 32]) -> Option<StoredRecord> {
        let hash = self.hasher.hash_one(digest);
        let shard = self.shard(hash).read();
        shard
            .keys
            .find(hash, |(held, record)| {
                *held == hash && record.holds_key(digest)
            })
            .map(|(_, record)| record.clone())
    }

    /// Sets consumer `id`'s record (removes it for `None`). The record's keys find it before the record changes and
    /// its revoked keys stop finding it after, so that a key the record keeps finds it throughout. Changes must
    /// not run at once (the directory's writers take turns).
    pub(super) fn set(&self, id: &str, record: Option<&ConsumerRecord>) {
        let after = record.map(|record| StoredRecord::new(id, record));
        if let Some(after) = &after {
            for digest in after.key_digests() {
                self.index_key(digest, after);
            }
        }
        let hash = self.hasher.hash_one(id);
        let before = {
            let mut shard = self.shard(hash).write();
            let entry = shard
                .consumers
                .find_entry(hash, |held| held.id() == id)
                .ok();
            let (before, vacant) = match entry {
                Some(entry) => {
                    let (before, vacant) = entry.remove();
                    (Some(before), vacant.into_table())
                }
                None => (None, &mut shard.consumers),
            };
            if let Some(after) = &after {
                vacant.insert_unique(hash, after.clone(), |held| self.hasher.hash_one(held.id()));
            }
            before
        };
        match (&before, &after) {
            (None, Some(_)) => self.consumers.fetch_add(1, Ordering::Relaxed),
            (Some(_), None) => self.consumers.fetch_sub(1, Ordering::Relaxed),
            _ => 0,
        };
        if let Some(before) = before {
            for digest in before.key_digests() {
                if after.as_ref().is_none_or(|after| !after.holds_key(&digest)) {
                    self.unindex_key(digest, id);
                }
            }
        }
    }

    /// Points `digest` at `record`: replaces the same consumer's older record there; a key another consumer holds
    /// (only a record written by hand can claim one) then identifies neither, rather than whichever was read last.
    fn index_key(&self, digest: [u8; 32], record: &StoredRecord) {
        let hash = self.hasher.hash_one(digest);
        let mut shard = self.shard(hash).write();
        let holds =
            |(held, record): &(u64, StoredRecord)| *held == hash && record.holds_key(&digest);
        match shard.keys.find_entry(hash, holds) {
            Ok(mut entry) if entry.get().1.id() == record.id() => {
                entry.get_mut().1 = record.clone()
            }
            Ok(entry) => {
                let ((_, held), _) = entry.remove();
                tracing::warn!(
                    consumers = %format_args!("{}, {}", held.id(), record.id()),
                    "one runtime API key is recorded for two consumers; it identifies neither"
                );
            }
            Err(absent) => {
                absent
                    .into_table()
                    .insert_unique(hash, (hash, record.clone()), |(held, _)| *held);
            }
        }
    }

    /// Stops `digest` finding consumer `id`'s record (another consumer's stays).
    fn unindex_key(&self, digest: [u8; 32], id: &str) {
        let hash = self.hasher.hash_one(digest);
        let mut shard = self.shard(hash).write();
        let found = shard.keys.find_entry(hash, |(held, record)| {
            *held == hash && record.holds_key(&digest) && record.id() == id
        });
        if let Ok(entry) = found {
            entry.remove();
        }
    }

    /// The records of the consumers whose ids come after `after` (all when `None`), the `limit` first in order of
    /// id: one pass over the tables keeping the smallest ids seen, never a sort of them all.
    pub(super) fn page(&self, after: Option<&str>, limit: usize) -> Vec<(String, ConsumerRecord)> {
        let mut smallest: BinaryHeap<ById> = BinaryHeap::with_capacity(limit + 1);
        for shard in self.shards.iter() {
            let shard = shard.read();
            for record in &shard.consumers {
                let id = record.id();
                if after.is_some_and(|after| id <= after) {
                    continue;
                }
                if smallest.len() == limit
                    && smallest.peek().is_some_and(|largest| id >= largest.0.id())
                {
                    continue;
                }
                smallest.push(ById(record.clone()));
                if smallest.len() > limit {
                    smallest.pop();
                }
            }
        }
        smallest
            .into_sorted_vec()
            .into_iter()
            .map(|ById(record)| (record.id().to_owned(), record.record()))
            .collect()
    }

    /// Calls `each` with every key's digest and the id of the consumer holding it.
    #[cfg(feature = "redis")]
    pub(super) fn for_each_key(&self, mut each: impl FnMut([u8; 32], &str)) {
        for shard in self.shards.iter() {
            for record in &shard.read().consumers {
                for digest in record.key_digests() {
                    each(digest, record.id());
                }
            }
        }
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard> {
        // Bits hashbrown uses for neither the bucket (the low ones) nor the tag (the top seven).
        &self.shards[(hash >> 32) as usize % SHARDS]
    }
}

// === impl ById ===

impl PartialEq for ById {
    fn eq(&self, other: &Self) -> bool {
        self.0.id() == other.0.id()
    }
}

impl Eq for ById {}

impl PartialOrd for ById {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ById {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.id().cmp(other.0.id())
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::KeyRecord;
    use super::*;
    use crate::consumers::{api_key_digest as digest, digest_hex};

    fn with_keys(plan: &str, keys: &[&str]) -> ConsumerRecord {
        ConsumerRecord {
            plan: Some(plan.to_owned()),
            keys: keys
                .iter()
                .enumerate()
                .map(|(i, key)| KeyRecord {
                    id: format!("k_{i}"),
                    sha256: digest_hex(&digest(key)),
                    created_ms: 1,
                })
                .collect(),
            ..ConsumerRecord::default()
        }
    }

    fn owner(tables: &Tables, key: &str) -> Option<String> {
        tables
            .holder_of_key(&digest(key))
            .map(|record| record.id().to_owned())
    }

    fn plan(tables: &Tables, id: &str) -> Option<String> {
        tables
            .consumer(id)
            .and_then(|record| record.plan().map(str::to_owned))
    }

    #[test]
    fn records_and_keys_are_found_by_id_and_digest() {
        let tables = Tables::from_records(vec![
            ("acme".to_owned(), with_keys("pro", &["tg_a", "tg_b"])),
            ("globex".to_owned(), with_keys("free", &["tg_c"])),
        ]);
        assert_eq!(tables.len(), 2);
        assert_eq!(plan(&tables, "acme").as_deref(), Some("pro"));
        assert_eq!(plan(&tables, "globex").as_deref(), Some("free"));
        assert_eq!(plan(&tables, "initech"), None);
        assert_eq!(owner(&tables, "tg_a").as_deref(), Some("acme"));
        assert_eq!(owner(&tables, "tg_b").as_deref(), Some("acme"));
        assert_eq!(owner(&tables, "tg_c").as_deref(), Some("globex"));
        assert_eq!(owner(&tables, "tg_d"), None);
    }

    #[test]
    fn a_replaced_record_drops_its_old_keys_and_keeps_the_others() {
        let tables = Tables::from_records(vec![(
            "acme".to_owned(),
            with_keys("pro", &["tg_a", "tg_b"]),
        )]);
        tables.set("acme", Some(&with_keys("free", &["tg_b", "tg_c"])));
        assert_eq!(owner(&tables, "tg_a"), None);
        assert_eq!(owner(&tables, "tg_b").as_deref(), Some("acme"));
        assert_eq!(owner(&tables, "tg_c").as_deref(), Some("acme"));
        // The key table holds the new version of the record.
        let holder = tables.holder_of_key(&digest("tg_b")).expect("held");
        assert_eq!(holder.plan(), Some("free"));
        assert_eq!(tables.len(), 1);
        tables.set("acme", None);
        assert_eq!(tables.len(), 0);
        assert_eq!(owner(&tables, "tg_b"), None);
        assert_eq!(owner(&tables, "tg_c"), None);
    }

    #[test]
    fn a_key_claimed_by_two_consumers_identifies_neither() {
        let tables = Tables::from_records(vec![
            ("acme".to_owned(), with_keys("pro", &["tg_shared", "tg_a"])),
            ("globex".to_owned(), with_keys("free", &["tg_shared"])),
        ]);
        assert_eq!(owner(&tables, "tg_shared"), None);
        assert_eq!(owner(&tables, "tg_a").as_deref(), Some("acme"));
    }

    #[test]
    fn removing_a_consumer_keeps_a_key_now_owned_by_another() {
        let tables = Tables::from_records(vec![("acme".to_owned(), with_keys("pro", &["tg_a"]))]);
        tables.set("acme", Some(&with_keys("pro", &[])));
        tables.set("globex", Some(&with_keys("free", &["tg_g", "tg_a"])));
        tables.set("acme", None);
        assert_eq!(owner(&tables, "tg_a").as_deref(), Some("globex"));
    }

    #[test]
    fn many_records_with_many_keys_each_are_found_after_the_tables_grow() {
        let tables = Tables::default();
        for i in 0..5_000 {
            let keys = [
                format!("tg_{i}_a"),
                format!("tg_{i}_b"),
                format!("tg_{i}_c"),
            ];
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            tables.set(&format!("user-{i}"), Some(&with_keys("pro", &keys)));
        }
        assert_eq!(tables.len(), 5_000);
        for i in (0..5_000).step_by(97) {
            for suffix in ["a", "b", "c"] {
                assert_eq!(
                    owner(&tables, &format!("tg_{i}_{suffix}")),
                    Some(format!("user-{i}"))
                );
            }
        }
    }

    #[test]
    fn a_page_is_the_first_ids_after_the_one_given_in_order() {
        let tables = Tables::default();
        for id in ["delta", "alpha", "echo", "charlie", "bravo"] {
            tables.set(id, Some(&with_keys("pro", &[])));
        }
        let ids = |page: Vec<(String, ConsumerRecord)>| -> Vec<String> {
            page.into_iter().map(|(id, _)| id).collect()
        };
        assert_eq!(ids(tables.page(None, 2)), ["alpha", "bravo"]);
        assert_eq!(ids(tables.page(Some("bravo"), 2)), ["charlie", "delta"]);
        assert_eq!(ids(tables.page(Some("delta"), 10)), ["echo"]);
        assert!(tables.page(Some("echo"), 10).is_empty());
        assert_eq!(tables.page(None, 10)[0].1.plan.as_deref(), Some("pro"));
    }
}
