//! Coalesces the checks of concurrent requests into one script call (as Gubernator batches), so that Redis and the
//! gateway pay one round trip, one write and one script evaluation for many requests instead of one each.
//!
//! No request waits for company: a check goes out when no call is in flight, after the runtime has read what
//! its sockets hold (see `gather`), and the checks that arrive while a call is in flight go together in the next
//! one. Each request's decision is the one a call of its own
//! would have given, in queue order (the script decides the batch one request after another).
//!
//! No timer per request either: each request carries its deadline, and a call is abandoned at the earliest
//! deadline in it, which drops the others' answers too; a request whose deadline passes while it
//! waits in the queue is dropped unsent. Either way it learns at once that it timed out, and falls back.
//!
//! One call at a time: Redis runs scripts one after another anyway, so a second call in flight only splits the
//! waiting requests into smaller batches, each paying the script's fixed cost (BENCHMARKS.md has the figures). Over
//! a network the batch grows with the round trip instead: up to `MAX_BATCH` requests per round trip.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::time::Instant;

use super::script::EncodedRequest;
use super::StoreError;
use crate::Outcome;

/// Requests per script call at most: bounds the time one call keeps Redis busy (other clients wait meanwhile).
const MAX_BATCH: usize = 128;
/// Script calls in flight at once.
const IN_FLIGHT: usize = 1;
/// Socket polls at most before a call takes the queue (see `gather`): bounds what a burst adds to a check's wait.
const GATHER_ROUNDS: usize = 5;
/// Polls in a row that bring no check and end the gathering: one quiet poll says little when requests come in
/// from other cores all the time (stopping at the first gave calls of 35 requests instead of 43-50).
const QUIET_ROUNDS: usize = 2;
/// Checks waiting for a call at most; beyond, checks fail at once (and fall back) instead of queueing.
const QUEUE_CAPACITY: usize = 16_384;

/// Runs the script for a batch of requests, all on one connection.
pub(super) trait RunBatch: Send + Sync + 'static {
    /// Sends one call (or, on Redis Cluster, one per hash slot) for `batch` and answers every request in it; a
    /// call not yet sent by `deadline` (the earliest of its requests') must never be sent.
    fn run(
        self: Arc<Self>,
        batch: Vec<Pending>,
        deadline: Instant,
    ) -> impl std::future::Future<Output = ()> + Send;
}

/// The handle requests queue their checks through; the task behind it ends when every handle is dropped.
#[derive(Debug, Clone)]
pub(super) struct Batcher {
    queue: mpsc::Sender<Pending>,
}

/// One request waiting for its decision.
#[derive(Debug)]
pub(super) struct Pending {
    /// The hash slot of the request's keys (Redis Cluster only).
    pub slot: Option<u16>,
    pub request: EncodedRequest,
    /// When the request stops waiting: its call is abandoned, or it is dropped unsent; the script leaves it
    /// undecided if it reaches Redis later.
    pub deadline: Instant,
    /// A settlement's (a give-back's or a debt's): when the request it settles was decided (Redis's ms), which the
    /// script is sent in place of a deadline.
    pub decided_ms: Option<u64>,
    pub reply: Reply,
}

/// Where a queued request's outcome goes.
#[derive(Debug)]
pub(super) enum Reply {
    /// To a caller waiting for it.
    Waiting(oneshot::Sender<Result<Outcome, StoreError>>),
    /// To work told whether a settlement landed, which nobody waits for.
    Landed(Landed),
}

/// What is told whether a queued settlement landed: once, with its call's result, or with a timeout if it is
/// dropped untold (past its deadline, its call abandoned).
pub(crate) struct Landed {
    then: Option<Then>,
    budget: Duration,
}

/// The work a [`Landed`] tells.
type Then = Box<dyn FnOnce(Result<(), StoreError>) + Send>;

// === impl Batcher ===

impl Batcher {
    /// Starts the batching task: `IN_FLIGHT` calls at once, each for up to `MAX_BATCH` requests.
    ///
    /// A call still unanswered at the earliest deadline of its requests is abandoned (the others in it time out
    /// with that one: a stalled connection answers none of them), so that it holds up no later batch: the next
    /// call goes out on the next connection of the pool.
    pub(super) fn start<R: RunBatch>(runner: Arc<R>) -> Self {
        let (queue, waiting) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(coalesce(
            runner,
            waiting,
            Arc::new(Semaphore::new(IN_FLIGHT)),
        ));
        Self { queue }
    }

    /// Queues one request and waits for its decision, at most `budget`.
    pub(super) async fn check(
        &self,
        slot: Option<u16>,
        request: EncodedRequest,
        budget: Duration,
    ) -> Result<Outcome, StoreError> {
        let (reply, decision) = oneshot::channel();
        self.queue
            .try_send(Pending {
                slot,
                request,
                deadline: Instant::now() + budget,
                decided_ms: None,
                reply: Reply::Waiting(reply),
            })
            .map_err(|_| StoreError::Busy)?;
        // Dropped unanswered means past the deadline: abandoned with its call, or never sent.
        decision.await.unwrap_or(Err(StoreError::Timeout(budget)))
    }

    /// Queues a settlement (a give-back or a debt, all its keys in `slot`) of a request decided at `decided_ms`
    /// (Redis's ms), to go out with the next call, and waits at most `budget` to learn whether it landed. It is
    /// sent at most once: a call that fails or times out is not sent again (it may have run).
    pub(super) async fn settle(
        &self,
        slot: Option<u16>,
        request: EncodedRequest,
        decided_ms: u64,
        budget: Duration,
    ) -> Result<(), StoreError> {
        let (reply, settled) = oneshot::channel();
        self.queue
            .try_send(Pending {
                slot,
                request,
                deadline: Instant::now() + budget,
                decided_ms: Some(decided_ms),
                reply: Reply::Waiting(reply),
            })
            .map_err(|_| StoreError::Busy)?;
        settled
            .await
            .unwrap_or(Err(StoreError::Timeout(budget)))
            .map(drop)
    }

    /// [`settle`](Self::settle) without waiting: `landed` is told whether it landed, from the task that runs the
    /// call (or at once, when the queue is full). `decided_ms` is `None` for what is not tied to a decision's
    /// window (a slot's release), which then has a deadline as a check does.
    pub(super) fn settle_then(
        &self,
        slot: Option<u16>,
        request: EncodedRequest,
        decided_ms: Option<u64>,
        landed: Landed,
    ) {
        let pending = Pending {
            slot,
            request,
            deadline: Instant::now() + landed.budget,
            decided_ms,
            reply: Reply::Landed(landed),
        };
        if let Err(refused) = self.queue.try_send(pending) {
            refused.into_inner().answer(Err(StoreError::Busy));
        }
    }
}

// === impl Landed ===

impl Landed {
    /// Tells `then` whether the settlement landed, or that it did not within `budget` if it is dropped untold.
    pub(crate) fn new(
        budget: Duration,
        then: impl FnOnce(Result<(), StoreError>) + Send + 'static,
    ) -> Self {
        Self {
            then: Some(Box::new(then)),
            budget,
        }
    }

    fn tell(mut self, result: Result<(), StoreError>) {
        if let Some(then) = self.then.take() {
            then(result);
        }
    }
}

impl Drop for Landed {
    fn drop(&mut self) {
        if let Some(then) = self.then.take() {
            then(Err(StoreError::Timeout(self.budget)));
        }
    }
}

impl std::fmt::Debug for Landed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Landed")
            .field("told", &self.then.is_none())
            .finish()
    }
}

// === impl Pending ===

impl Pending {
    /// Answers the request (which may have stopped waiting: it timed out and fell back).
    pub(super) fn answer(self, result: Result<Outcome, StoreError>) {
        match self.reply {
            Reply::Waiting(reply) => {
                let _ = reply.send(result);
            }
            Reply::Landed(landed) => landed.tell(result.map(drop)),
        }
    }

    /// Whether nobody waits for the outcome any more (a settlement's is always awaited by its work).
    fn abandoned(&self) -> bool {
        match &self.reply {
            Reply::Waiting(reply) => reply.is_closed(),
            Reply::Landed(_) => false,
        }
    }
}

/// Takes what queued up while the previous calls were in flight and sends it as one call.
async fn coalesce<R: RunBatch>(
    runner: Arc<R>,
    mut waiting: mpsc::Receiver<Pending>,
    in_flight: Arc<Semaphore>,
) {
    while let Some(first) = waiting.recv().await {
        // Waiting for a free call slot is what lets a batch grow: meanwhile more requests queue up.
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        gather(&waiting).await;
        let mut batch = Vec::with_capacity(MAX_BATCH.min(waiting.len() + 1));
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match waiting.try_recv() {
                Ok(pending) => batch.push(pending),
                Err(_) => break,
            }
        }
        // A request past its deadline has timed out (dropping it tells it so), and one whose caller is gone
        // needs no decision: deciding either would consume for nothing.
        let now = Instant::now();
        batch.retain(|pending| pending.deadline > now && !pending.abandoned());
        let Some(deadline) = batch.iter().map(|pending| pending.deadline).min() else {
            continue;
        };
        let call = runner.clone().run(batch, deadline);
        // Dropping an abandoned call drops its requests' reply senders; either way the call slot is free.
        tokio::spawn(async move {
            let _ = tokio::time::timeout_at(deadline, call).await;
            drop(permit);
        });
    }
}

/// Lets the runtime poll its sockets before a call takes the queue, for as long as each poll brings more checks
/// (at most `GATHER_ROUNDS` times): requests that arrived meanwhile are read and queue their checks, and join this
/// call instead of waiting for the next. tokio runs a yielding task again only after it has polled the I/O driver
/// and run the tasks that poll woke, so each round reads what came in during the previous one.
///
/// Under load this makes calls fuller, and each request's share of a call cheaper for Redis and the gateway alike:
/// one round took calls from 23 requests on average to 32 (bench/run.sh's target 3, 64 connections), rounds until
/// nothing new comes to 43-50. With nothing else to run it costs `QUIET_ROUNDS` non-blocking polls.
async fn gather(waiting: &mpsc::Receiver<Pending>) {
    let mut queued = waiting.len();
    let mut quiet_rounds = 0;
    for _ in 0..GATHER_ROUNDS {
        tokio::task::yield_now().await;
        let now_queued = waiting.len();
        quiet_rounds = if now_queued == queued {
            quiet_rounds + 1
        } else {
            0
        };
        // The batch takes the check that woke the task besides those queued.
        if quiet_rounds == QUIET_ROUNDS || now_queued + 1 >= MAX_BATCH {
            return;
        }
        queued = now_queued;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::store::script::Mode;
    use crate::store::LimitCheck;
    use crate::{Algorithm, Decision, Limit};

    /// Records the size of every batch; unless `answers_first`, the first call never answers (a stalled
    /// connection); the others answer every request at once.
    #[derive(Default)]
    struct Recorder {
        batches: Mutex<Vec<usize>>,
        answers_first: bool,
    }

    impl RunBatch for Recorder {
        async fn run(self: Arc<Self>, batch: Vec<Pending>, _deadline: Instant) {
            let first = {
                let mut batches = self.batches.lock().expect("lock");
                batches.push(batch.len());
                batches.len() == 1
            };
            if first && !self.answers_first {
                std::future::pending::<()>().await;
            }
            for pending in batch {
                pending.answer(Ok(Outcome {
                    allowed: true,
                    decisions: vec![Decision {
                        allowed: true,
                        limit: 1,
                        remaining: 0,
                        retry_after_ms: 0,
                        reset_after_ms: 0,
                        delay_ms: 0,
                        owed: 0,
                    }],
                    batch: 0,
                }));
            }
        }
    }

    fn request() -> EncodedRequest {
        let limit = Limit::new(
            "l",
            Algorithm::FixedWindow {
                limit: 1,
                period_ms: 1_000,
            },
            1,
        )
        .expect("valid");
        EncodedRequest::new(
            &[LimitCheck {
                key: "k",
                limit: &limit,
            }],
            Mode::Commit,
        )
    }

    /// Starts `n` checks, each in a task of its own; gives them time to queue.
    async fn checks(
        batcher: &Batcher,
        n: usize,
    ) -> Vec<tokio::task::JoinHandle<Result<Outcome, StoreError>>> {
        let tasks = (0..n)
            .map(|_| {
                let batcher = batcher.clone();
                tokio::spawn(async move {
                    batcher
                        .check(None, request(), Duration::from_millis(25))
                        .await
                })
            })
            .collect();
        tokio::task::yield_now().await;
        tasks
    }

    #[tokio::test(start_paused = true)]
    async fn requests_queued_behind_a_call_go_together_and_a_stalled_call_is_abandoned() {
        let recorder = Arc::new(Recorder::default());
        let batcher = Batcher::start(recorder.clone());
        // The first request goes out alone and its call stalls.
        let first = checks(&batcher, 1).await;
        // Five more arrive 10 ms later, while it is in flight.
        tokio::time::advance(Duration::from_millis(10)).await;
        let started = Instant::now();
        let others = checks(&batcher, 5).await;
        for other in others {
            assert!(other.await.expect("task").expect("decided").allowed);
        }
        // They waited for the stalled call to be abandoned at its deadline, not longer.
        assert_eq!(started.elapsed(), Duration::from_millis(15));
        for first in first {
            assert!(
                matches!(first.await.expect("task"), Err(StoreError::Timeout(_))),
                "the abandoned call's request timed out"
            );
        }
        assert_eq!(*recorder.batches.lock().expect("lock"), [1, 5]);
    }

    #[tokio::test(start_paused = true)]
    async fn requests_whose_deadline_passes_in_the_queue_time_out_unsent() {
        let recorder = Arc::new(Recorder::default());
        let batcher = Batcher::start(recorder.clone());
        let started = Instant::now();
        // The first call stalls, and the five requests queued behind it at once reach their deadline with it.
        let first = checks(&batcher, 1).await;
        // Once the first call has gathered what it could and gone out.
        for _ in 0..=GATHER_ROUNDS {
            tokio::task::yield_now().await;
        }
        assert_eq!(*recorder.batches.lock().expect("lock"), [1]);
        let others = checks(&batcher, 5).await;
        for check in first.into_iter().chain(others) {
            assert!(matches!(
                check.await.expect("task"),
                Err(StoreError::Timeout(_))
            ));
        }
        assert_eq!(started.elapsed(), Duration::from_millis(25));
        assert_eq!(*recorder.batches.lock().expect("lock"), [1]);
        // Requests after the stall are sent and decided.
        for check in checks(&batcher, 2).await {
            assert!(check.await.expect("task").expect("decided").allowed);
        }
        assert_eq!(*recorder.batches.lock().expect("lock"), [1, 2]);
    }

    /// A batcher whose calls all answer at once, and the recorder of its calls.
    fn answering_batcher() -> (Arc<Recorder>, Batcher) {
        let recorder = Arc::new(Recorder {
            answers_first: true,
            ..Recorder::default()
        });
        let batcher = Batcher::start(recorder.clone());
        (recorder, batcher)
    }

    /// `n` connected loopback sockets: their client ends, then their server ends.
    async fn socket_pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let (mut clients, mut servers) = (Vec::new(), Vec::new());
        for _ in 0..n {
            clients.push(TcpStream::connect(address).await.expect("connect"));
            servers.push(listener.accept().await.expect("accept").0);
        }
        (clients, servers)
    }

    /// A connection task like the gateway's: once its request (a byte) arrives on `server`, it sends one to `next`,
    /// if any, and queues a check.
    fn reader(
        batcher: &Batcher,
        mut server: TcpStream,
        next: Option<TcpStream>,
    ) -> tokio::task::JoinHandle<Result<Outcome, StoreError>> {
        let batcher = batcher.clone();
        tokio::spawn(async move {
            let mut byte = [0_u8; 1];
            server.read_exact(&mut byte).await.expect("read");
            if let Some(mut next) = next {
                next.write_all(b"x").await.expect("write");
            }
            batcher.check(None, request(), Duration::from_secs(5)).await
        })
    }

    #[tokio::test]
    async fn a_request_read_while_the_first_is_queued_joins_its_call() {
        let (recorder, batcher) = answering_batcher();
        let (mut clients, servers) = socket_pairs(1).await;
        let reader = reader(&batcher, servers.into_iter().next().expect("server"), None);
        tokio::task::yield_now().await;
        // The second request is on the socket (unseen by the runtime until it polls) when the first queues.
        clients[0].write_all(b"x").await.expect("write");
        let first = batcher.check(None, request(), Duration::from_secs(5)).await;
        assert!(first.expect("decided").allowed);
        assert!(reader.await.expect("task").expect("decided").allowed);
        assert_eq!(*recorder.batches.lock().expect("lock"), [2]);
    }

    #[tokio::test]
    async fn a_call_gathers_while_each_socket_poll_brings_more_checks_and_no_longer_than_its_rounds(
    ) {
        const READERS: usize = 8;
        let (recorder, batcher) = answering_batcher();
        // Connection i: the test (i = 0) or reader i - 1 sends into clients[i], reader i reads servers[i]. The
        // runtime sees each next request only at its next socket poll: one more check a poll.
        let (mut clients, mut servers) = socket_pairs(READERS + 1).await;
        let mut first_client = clients.remove(0);
        let readers: Vec<_> = servers
            .drain(..READERS)
            .zip(clients)
            .map(|(server, next)| reader(&batcher, server, Some(next)))
            .collect();
        tokio::task::yield_now().await;
        first_client.write_all(b"x").await.expect("write");
        let first = batcher.check(None, request(), Duration::from_secs(5)).await;
        assert!(first.expect("decided").allowed);
        for reader in readers {
            assert!(reader.await.expect("task").expect("decided").allowed);
        }
        let batches = recorder.batches.lock().expect("lock").clone();
        // The test's own check and one reader per round; the rest in later calls.
        assert_eq!(batches.first(), Some(&(1 + GATHER_ROUNDS)), "{batches:?}");
        assert_eq!(batches.iter().sum::<usize>(), 1 + READERS, "{batches:?}");
        // The last reader's request went here.
        drop(servers);
    }
}
