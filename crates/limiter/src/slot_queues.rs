//! The requests of this instance waiting for a slot of a full `concurrency` key (`queue:`): one line per key, in
//! arrival order, whose first is woken when a slot of its key may have come free (a release heard in this process
//! or over Redis's publish/subscribe), a count per limit that bounds how many wait, and the `max` the running config
//! gives each limit (a request that waits through a reload is admitted by the new one).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// The lines of waiting requests of one instance. Touched only by requests that wait and by the releases of limits
/// with a queue: a request that finds a slot never comes here.
#[derive(Debug, Default)]
pub struct SlotQueues {
    lines: Mutex<Lines>,
    /// Per limit (its store keys' common head): its `max` in the running config, once a reload set them. A waiting
    /// request asks with its own config, which a reload may have replaced.
    running_max: Mutex<HashMap<String, u64>>,
}

#[derive(Debug, Default)]
struct Lines {
    /// Per store key: its waiting requests, first come first.
    keys: HashMap<String, VecDeque<Waiter>>,
    /// Per limit (its store keys' common head): how many of its requests wait, whatever their key.
    per_limit: HashMap<String, u64>,
    next: u64,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    woken: Arc<Notify>,
}

/// One request's place in the line of its key, given up when dropped (its client went away, it was admitted, or it
/// stopped waiting): the next in line is then first, and woken to ask at once.
#[derive(Debug)]
pub struct Place {
    queues: Arc<SlotQueues>,
    key: String,
    limit: String,
    id: u64,
    woken: Arc<Notify>,
}

// === impl SlotQueues ===

impl SlotQueues {
    /// A place at the end of `key`'s line, for a request of `limit` (the head its store keys share), unless
    /// `max_waiting` of that limit's requests wait already.
    pub fn join(self: &Arc<Self>, limit: &str, key: &str, max_waiting: u64) -> Option<Place> {
        let woken = Arc::new(Notify::new());
        let mut lines = self.lines.lock();
        let waiting = lines.per_limit.entry(limit.to_owned()).or_insert(0);
        if *waiting >= max_waiting {
            return None;
        }
        *waiting += 1;
        lines.next += 1;
        let id = lines.next;
        lines
            .keys
            .entry(key.to_owned())
            .or_default()
            .push_back(Waiter {
                id,
                woken: Arc::clone(&woken),
            });
        Some(Place {
            queues: Arc::clone(self),
            key: key.to_owned(),
            limit: limit.to_owned(),
            id,
            woken,
        })
    }

    /// A slot of `key` may have come free: its first waiting request asks again (at once, or as soon as it is done
    /// asking, so that a release heard meanwhile is never lost).
    pub fn released(&self, key: &str) {
        if let Some(first) = self.lines.lock().keys.get(key).and_then(VecDeque::front) {
            first.woken.notify_one();
        }
    }

    /// Releases may have gone unheard (the subscriber reconnected, or fell behind): the first of every line asks.
    pub fn wake_all(&self) {
        for line in self.lines.lock().keys.values() {
            if let Some(first) = line.front() {
                first.woken.notify_one();
            }
        }
    }

    /// The running config's `max` of every `concurrency` limit, by the head of its store keys: the waiting
    /// requests ask with these from now on. Every line's first asks again at once: a raised `max` has room for it.
    pub fn set_running_max(&self, maxes: impl IntoIterator<Item = (String, u64)>) {
        *self.running_max.lock() = maxes.into_iter().collect();
        self.wake_all();
    }

    /// The running config's `max` of the limit whose store keys start with `head`; `None` before a reload said,
    /// or for a limit the running config no longer has (its waiting requests keep their own).
    pub fn running_max(&self, head: &str) -> Option<u64> {
        self.running_max.lock().get(head).copied()
    }

    /// How many requests of this instance wait for a slot of `key`.
    pub fn waiting(&self, key: &str) -> usize {
        self.lines.lock().keys.get(key).map_or(0, VecDeque::len)
    }
}

// === impl Place ===

impl Place {
    /// Whether this request is first in its key's line: only the first asks for a slot, so that the requests of
    /// this instance are admitted in the order they came.
    pub fn is_first(&self) -> bool {
        let lines = self.queues.lines.lock();
        lines
            .keys
            .get(&self.key)
            .and_then(VecDeque::front)
            .is_some_and(|first| first.id == self.id)
    }

    /// Until this request is woken: first in line with a slot maybe free, or newly first.
    pub async fn woken(&self) {
        self.woken.notified().await;
    }

    /// The store key this request waits for.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut lines = self.queues.lines.lock();
        if let Some(waiting) = lines.per_limit.get_mut(&self.limit) {
            *waiting = waiting.saturating_sub(1);
            if *waiting == 0 {
                lines.per_limit.remove(&self.limit);
            }
        }
        let Some(line) = lines.keys.get_mut(&self.key) else {
            return;
        };
        let was_first = line.front().is_some_and(|first| first.id == self.id);
        line.retain(|waiter| waiter.id != self.id);
        match line.front() {
            None => {
                lines.keys.remove(&self.key);
            }
            // The next is first now: it asks at once (the slot this one was woken for may still be free, or this
            // one took it and another is free too).
            Some(next) if was_first => next.woken.notify_one(),
            Some(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_first_in_the_order_they_joined_and_leaving_wakes_the_next() {
        let queues = Arc::new(SlotQueues::default());
        let a = queues.join("l", "k", 10).expect("a");
        let b = queues.join("l", "k", 10).expect("b");
        let c = queues.join("l", "k", 10).expect("c");
        assert!(a.is_first() && !b.is_first() && !c.is_first());
        // A request that leaves from the middle changes nobody's turn.
        drop(b);
        assert!(a.is_first() && !c.is_first());
        drop(a);
        assert!(c.is_first());
        // Woken when it became first: its wake-up is waiting for it.
        let woken = futures_util::FutureExt::now_or_never(c.woken());
        assert!(woken.is_some(), "the new first was woken");
        assert_eq!(queues.waiting("k"), 1);
        drop(c);
        assert_eq!(queues.waiting("k"), 0);
        assert!(queues.lines.lock().keys.is_empty() && queues.lines.lock().per_limit.is_empty());
    }

    #[test]
    fn at_most_max_waiting_of_one_limit_wait_whatever_their_keys() {
        let queues = Arc::new(SlotQueues::default());
        let a = queues.join("l", "k1", 2).expect("a");
        let _b = queues.join("l", "k2", 2).expect("b");
        assert!(queues.join("l", "k3", 2).is_none(), "the third is refused");
        assert!(
            queues.join("other", "k1", 2).is_some(),
            "another limit counts apart"
        );
        drop(a);
        assert!(queues.join("l", "k3", 2).is_some(), "room again");
    }

    #[test]
    fn a_release_wakes_only_the_first_of_its_key_and_is_kept_until_it_listens() {
        let queues = Arc::new(SlotQueues::default());
        let a = queues.join("l", "k", 10).expect("a");
        let b = queues.join("l", "k", 10).expect("b");
        queues.released("k");
        queues.released("other");
        assert!(futures_util::FutureExt::now_or_never(a.woken()).is_some());
        assert!(futures_util::FutureExt::now_or_never(b.woken()).is_none());
        queues.wake_all();
        assert!(futures_util::FutureExt::now_or_never(a.woken()).is_some());
    }

    #[test]
    fn the_running_max_replaces_the_last_and_wakes_every_line() {
        let queues = Arc::new(SlotQueues::default());
        assert_eq!(queues.running_max("l"), None);
        let a = queues.join("l", "k", 10).expect("a");
        queues.set_running_max([("l".to_owned(), 2)]);
        assert_eq!(queues.running_max("l"), Some(2));
        assert!(futures_util::FutureExt::now_or_never(a.woken()).is_some());
        queues.set_running_max([("other".to_owned(), 4)]);
        assert_eq!(queues.running_max("l"), None, "a limit the config dropped");
    }
}
