//! Lost state: the epoch of Redis's data, as the marker every script call checks tells it, and what this instance
//! does when it changes (Redis lost its data): says so once, counts it, and puts back the slots it holds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// The key every call checks unless [`RedisStore::with_key_prefix`](super::RedisStore::with_key_prefix) names
/// another (`<key_prefix>epoch`).
pub const DEFAULT_MARKER: &str = "tollgate:epoch";

/// How long a concurrency limit admits no new slot once Redis lost its data, as the script has it (`RECOVERY_MS`
/// in `scripts/check/2-state.lua`): for the log line.
const RECOVERY: &str = "2s";
/// The same in ms: losses told within it of the last one said are the same episode (a Cluster node's slots are
/// told one by one), said and counted once.
const RECOVERY_MS: u64 = 2000;

/// Redis Cluster's hash slots.
const CLUSTER_SLOTS: usize = 16384;

/// The epoch of Redis's data this instance last saw, and what it does when a later one comes: one epoch for a
/// standalone or Sentinel Redis, one per hash slot on Redis Cluster (each slot's keys have a marker of their own).
pub(super) struct Epoch {
    /// Per marker (one, or one per hash slot): the epoch of the data this instance last saw in a reply (ms,
    /// Redis's clock); 0 before the first.
    known: Box<[AtomicU64]>,
    /// The end of the last recovery window a reply told of (Redis's ms), whose end is awaited.
    window_end: AtomicU64,
    /// When (Redis's ms) this instance last said that Redis lost its data.
    said: AtomicU64,
    /// What puts this instance's leases back (those of one hash slot on Cluster, all otherwise), set once by the
    /// store.
    on_lost: OnceLock<Box<dyn Fn(Option<u16>) + Send + Sync>>,
    /// What wakes the requests waiting for a slot once a recovery window ends, set once by the limiter.
    on_window_end: Arc<OnceLock<Box<dyn Fn() + Send + Sync>>>,
}

impl Default for Epoch {
    fn default() -> Self {
        Self::with_markers(1)
    }
}

// === impl Epoch ===

impl Epoch {
    /// The epochs of a Redis Cluster: one per hash slot.
    pub(super) fn per_hash_slot() -> Self {
        Self::with_markers(CLUSTER_SLOTS)
    }

    fn with_markers(markers: usize) -> Self {
        Self {
            known: (0..markers).map(|_| AtomicU64::new(0)).collect(),
            window_end: AtomicU64::new(0),
            said: AtomicU64::new(0),
            on_lost: OnceLock::new(),
            on_window_end: Arc::default(),
        }
    }

    /// The epoch this instance last saw of the marker of `slot` (the one marker but on Cluster; 0: none yet), sent
    /// with every call.
    pub(super) fn known(&self, slot: Option<u16>) -> u64 {
        self.known_at(slot).load(Ordering::Acquire)
    }

    fn known_at(&self, slot: Option<u16>) -> &AtomicU64 {
        let index = slot.map_or(0, usize::from);
        &self.known[if index < self.known.len() { index } else { 0 }]
    }

    /// What to do when Redis lost its data: put back the slots this instance holds (on Cluster, those whose keys
    /// live in the hash slot given).
    pub(super) fn on_lost(&self, put_back: impl Fn(Option<u16>) + Send + Sync + 'static) {
        let _ = self.on_lost.set(Box::new(put_back));
    }

    /// What to do once a recovery window ends: wake the requests waiting for a slot, which it refused.
    pub(super) fn on_window_end(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_window_end.set(Box::new(wake));
    }

    /// A reply at `now_ms` of a call on `slot` (Cluster's hash slot, else `None`) told `epoch` (0: the call had no
    /// marker) and the end of a recovery window under way (0: none). A later epoch than the one this instance knew
    /// means Redis lost the data it vouched for: logged once per episode, counted in `tollgate_store_resets_total`,
    /// and the slots held are put back. An earlier one is a reply overtaken by a later one, and the first an
    /// instance sees is no news. A window's end wakes, once, the requests waiting for a slot: nothing else would
    /// tell them (no slot was released).
    pub(super) fn observe(&self, slot: Option<u16>, epoch: u64, window_end: u64, now_ms: i64) {
        if epoch == 0 {
            return;
        }
        if window_end > self.window_end.fetch_max(window_end, Ordering::AcqRel) {
            self.wake_at(window_end, now_ms);
        }
        let before = self.known_at(slot).fetch_max(epoch, Ordering::AcqRel);
        if before == 0 || epoch <= before {
            return;
        }
        let now = u64::try_from(now_ms).unwrap_or(0);
        let said = self.said.load(Ordering::Acquire);
        if now.saturating_sub(said) >= RECOVERY_MS
            && self
                .said
                .compare_exchange(said, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            metrics::counter!("tollgate_store_resets_total").increment(1);
            tracing::warn!(
                "redis lost state (restarted without its data, flushed, failed over to a replica that missed \
                 writes, or refused every write for a while): what it counted is gone, and concurrency limits \
                 admit no new slot for {RECOVERY} while every instance puts back the slots its requests hold"
            );
        }
        if let Some(put_back) = self.on_lost.get() {
            put_back(slot);
        }
    }

    /// Wakes the waiting requests once Redis's clock reaches `window_end` (it read `now_ms` a moment ago).
    fn wake_at(&self, window_end: u64, now_ms: i64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let left = window_end.saturating_sub(u64::try_from(now_ms).unwrap_or(0));
        let wake = Arc::clone(&self.on_window_end);
        runtime.spawn(async move {
            tokio::time::sleep(Duration::from_millis(left)).await;
            if let Some(wake) = wake.get() {
                wake();
            }
        });
    }
}

/// The marker of the keys of hash slot `slot` on Redis Cluster, `<key_prefix>{<tag>}epoch`: `tag` is the first
/// decimal number whose hash slot is `slot`, so that the marker lives beside the keys a call touches and the script
/// reads it in the same call.
pub(super) fn cluster_marker(prefix: &str, slot: u16) -> String {
    let tag = cluster_tags()
        .get(usize::from(slot))
        .copied()
        .unwrap_or_default();
    format!("{prefix}{{{tag}}}epoch")
}

/// Per hash slot, the first decimal number that hashes to it, worked out once (about 180,000 CRC16s).
fn cluster_tags() -> &'static [u32] {
    static TAGS: OnceLock<Box<[u32]>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; CLUSTER_SLOTS];
        let mut left = CLUSTER_SLOTS;
        let mut n: u32 = 0;
        while left > 0 && n < u32::MAX {
            let slot = usize::from(fred::util::redis_keyslot(n.to_string().as_bytes()));
            if let Some(tag) = tags.get_mut(slot).filter(|tag| **tag == u32::MAX) {
                *tag = n;
                left -= 1;
            }
            n += 1;
        }
        tags.into_boxed_slice()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hash_slot_has_a_marker_in_it() {
        for slot in [0, 1, 5461, 12_182, 16_383] {
            let marker = cluster_marker("tollgate:", slot);
            assert!(
                marker.starts_with("tollgate:{") && marker.ends_with("}epoch"),
                "{marker}"
            );
            assert_eq!(
                fred::util::redis_keyslot(marker.as_bytes()),
                slot,
                "{marker}"
            );
        }
        assert!(cluster_tags().iter().all(|&tag| tag != u32::MAX));
    }

    #[test]
    fn a_loss_is_said_once_per_episode_and_each_slot_puts_back_its_own() {
        let epoch = Epoch::per_hash_slot();
        let lost = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let seen = Arc::clone(&lost);
        epoch.on_lost(move |slot| seen.lock().push(slot));
        epoch.observe(Some(7), 100, 0, 1_000);
        epoch.observe(Some(9), 100, 0, 1_000);
        assert_eq!(epoch.known(Some(7)), 100);
        assert_eq!(epoch.known(Some(8)), 0);
        assert!(lost.lock().is_empty(), "a first epoch is no news");
        epoch.observe(Some(7), 5_000, 7_000, 5_000);
        epoch.observe(Some(9), 5_001, 7_001, 5_001);
        epoch.observe(Some(9), 5_001, 7_001, 5_002);
        assert_eq!(*lost.lock(), [Some(7), Some(9)]);
        assert_eq!(epoch.said.load(Ordering::Acquire), 5_000);
    }
}
