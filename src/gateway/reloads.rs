//! The last config reloads tried, kept for `/stats`: when, whether the config was applied, and why not.

use std::collections::VecDeque;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// Reloads kept, the newest first out.
const KEPT: usize = 10;
/// The most of a refusal's message kept: a located config error names every field it found wrong.
const MESSAGE_MAX: usize = 2_000;

/// One reload tried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reload {
    /// When, ms since the epoch.
    pub at_ms: i64,
    /// Why the config was not applied (`None`: it was).
    pub refused: Option<String>,
}

/// The last [`KEPT`] reloads.
#[derive(Debug, Default)]
pub(super) struct Reloads(Mutex<VecDeque<Reload>>);

// === impl Reloads ===

impl Reloads {
    /// Notes a reload tried now, `refused` for that reason or applied.
    pub(super) fn push(&self, refused: Option<&str>) {
        let at_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_millis() as i64);
        let refused = refused.map(|message| {
            let mut end = message.len().min(MESSAGE_MAX);
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message[..end].to_owned()
        });
        let mut reloads = self.0.lock();
        if reloads.len() == KEPT {
            reloads.pop_front();
        }
        reloads.push_back(Reload { at_ms, refused });
    }

    /// The reloads kept, the newest first.
    pub(super) fn last(&self) -> Vec<Reload> {
        self.0.lock().iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_ten_reloads_are_kept_newest_first_with_their_messages_bounded() {
        let reloads = Reloads::default();
        reloads.push(Some(&"é".repeat(MESSAGE_MAX)));
        for _ in 0..KEPT - 1 {
            reloads.push(None);
        }
        let last = reloads.last();
        assert_eq!(last.len(), KEPT);
        let oldest = last[KEPT - 1].refused.as_deref().expect("the refusal");
        assert!(oldest.len() <= MESSAGE_MAX && oldest.starts_with('é'));
        reloads.push(Some("bad"));
        let last = reloads.last();
        assert_eq!(last.len(), KEPT);
        assert_eq!(last[0].refused.as_deref(), Some("bad"));
        assert!(last.iter().skip(1).all(|r| r.refused.is_none()));
    }
}
