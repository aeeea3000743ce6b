//! Graceful shutdown of served connections: each is asked to finish what it is serving, and the server waits for it.
//!
//! hyper-util's `GracefulShutdown` does the same but only watches the connection types it knows, and hyper's HTTP/1
//! connection with upgrades (needed to pass WebSocket handshakes through) is not one of them.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;
use tokio::sync::watch;

/// The server's side: signals shutdown and waits for the watched connections.
#[derive(Debug)]
pub(super) struct Drain {
    /// Counts the watchers (its receivers), which `shutdown` waits to see gone.
    signal: watch::Sender<()>,
    begun: Arc<Begun>,
}

/// A connection's side: learns of shutdown; the server waits until every watcher is dropped.
#[derive(Debug)]
pub(super) struct DrainWatcher {
    /// Held to be counted: the server waits until every one is dropped.
    _counted: watch::Receiver<()>,
    begun: Arc<Begun>,
}

/// Whether shutdown began, and the connections to wake when it does.
///
/// Every connection polls it at each of its wakes (two or three a request), so a poll is an atomic load and a
/// waker comparison: a watch channel's `changed` took its lock and compared wakers under it, 262 instructions a
/// request more (`bench/gateway_cost.py --only off`).
#[derive(Debug, Default)]
struct Begun {
    flag: AtomicBool,
    /// The wakers of the connections waiting, by slot; freed slots are reused.
    waiting: Mutex<Slots>,
}

#[derive(Debug, Default)]
struct Slots {
    wakers: Vec<Option<Waker>>,
    free: Vec<usize>,
}

/// Ready once shutdown has begun.
struct ShutdownBegun<'a> {
    begun: &'a Begun,
    /// The slot of the waker registered, and that waker (to tell whether a poll brings another).
    registered: Option<(usize, Waker)>,
}

// === impl Drain ===

impl Drain {
    pub(super) fn new() -> Self {
        Self {
            signal: watch::channel(()).0,
            begun: Arc::default(),
        }
    }

    /// A watcher for a connection about to be served; one made once shutdown has begun is asked to finish at once.
    pub(super) fn watcher(&self) -> DrainWatcher {
        DrainWatcher {
            _counted: self.signal.subscribe(),
            begun: Arc::clone(&self.begun),
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
        self.begun.begin();
        self.signal.closed().await;
    }
}

// === impl DrainWatcher ===

impl DrainWatcher {
    /// Runs `connection` to its end; if shutdown begins first, `start_draining` asks it to finish the request in
    /// flight and close (hyper's `graceful_shutdown`), and it is run to that end. Pinned by the caller: taken by
    /// value, it would be held twice in this future (as the argument and pinned), for as long as it is served.
    pub(super) async fn watch<C: Future>(
        self,
        mut connection: Pin<&mut C>,
        start_draining: impl FnOnce(Pin<&mut C>),
    ) -> C::Output {
        tokio::select! {
            // The connection first: under load it is the one with work, and the signal comes once.
            biased;
            output = connection.as_mut() => return output,
            () = self.begun.wait() => {}
        }
        start_draining(connection.as_mut());
        let output = connection.await;
        // Held until here: the server waits for the last watcher to go.
        drop(self);
        output
    }
}

// === impl Begun ===

impl Begun {
    fn wait(&self) -> ShutdownBegun<'_> {
        ShutdownBegun {
            begun: self,
            registered: None,
        }
    }

    /// Sets the flag, then wakes whoever registered before it was set (a registration checks the flag again under
    /// the lock, so none is missed).
    fn begin(&self) {
        self.flag.store(true, Ordering::Release);
        let wakers = std::mem::take(&mut self.waiting.lock().wakers);
        for waker in wakers.into_iter().flatten() {
            waker.wake();
        }
    }

    fn has_begun(&self) -> bool {
        self.flag.load(Ordering::Acquire)
    }
}

impl Future for ShutdownBegun<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.begun.has_begun() {
            return Poll::Ready(());
        }
        if let Some((_, waker)) = &self.registered {
            if waker.will_wake(cx.waker()) {
                return Poll::Pending;
            }
        }
        let mut waiting = self.begun.waiting.lock();
        if self.begun.has_begun() {
            return Poll::Ready(());
        }
        let waker = cx.waker().clone();
        let slot = match self.registered {
            Some((slot, _)) => slot,
            None => match waiting.free.pop() {
                Some(slot) => slot,
                None => {
                    waiting.wakers.push(None);
                    waiting.wakers.len() - 1
                }
            },
        };
        waiting.wakers[slot] = Some(waker.clone());
        drop(waiting);
        self.registered = Some((slot, waker));
        Poll::Pending
    }
}

impl Drop for ShutdownBegun<'_> {
    fn drop(&mut self) {
        let Some((slot, _)) = self.registered.take() else {
            return;
        };
        let mut waiting = self.begun.waiting.lock();
        // Once shutdown began the slots are gone with the wakers they held.
        if let Some(held) = waiting.wakers.get_mut(slot) {
            *held = None;
            waiting.free.push(slot);
        }
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
    async fn a_connection_served_once_shutdown_has_begun_is_asked_to_finish_at_once() {
        let drain = Drain::new();
        // One connection waits through shutdown, and its slot is given back when it ends.
        let before = drain.watcher();
        let (finish, finished) = oneshot::channel::<()>();
        let first =
            tokio::spawn(
                async move { before.watch(std::pin::pin!(finished), |_| {}).await.is_ok() },
            );
        tokio::task::yield_now().await;
        let shutdown = {
            let begun = Arc::clone(&drain.begun);
            tokio::spawn(async move { begun.begin() })
        };
        shutdown.await.expect("begun");
        let (asked, was_asked) = oneshot::channel::<()>();
        let output = drain
            .watcher()
            .watch(std::pin::pin!(async { 7 }), move |_| {
                let _ = asked.send(());
            })
            .await;
        assert_eq!(output, 7);
        // A connection that ends at its first poll is never asked; one that is still serving is.
        assert!(was_asked.await.is_err());
        let late = drain.watcher();
        let (asked, was_asked) = oneshot::channel::<()>();
        let (_keep, pending) = oneshot::channel::<()>();
        let late = tokio::spawn(async move {
            late.watch(std::pin::pin!(pending), move |_| {
                let _ = asked.send(());
            })
            .await
        });
        tokio::time::timeout(Duration::from_secs(5), was_asked)
            .await
            .expect("asked at once")
            .expect("asked");
        late.abort();
        finish.send(()).expect("finish");
        assert!(first.await.expect("first"));
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
