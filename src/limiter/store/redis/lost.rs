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

/// The epoch of Redis's data this instance last saw, and what it does when a later one comes.
#[derive(Default)]
pub(super) struct Epoch {
    /// The epoch of the data this instance last saw in a reply (ms, Redis's clock); 0 before the first.
    known: AtomicU64,
    /// The end of the last recovery window a reply told of (Redis's ms), whose end is awaited.
    window_end: AtomicU64,
    /// What puts this instance's leases back, set once by the store.
    on_lost: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// What wakes the requests waiting for a slot once a recovery window ends, set once by the limiter.
    on_window_end: Arc<OnceLock<Box<dyn Fn() + Send + Sync>>>,
}

// === impl Epoch ===

impl Epoch {
    /// The epoch this instance last saw (0: none yet), sent with every call.
    pub(super) fn known(&self) -> u64 {
        self.known.load(Ordering::Acquire)
    }

    /// What to do when Redis lost its data: put back the slots this instance holds.
    pub(super) fn on_lost(&self, put_back: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_lost.set(Box::new(put_back));
    }

    /// What to do once a recovery window ends: wake the requests waiting for a slot, which it refused.
    pub(super) fn on_window_end(&self, wake: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_window_end.set(Box::new(wake));
    }

    /// A reply at `now_ms` told `epoch` (0: the call had no marker) and the end of a recovery window under way
    /// (0: none). A later epoch than the one this instance knew means Redis lost the data it vouched for: logged
    /// once, counted in `tollgate_store_resets_total`, and the slots held are put back. An earlier one is a reply
    /// overtaken by a later one, and the first an instance sees is no news. A window's end wakes, once, the
    /// requests waiting for a slot: nothing else would tell them (no slot was released).
    pub(super) fn observe(&self, epoch: u64, window_end: u64, now_ms: i64) {
        if epoch == 0 {
            return;
        }
        if window_end > self.window_end.fetch_max(window_end, Ordering::AcqRel) {
            self.wake_at(window_end, now_ms);
        }
        let before = self.known.fetch_max(epoch, Ordering::AcqRel);
        if before == 0 || epoch <= before {
            return;
        }
        metrics::counter!("tollgate_store_resets_total").increment(1);
        tracing::warn!(
            "redis lost state (restarted without its data, flushed, failed over to a replica that missed writes, \
             or refused every write for a while): what it counted is gone, and concurrency limits admit no new \
             slot for {RECOVERY} while every instance puts back the slots its requests hold"
        );
        if let Some(put_back) = self.on_lost.get() {
            put_back();
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
