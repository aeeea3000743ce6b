//! The pool's state and its idle connections: newest first out, the surplus and the expired closed, a reaper task.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use http::Uri;
use hyper_util::client::legacy::connect::HttpConnector;

use super::connect::Connection;
use super::send::PoolSettings;
use crate::proxy::health::TargetHealth;
use crate::proxy::tls::TlsDialer;

/// An idle connection gives back its buffers after this long unused (as a client's connection rests after a second
/// without a request): a busy pool keeps them from one request to the next, a quiet one holds sockets alone.
const REST_AFTER: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub(super) struct Shared {
    /// `http[s]://host:port` of the target, what the connector dials.
    pub(super) address: Uri,
    pub(super) connector: HttpConnector,
    /// For `https` targets: the handshake after the TCP connection, bounded by `connect_timeout`.
    pub(super) tls: Option<TlsDialer>,
    pub(super) connect_timeout: Duration,
    pub(super) settings: PoolSettings,
    /// Idle connections, the most recently used at the back.
    pub(super) idle: Mutex<VecDeque<IdleConnection>>,
    pub(super) reaper_started: AtomicBool,
    /// The target's passive health: told of its failures here and by the answers' bodies.
    pub(super) health: TargetHealth,
}

#[derive(Debug)]
pub(super) struct IdleConnection {
    connection: Connection,
    since: Instant,
}

#[cfg(test)]
impl IdleConnection {
    pub(super) fn buffered_capacity(&self) -> usize {
        self.connection.buffered_capacity()
    }
}

// === impl Shared ===

impl Shared {
    pub(super) fn lock_idle(&self) -> MutexGuard<'_, VecDeque<IdleConnection>> {
        // The queue stays consistent even if a holder panicked: every operation on it is a single push or pop.
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The most recently used idle connection that is still open, if any.
    #[inline]
    pub(super) fn checkout(&self) -> Option<Connection> {
        let mut idle = self.lock_idle();
        while let Some(mut connection) = idle.pop_back() {
            if connection.since.elapsed() >= self.settings.idle_timeout {
                // Everything before it has been idle even longer.
                let expired = std::mem::take(&mut *idle);
                drop(idle);
                drop(expired);
                return None;
            }
            if !connection.connection.closed_while_idle() {
                return Some(connection.connection);
            }
        }
        None
    }

    /// Takes back a connection whose answer was read to its end and whose target keeps it open.
    pub(super) fn checkin(self: &Arc<Self>, connection: Connection) {
        let surplus = {
            let mut idle = self.lock_idle();
            idle.push_back(IdleConnection {
                connection,
                since: Instant::now(),
            });
            (idle.len() > self.settings.max_idle).then(|| idle.pop_front())
        };
        drop(surplus);
        if !self.reaper_started.load(Ordering::Relaxed) {
            self.start_reaper();
        }
    }

    /// Closes the connections idle past the timeout, and those the target closed (no task watches an idle
    /// connection: this look is what notices a close that came, so its socket does not linger half closed); lets
    /// those idle for [`REST_AFTER`] rest.
    fn evict_expired(&self) {
        let mut evicted = Vec::new();
        {
            let mut idle = self.lock_idle();
            let mut kept = VecDeque::with_capacity(idle.len());
            for mut connection in idle.drain(..) {
                let idle_for = connection.since.elapsed();
                if idle_for >= self.settings.idle_timeout
                    || connection.connection.closed_while_idle()
                {
                    evicted.push(connection);
                } else {
                    if idle_for >= REST_AFTER {
                        connection.connection.rest();
                    }
                    kept.push_back(connection);
                }
            }
            *idle = kept;
        }
        drop(evicted);
    }

    /// Once per pool, a task that closes expired idle connections even when no request comes to find them. It
    /// holds the pool weakly, so it ends with the pool (a reload builds new ones).
    fn start_reaper(self: &Arc<Self>) {
        if self.reaper_started.swap(true, Ordering::Relaxed) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let pool: Weak<Self> = Arc::downgrade(self);
        let period = (self.settings.idle_timeout / 2)
            .min(REST_AFTER)
            .max(Duration::from_millis(10));
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                match pool.upgrade() {
                    Some(pool) => pool.evict_expired(),
                    None => return,
                }
            }
        });
    }
}
