//! What the directory holds at one moment: the records by consumer id and the index of runtime keys by digest,
//! replaced whole on each change so that readers never lock.

use std::sync::Arc;

use foldhash::fast::RandomState;

use super::record::ConsumerRecord;

/// The records and the key index, read by every request through an `ArcSwap` and never changed in place: a
/// change builds the next snapshot. The maps are persistent (hash array mapped tries): the next snapshot shares
/// all but the few nodes on the changed entries' paths with the last, so a change costs the same at a million
/// consumers as at one, where copying the maps cost a million entries' worth per change.
#[derive(Debug, Clone, Default)]
pub(super) struct Snapshot {
    consumers: Map<Arc<str>, Arc<ConsumerRecord>>,
    keys: Map<[u8; 32], Arc<str>>,
    /// The store's change counter this snapshot is complete for: every change up to it is in, none missed.
    /// `None` before the first full read (and always for the in-process directory).
    pub(super) version: Option<u64>,
    /// The lineage of the counter `version` counts in (see the scripts): `None` when the store has none yet.
    #[cfg(feature = "redis")]
    pub(super) lineage: Option<Arc<str>>,
}

type Map<K, V> = imbl::GenericHashMap<K, V, RandomState, imbl::shared_ptr::DefaultSharedPtr>;

// === impl Snapshot ===

// What the directory's Redis sync builds a snapshot from and compares it with (and the tests build one with).
#[cfg(any(feature = "redis", test))]
impl Snapshot {
    /// Every record of the store at `version`.
    pub(super) fn from_records(
        records: impl IntoIterator<Item = (String, ConsumerRecord)>,
        version: Option<u64>,
    ) -> Self {
        let mut snapshot = Self {
            version,
            ..Self::default()
        };
        for (id, record) in records {
            snapshot.insert(Arc::from(id), Arc::new(record));
        }
        snapshot
    }
}

#[cfg(feature = "redis")]
impl Snapshot {
    /// This snapshot, its counter's lineage `lineage`.
    pub(super) fn in_lineage(mut self, lineage: Option<&str>) -> Self {
        self.lineage = lineage.map(Arc::from);
        self
    }

    /// Whether the store at change `version` of `lineage` is this snapshot's moment.
    pub(super) fn is_at(&self, version: u64, lineage: Option<&str>) -> bool {
        self.version == Some(version) && self.lineage.as_deref() == lineage
    }

    /// Whether a store now at change `version` of `lineage` lost what this snapshot read from it: its counter
    /// started again (another lineage) or went back (a Redis restarted from an older save).
    pub(super) fn lost_by(&self, version: u64, lineage: Option<&str>) -> bool {
        let Some(had) = self.version.filter(|&had| had > 0) else {
            // Never read, or read before any change: nothing to lose.
            return false;
        };
        version < had || (self.lineage.is_some() && self.lineage.as_deref() != lineage)
    }
}

impl Snapshot {
    pub(super) fn consumer(&self, id: &str) -> Option<&Arc<ConsumerRecord>> {
        self.consumers.get(id)
    }

    pub(super) fn consumer_of_key(&self, digest: &[u8; 32]) -> Option<&Arc<str>> {
        self.keys.get(digest)
    }

    /// Every record, in no order.
    pub(super) fn records(&self) -> impl Iterator<Item = (&Arc<str>, &Arc<ConsumerRecord>)> {
        self.consumers.iter()
    }

    pub(super) fn len(&self) -> usize {
        self.consumers.len()
    }

    /// This snapshot with `id`'s record replaced by `record` (removed when `None`), and its keys re-indexed.
    pub(super) fn with(&self, id: &str, record: Option<ConsumerRecord>) -> Self {
        let mut next = self.clone();
        next.remove(id);
        if let Some(record) = record {
            next.insert(Arc::from(id), Arc::new(record));
        }
        next
    }

    /// This snapshot with each of `records` replacing the consumer's record.
    pub(super) fn with_all(
        &self,
        records: impl IntoIterator<Item = (String, ConsumerRecord)>,
    ) -> Self {
        let mut next = self.clone();
        for (id, record) in records {
            next.remove(&id);
            next.insert(Arc::from(id), Arc::new(record));
        }
        next
    }

    fn insert(&mut self, id: Arc<str>, record: Arc<ConsumerRecord>) {
        for digest in record.key_digests() {
            // Only a record written by hand can claim another consumer's key: the key then names neither, rather
            // than whichever was read last.
            if let Some(owner) = self.keys.insert(digest, Arc::clone(&id)) {
                if owner != id {
                    tracing::warn!(
                        consumers = %format_args!("{owner}, {id}"),
                        "one runtime API key is recorded for two consumers; it identifies neither"
                    );
                    self.keys.remove(&digest);
                }
            }
        }
        self.consumers.insert(id, record);
    }

    fn remove(&mut self, id: &str) {
        if let Some(old) = self.consumers.remove(id) {
            for digest in old.key_digests() {
                if self.keys.get(&digest).is_some_and(|owner| &**owner == id) {
                    self.keys.remove(&digest);
                }
            }
        }
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

    #[test]
    fn records_and_keys_are_found_by_id_and_digest() {
        let snapshot = Snapshot::from_records(
            [
                ("acme".to_owned(), with_keys("pro", &["tg_a", "tg_b"])),
                ("globex".to_owned(), with_keys("free", &["tg_c"])),
            ],
            Some(7),
        );
        assert_eq!(snapshot.len(), 2);
        assert_eq!(snapshot.version, Some(7));
        let plan = |id| snapshot.consumer(id).and_then(|r| r.plan.clone());
        assert_eq!(plan("acme").as_deref(), Some("pro"));
        assert_eq!(plan("globex").as_deref(), Some("free"));
        assert_eq!(plan("initech"), None);
        let owner = |key| {
            snapshot
                .consumer_of_key(&digest(key))
                .map(|id| id.to_string())
        };
        assert_eq!(owner("tg_a").as_deref(), Some("acme"));
        assert_eq!(owner("tg_b").as_deref(), Some("acme"));
        assert_eq!(owner("tg_c").as_deref(), Some("globex"));
        assert_eq!(owner("tg_d"), None);
    }

    #[test]
    fn a_replaced_record_drops_its_old_keys_and_leaves_the_old_snapshot_alone() {
        let before = Snapshot::from_records(
            [("acme".to_owned(), with_keys("pro", &["tg_a", "tg_b"]))],
            None,
        );
        let after = before.with("acme", Some(with_keys("free", &["tg_b"])));
        assert_eq!(after.consumer_of_key(&digest("tg_a")), None);
        assert_eq!(
            after.consumer_of_key(&digest("tg_b")).map(|id| &**id),
            Some("acme")
        );
        assert_eq!(
            after.consumer("acme").and_then(|r| r.plan.as_deref()),
            Some("free")
        );
        // Readers holding the old snapshot still see it whole.
        assert!(before.consumer_of_key(&digest("tg_a")).is_some());
        assert_eq!(
            before.consumer("acme").and_then(|r| r.plan.as_deref()),
            Some("pro")
        );
        let removed = after.with("acme", None);
        assert_eq!(removed.len(), 0);
        assert_eq!(removed.consumer_of_key(&digest("tg_b")), None);
    }

    #[test]
    fn a_key_claimed_by_two_consumers_identifies_neither() {
        let snapshot = Snapshot::from_records(
            [
                ("acme".to_owned(), with_keys("pro", &["tg_shared", "tg_a"])),
                ("globex".to_owned(), with_keys("free", &["tg_shared"])),
            ],
            None,
        );
        assert_eq!(snapshot.consumer_of_key(&digest("tg_shared")), None);
        assert!(snapshot.consumer_of_key(&digest("tg_a")).is_some());
    }

    #[test]
    fn removing_a_consumer_keeps_a_key_now_owned_by_another() {
        let snapshot =
            Snapshot::from_records([("acme".to_owned(), with_keys("pro", &["tg_a"]))], None)
                .with("globex", Some(with_keys("free", &["tg_g"])));
        let moved = snapshot.with("acme", Some(with_keys("pro", &[])));
        let moved = moved.with("globex", Some(with_keys("free", &["tg_g", "tg_a"])));
        let gone = moved.with("acme", None);
        assert_eq!(
            gone.consumer_of_key(&digest("tg_a")).map(|id| &**id),
            Some("globex")
        );
    }
}
