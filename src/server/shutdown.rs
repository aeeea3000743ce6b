//! The shutdown sequence balancers need: readiness fails first, the listener serves on for
//! `server.shutdown_delay` while they notice, then it closes and in-flight requests get `server.shutdown_grace`;
//! a second signal cuts whichever wait is under way.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::{watch, Notify};

use super::drain::Drain;

/// Where the gateway stands in its shutdown: one per gateway, shared by the servers that serve it.
#[derive(Debug, Default)]
pub struct Shutdown {
    draining: AtomicBool,
    cut: AtomicBool,
    cut_notify: Notify,
    /// The connections each server of this gateway watches, counted for the log line that begins the drain.
    servers: parking_lot::Mutex<Vec<watch::Sender<()>>>,
}

// === impl Shutdown ===

impl Shutdown {
    /// Starts draining: `/readyz` answers 503 `draining` from now on, and HTTP/1 answers carry
    /// `Connection: close`. True the first time.
    pub fn begin(&self) -> bool {
        let first = !self.draining.swap(true, Ordering::AcqRel);
        if first {
            metrics::gauge!("tollgate_draining").set(1.0);
        }
        first
    }

    /// Whether the gateway is draining.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Counts the connections `drain` watches in [`open_connections`](Self::open_connections).
    pub(super) fn count(&self, drain: &Drain) {
        self.servers.lock().push(drain.counter());
    }

    /// A hold for a WebSocket tunnel being opened, which the first server's drain waits for until it is dropped
    /// (`None` when no server runs: the handler serves through another front, tests or a layer). A bare receiver,
    /// never read: what holds it (proxy's tunnel) need not know the server.
    pub fn drain_hold(&self) -> Option<watch::Receiver<()>> {
        self.servers.lock().first().map(Drain::hold)
    }

    /// The connections open now on every server of this gateway, WebSocket tunnels included.
    pub fn open_connections(&self) -> usize {
        self.servers
            .lock()
            .iter()
            .map(watch::Sender::receiver_count)
            .sum()
    }

    /// Ends the waits at once (a second signal): the delay, then the grace period.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        self.cut_notify.notify_waiters();
    }

    /// Completes once [`cut`](Self::cut) was called (at once if it was already).
    pub async fn cut_requested(&self) {
        loop {
            let notified = self.cut_notify.notified();
            if self.cut.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_cut_ends_every_wait_present_and_future() {
        let shutdown = std::sync::Arc::new(Shutdown::default());
        assert!(shutdown.begin());
        assert!(!shutdown.begin(), "only the first signal begins");
        assert!(shutdown.is_draining());
        let waiting = tokio::spawn({
            let shutdown = shutdown.clone();
            async move { shutdown.cut_requested().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        shutdown.cut();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("the waiting task ended")
            .expect("task");
        tokio::time::timeout(Duration::from_secs(5), shutdown.cut_requested())
            .await
            .expect("a later wait ends at once");
    }
}
