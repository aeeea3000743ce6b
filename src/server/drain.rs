//! Graceful shutdown of served connections: each is asked to finish what it is serving, and the server waits for it.
//!
//! hyper-util's `GracefulShutdown` does the same but only watches the connection types it knows, and hyper's HTTP/1
//! connection with upgrades (needed to pass WebSocket handshakes through) is not one of them.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::watch;

/// The server's side: signals shutdown and waits for the watched connections.
#[derive(Debug)]
pub(super) struct Drain {
    signal: watch::Sender<()>,
}

/// A connection's side: learns of shutdown; the server waits until every watcher is dropped.
#[derive(Debug)]
pub(super) struct DrainWatcher {
    signal: watch::Receiver<()>,
}

// === impl Drain ===

impl Drain {
    pub(super) fn new() -> Self {
        Self {
            signal: watch::channel(()).0,
        }
    }

    /// A watcher for a connection about to be served. Taken from the server's own sender (never a cloned receiver),
    /// so a watcher made before `shutdown` always sees its signal.
    pub(super) fn watcher(&self) -> DrainWatcher {
        DrainWatcher {
            signal: self.signal.subscribe(),
        }
    }

    /// A hold on the drain counted by `signal` (a WebSocket tunnel's), which the server waits for as for a
    /// connection until it is dropped: a tunnel outlives the connection it came from.
    pub(super) fn hold(signal: &watch::Sender<()>) -> watch::Receiver<()> {
        signal.subscribe()
    }

    /// What counts the connections being served (their number is its receivers'), for [`super::Shutdown`].
    pub(super) fn counter(&self) -> watch::Sender<()> {
        self.signal.clone()
    }

    /// Connections still being served.
    pub(super) fn open(&self) -> usize {
        self.signal.receiver_count()
    }

    /// Tells every watched connection to finish, then waits until all have.
    pub(super) async fn shutdown(&self) {
        let _ = self.signal.send(());
        self.signal.closed().await;
    }
}

// === impl DrainWatcher ===

impl DrainWatcher {
    /// Runs `connection` to its end; if shutdown begins first, `start_draining` asks it to finish the request in
    /// flight and close (hyper's `graceful_shutdown`), and it is run to that end. Pinned by the caller: taken by
    /// value, it would be held twice in this future (as the argument and pinned), for as long as it is served.
    pub(super) async fn watch<C: Future>(
        mut self,
        mut connection: Pin<&mut C>,
        start_draining: impl FnOnce(Pin<&mut C>),
    ) -> C::Output {
        tokio::select! {
            // The connection first: under load it is the one with work, and the signal comes once.
            biased;
            output = connection.as_mut() => return output,
            _ = self.signal.changed() => {}
        }
        start_draining(connection.as_mut());
        let output = connection.await;
        // Held until here: the server waits for the last watcher to go.
        drop(self);
        output
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    #[tokio::test]
    async fn shutdown_asks_each_connection_to_finish_and_waits_for_it() {
        let drain = Drain::new();
        let (finish, finished) = oneshot::channel::<()>();
        let (asked, was_asked) = oneshot::channel::<()>();
        let watcher = drain.watcher();
        let served = tokio::spawn(async move {
            let connection = std::pin::pin!(async move {
                let _ = finished.await;
                "done"
            });
            watcher
                .watch(connection, move |_| {
                    let _ = asked.send(());
                })
                .await
        });
        assert_eq!(drain.open(), 1);
        let shutdown = tokio::spawn(async move { drain.shutdown().await });
        was_asked.await.expect("the connection was asked to finish");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!shutdown.is_finished(), "shutdown waits for the connection");
        finish.send(()).expect("finish");
        assert_eq!(served.await.expect("served"), "done");
        tokio::time::timeout(Duration::from_secs(5), shutdown)
            .await
            .expect("shutdown ends with the last connection")
            .expect("shutdown");
    }

    #[tokio::test]
    async fn a_tunnel_s_hold_outlives_its_connection_and_shutdown_waits_for_it() {
        let drain = Drain::new();
        let watcher = drain.watcher();
        let hold = Drain::hold(&drain.counter());
        // The connection ends at the upgrade; its tunnel goes on.
        watcher.watch(std::pin::pin!(async {}), |_| {}).await;
        assert_eq!(drain.open(), 1, "the tunnel counts as open");
        let shutdown = tokio::spawn(async move { drain.shutdown().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!shutdown.is_finished(), "shutdown waits for the tunnel");
        drop(hold);
        tokio::time::timeout(Duration::from_secs(5), shutdown)
            .await
            .expect("shutdown ends with the tunnel")
            .expect("shutdown");
    }

    #[tokio::test]
    async fn a_connection_that_ends_by_itself_is_not_asked_to_drain() {
        let drain = Drain::new();
        let output = drain
            .watcher()
            .watch(std::pin::pin!(async { 7 }), |_| panic!("asked to drain"))
            .await;
        assert_eq!(output, 7);
        assert_eq!(drain.open(), 0);
        tokio::time::timeout(Duration::from_secs(5), drain.shutdown())
            .await
            .expect("nothing to wait for");
    }
}
