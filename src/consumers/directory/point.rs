//! The moment of the store the directory's tables are complete for: the change counter read, and its lineage.

use std::sync::Arc;

/// The store's change counter the tables are complete for (every change up to it in, none missed), and the lineage
/// it counts in. `version` is `None` before the first full read, and always for the in-process directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Point {
    pub(super) version: Option<u64>,
    /// The lineage of the counter `version` counts in (see the scripts): `None` when the store has none yet.
    pub(super) lineage: Option<Arc<str>>,
    /// The change the tables were last complete for, kept when they no longer are (a change of another lineage
    /// was heard): `None` before the first full read.
    pub(super) last: Option<u64>,
}

#[cfg(feature = "redis")]
impl Point {
    /// The store at change `version` of `lineage`.
    pub(super) fn at(version: u64, lineage: Option<&str>) -> Self {
        Self {
            version: Some(version),
            lineage: lineage.map(Arc::from),
            last: Some(version),
        }
    }

    /// The tables are complete for no moment of the store (until the next full read).
    pub(super) fn lose_completeness(&mut self) {
        self.version = None;
    }

    /// Whether the store at change `version` of `lineage` is this moment.
    pub(super) fn is_at(&self, version: u64, lineage: Option<&str>) -> bool {
        self.version == Some(version) && self.lineage.as_deref() == lineage
    }

    /// Whether a store now at change `version` of `lineage` lost what was read from it at this moment: its counter
    /// started again (another lineage) or went back (a Redis restarted from an older save).
    pub(super) fn lost_by(&self, version: u64, lineage: Option<&str>) -> bool {
        let Some(had) = self.last.filter(|&had| had > 0) else {
            // Never read, or read before any change: nothing to lose.
            return false;
        };
        version < had || (self.lineage.is_some() && self.lineage.as_deref() != lineage)
    }
}
