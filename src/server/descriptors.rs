//! Running out of file descriptors: the main listener backs off (and says so once per episode), the admin
//! listener keeps answering on descriptors held back for it.

use std::fs::File;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};

/// Descriptors the binary holds back for the admin listener.
pub const ADMIN_RESERVE: usize = 4;
/// The main listener's first pause after an accept that failed for want of descriptors, doubled up to
/// [`LONGEST_PAUSE`] while it lasts: connections are closing meanwhile, and an accept loop that retries at once
/// spins a core and steals the descriptors they free.
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const LONGEST_PAUSE: Duration = Duration::from_secs(1);
/// How often the admin listener, out of descriptors with none held back left, tries again.
const ADMIN_RETRY: Duration = Duration::from_millis(50);

/// Descriptors held open (on `/dev/null`) so that the admin listener can still accept when the process has none
/// left: one is closed just before the admin listener's accept and opened again once descriptors are free.
#[derive(Debug)]
pub struct Reserve {
    held: Mutex<Vec<File>>,
    size: usize,
}

/// An episode of accepts failing for want of descriptors, on the main listener.
#[derive(Debug)]
pub(super) struct Exhaustion {
    started: Instant,
    failed: u64,
    pause: Duration,
}

/// The admin listener: a TCP listener that, out of descriptors, closes one held back in `reserve` and accepts
/// on it, instead of failing until connections close. For `axum::serve` (wrapped in `tap_io` for `ConnectInfo`).
#[derive(Debug)]
pub struct AdminListener {
    listener: TcpListener,
    reserve: Arc<Reserve>,
}

// === impl Reserve ===

impl Reserve {
    /// Holds `size` descriptors (as many as it can open now).
    pub fn new(size: usize) -> Arc<Self> {
        let reserve = Arc::new(Self {
            held: Mutex::new(Vec::with_capacity(size)),
            size,
        });
        reserve.refill();
        reserve
    }

    /// How many descriptors are held now.
    pub fn held(&self) -> usize {
        self.held.lock().len()
    }

    /// Opens descriptors again up to the reserve's size, as far as the process has any.
    pub fn refill(&self) {
        let mut held = self.held.lock();
        while held.len() < self.size {
            match File::open("/dev/null") {
                Ok(file) => held.push(file),
                Err(_) => break,
            }
        }
    }

    /// Closes one held descriptor, so that the next one the process opens can be had; false when none is held.
    fn release_one(&self) -> bool {
        self.held.lock().pop().is_some()
    }
}

// === impl Exhaustion ===

impl Exhaustion {
    /// The first failed accept of an episode: logged at WARN, once.
    pub(super) fn begin(error: &io::Error) -> Self {
        tracing::warn!(
            %error,
            "cannot accept connections: out of file descriptors; new connections wait in the listen queue while \
             accepting backs off (up to {LONGEST_PAUSE:?} apart), the admin listener keeps answering"
        );
        Self {
            started: Instant::now(),
            failed: 1,
            pause: FIRST_PAUSE,
        }
    }

    /// Another failed accept: how long to wait before the next.
    pub(super) fn again(&mut self) -> Duration {
        self.failed += 1;
        self.pause = (self.pause * 2).min(LONGEST_PAUSE);
        self.pause
    }

    /// The first pause.
    pub(super) fn pause(&self) -> Duration {
        self.pause
    }

    /// An accept succeeded: the episode is over, said once with its count.
    pub(super) fn end(self) {
        tracing::warn!(
            failed = self.failed,
            lasted = ?self.started.elapsed(),
            "accepting connections again: file descriptors are free"
        );
    }
}

/// Whether `error` says the process (or the system) has no descriptor (or buffer) left for a new socket.
pub(super) fn out_of_descriptors(error: &io::Error) -> bool {
    // EMFILE, ENFILE, ENOBUFS, ENOMEM (Linux numbering; the first two are the same on the BSDs and macOS).
    matches!(error.raw_os_error(), Some(24 | 23 | 105 | 12))
}

/// Whether `error` concerns one connection only (reset or aborted before it was accepted): nothing to wait for.
pub(super) fn connection_error(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
    )
}

// === impl AdminListener ===

impl AdminListener {
    /// `listener`, accepting on `reserve`'s descriptors when the process has none left.
    pub fn new(listener: TcpListener, reserve: Arc<Reserve>) -> Self {
        Self { listener, reserve }
    }
}

impl axum::serve::Listener for AdminListener {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.listener.accept().await {
                Ok(accepted) => {
                    self.reserve.refill();
                    return accepted;
                }
                Err(error) if out_of_descriptors(&error) => {
                    // The descriptor closed here is the one the accept takes (unless another thread opens one
                    // first: then the next held one goes, and after that the admin waits like everyone else).
                    if !self.reserve.release_one() {
                        tracing::debug!(%error, "admin listener out of file descriptors, none held back left");
                        tokio::time::sleep(ADMIN_RETRY).await;
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "admin accept failed");
                    if !connection_error(&error) {
                        tokio::time::sleep(ADMIN_RETRY).await;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}
