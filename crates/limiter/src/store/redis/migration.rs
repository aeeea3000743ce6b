//! A Redis Cluster slot on the move: which node imports it, as the node that owns it says, and a script call sent
//! there behind `ASKING`, as Redis asks of calls whose keys already moved.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::*;
use fred::types::config::Options;
use fred::types::CustomCommand;
use tokio::time::Instant;

use super::cluster::{join_all, merge};
use super::connection::{answer_all, Connection};
use crate::store::batcher::Pending;
use crate::store::script::{self, EncodedRequest, Mode};
use crate::store::StoreError;
use crate::Outcome;

/// The nodes that slots under migration are going to, as their owners said, per slot.
///
/// Looked up when a call on a slot is redirected, and kept while the slot's calls keep being redirected there: a
/// migration lasts from a few milliseconds to hours, and every call on a key already moved meets it.
#[derive(Debug, Default)]
pub(super) struct Migrations {
    targets: std::sync::Mutex<HashMap<u16, Target>>,
    /// One lookup at a time: the calls that meet a migration together wait for the first one's answer.
    lookup: tokio::sync::Mutex<()>,
}

/// Where a slot goes (`None`: its owner said it is not migrating), and when its owner said so.
#[derive(Debug, Clone)]
struct Target {
    server: Option<Server>,
    seen: Instant,
}

/// How long a slot's target is used without asking its owner again. A target that no longer imports the slot
/// answers the call with a redirection, which forgets it at once; this only bounds what a target that imports the
/// slot again, from another owner, could keep.
const TARGET_KEPT: Duration = Duration::from_secs(5);
/// Redirections a call follows at most: an `ASK` costs one, and a target that stopped importing the slot (the
/// migration ended or was aborted meanwhile) one more, after which the slot map or the owner's word is new.
const MAX_FOLLOWS: usize = 3;
/// Times a call Redis answered `TRYAGAIN` is sent again at most, and the first pause before it (each next pause is
/// one longer): the rest of the keys usually follow within milliseconds, and the call's deadline ends it anyway.
const MAX_UNSTABLE_RETRIES: u32 = 8;
const UNSTABLE_PAUSE: Duration = Duration::from_millis(2);

// === impl Migrations ===

impl Migrations {
    /// The node `slot` is migrating to, as the node `client` routes the slot to (its owner) says; `None` when that
    /// node says the slot is not migrating (it moved: fred already reads the new owner from the slot map).
    pub(super) async fn target(
        &self,
        client: &Client,
        slot: u16,
        timeout: Duration,
    ) -> Result<Option<Server>, Error> {
        let asked = Instant::now();
        let kept_since = asked.checked_sub(TARGET_KEPT).unwrap_or(asked);
        if let Some(target) = self.known(slot, kept_since).filter(Option::is_some) {
            return Ok(target);
        }
        let _one_at_a_time = self.lookup.lock().await;
        // What the owner said while this call waited holds for it too: the calls of one moment that meet a
        // redirection together (all those in flight at a hand-over) ask once.
        if let Some(target) = self.known(slot, asked) {
            return Ok(target);
        }
        let on_owner = client.with_options(&Options {
            fail_fast: true,
            timeout: Some(timeout),
            ..Default::default()
        });
        let nodes: String = on_owner
            .custom(
                CustomCommand::new_static("CLUSTER", Some(slot), false),
                vec!["NODES"],
            )
            .await?;
        let server = migrating_to(&nodes, slot).and_then(|(host, port)| {
            // Only a node the client is connected to: fred answers a command routed to another by dropping every
            // connection and reconnecting.
            let server = client
                .active_connections()
                .into_iter()
                .find(|server| server.port == port && *server.host == *host);
            match &server {
                Some(server) => {
                    tracing::debug!(slot, target = %server, "slot is migrating: following ASK")
                }
                None => {
                    tracing::debug!(slot, %host, port, "slot is migrating to a node not connected")
                }
            }
            server
        });
        self.lock().insert(
            slot,
            Target {
                server: server.clone(),
                seen: Instant::now(),
            },
        );
        Ok(server)
    }

    /// Forgets where `slot` was going: its target redirected a call (it no longer imports the slot).
    pub(super) fn forget(&self, slot: u16) {
        self.lock().remove(&slot);
    }

    /// What `slot`'s owner said last, if it said it after `since`.
    fn known(&self, slot: u16, since: Instant) -> Option<Option<Server>> {
        let targets = self.lock();
        let target = targets.get(&slot).filter(|target| target.seen >= since)?;
        Some(target.server.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u16, Target>> {
        self.targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

// === impl Connection ===

impl Connection {
    /// Follows a call on a slot being migrated that Redis redirected, until it is decided, fails otherwise, or
    /// `deadline` comes; `result` is how it last failed.
    ///
    /// A call on keys that already moved is answered `ASK` by the slot's owner: it is sent again, behind `ASKING`,
    /// to the node importing the slot (as the owner names it). A call that fred says was redirected while the
    /// owner says the slot is not migrating met a `MOVED`: fred has read the new slot map since, and the call goes
    /// to the new owner. Either answer means that Redis did not run the call, so that sending it again cannot
    /// count anything twice; any other failure ends it (a call that timed out may have run), and the deadlines
    /// the script checks keep a late call from counting.
    pub(super) async fn follow_migration(
        &self,
        client: &Client,
        slot: u16,
        command: Vec<Value>,
        mut result: Result<Value, StoreError>,
        deadline: Option<Instant>,
    ) -> Result<Value, StoreError> {
        for _ in 0..MAX_FOLLOWS {
            if !matches!(&result, Err(StoreError::Redis(error)) if redirected(error)) {
                break;
            }
            // What is left of the call's time (zero: no timeout).
            let left = match deadline {
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => left,
                    _ => break,
                },
                None => Duration::ZERO,
            };
            result = match self.migrations.target(client, slot, left).await {
                Ok(Some(target)) => {
                    let command = script::without_marker(command.clone());
                    let asked = self.ask(client, &target, slot, command, left).await;
                    if matches!(&asked, Err(StoreError::Redis(error)) if redirected(error)) {
                        self.migrations.forget(slot);
                    }
                    asked
                }
                Ok(None) => {
                    let again = self.evalsha_on_owner(client, Some(slot), &command, left);
                    Box::pin(again).await
                }
                Err(error) => {
                    tracing::debug!(%error, slot, "cannot tell where a migrating slot goes");
                    break;
                }
            };
        }
        result
    }

    /// The script by hash on `target` behind `ASKING`, loading it there first if it does not know it.
    async fn ask(
        &self,
        client: &Client,
        target: &Server,
        slot: u16,
        command: Vec<Value>,
        timeout: Duration,
    ) -> Result<Value, StoreError> {
        let asked = Box::pin(ask(client, target, slot, command.clone(), timeout)).await;
        match asked {
            Err(error) if error.details().starts_with("NOSCRIPT") => {
                Box::pin(self.script.load(client)).await?;
                Ok(Box::pin(ask(client, target, slot, command, timeout)).await?)
            }
            other => Ok(other?),
        }
    }

    /// Runs `batch`, which Redis refused whole with `TRYAGAIN`, as one call per set of keys (requests on the same
    /// keys together, in queue order, until `deadline`): a batch on a slot being migrated may hold the keys of
    /// clients already moved and of others not yet, which no one call can reach, while each client's keys move
    /// together.
    ///
    /// A set refused so again is sent again after a pause if its requests have one limit each (the rest of their
    /// keys are on their way); requests with several limits are decided limit by limit instead (see
    /// [`decide_per_limit`](Self::decide_per_limit)), since Redis refuses a call on several keys at the importing
    /// node until all of them are there, which for a client new during the migration is never.
    pub(super) async fn run_split(self: &Arc<Self>, batch: Vec<Pending>, deadline: Instant) {
        let slot = batch.first().and_then(|pending| pending.slot);
        let mut groups: Vec<Vec<Pending>> = Vec::new();
        for pending in batch {
            match groups
                .iter_mut()
                .find(|group| group[0].request.same_keys(&pending.request))
            {
                Some(group) => group.push(pending),
                None => groups.push(vec![pending]),
            }
        }
        join_all(groups.into_iter().map(|group| async move {
            let requests: Vec<&EncodedRequest> = group.iter().map(|p| &p.request).collect();
            let deadlines = self.script_deadlines(&group);
            let timeout = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let mut result = self
                .run_script(self.pool.next(), slot, &requests, &deadlines, None, timeout)
                .await;
            let several = group[0].request.limits() > 1 && group[0].request.mode() == Mode::Commit;
            if several && matches!(&result, Err(StoreError::Redis(error)) if unstable(error)) {
                let per_request =
                    group
                        .into_iter()
                        .zip(deadlines)
                        .map(|(pending, at)| async move {
                            let timeout = deadline
                                .saturating_duration_since(Instant::now())
                                .max(Duration::from_millis(1));
                            let outcome = self
                                .decide_per_limit(&pending.request, slot, at, timeout)
                                .await;
                            pending.answer(outcome);
                        });
                join_all(per_request).await;
                return;
            }
            let mut unstable = Unstable::new(timeout);
            while let Some(left) = unstable.again(&result).await {
                result = self
                    .run_script(self.pool.next(), slot, &requests, &deadlines, None, left)
                    .await;
            }
            answer_all(group, result);
        }))
        .await;
    }

    /// Decides a committing request limit by limit, all-or-nothing as one call would be: a dry run of every limit,
    /// then, only if all admit, the commits, where those that admitted are given back if another denied (as for a
    /// request whose keys span hash slots). Each call has one key, which Redis runs where the key is, on either
    /// node of a slot being migrated; `deadline` (Redis's ms) keeps a late one from counting.
    async fn decide_per_limit(
        self: &Arc<Self>,
        request: &EncodedRequest,
        slot: Option<u16>,
        deadline: u64,
        timeout: Duration,
    ) -> Result<Outcome, StoreError> {
        let dry_runs = request.per_limit(Mode::DryRun);
        let outcomes = join_all(dry_runs.iter().map(|part| async move {
            self.run_encoded(slot, part, deadline, None, timeout)
                .await
                .map(|(_, outcome)| outcome)
        }))
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        let limits = outcomes.len();
        let each: Vec<Vec<usize>> = (0..limits).map(|i| vec![i]).collect();
        if !outcomes.iter().all(|outcome| outcome.allowed) {
            return merge(limits, &each, outcomes);
        }
        let commits = request
            .per_limit(Mode::Commit)
            .into_iter()
            .map(|part| (slot, part))
            .collect();
        let outcomes = Arc::clone(self)
            .commit_in_a_task(commits, deadline, None, timeout)
            .await?;
        merge(limits, &each, outcomes)
    }
}

/// Sending a call again while Redis refuses it with `TRYAGAIN`, after a short pause, until its time runs out.
///
/// `TRYAGAIN` says that Redis did not run the call: its keys are split between the two nodes of a slot being
/// migrated (some moved, some not), or on the importing node some are not there. The first passes when the
/// operator's next `MIGRATE` moves the rest, the second with the hand-over.
pub(super) struct Unstable {
    deadline: Option<Instant>,
    retries: u32,
}

impl Unstable {
    /// For a call that may take `timeout` from now (zero: no timeout; then it is sent again a bounded number of
    /// times).
    pub(super) fn new(timeout: Duration) -> Self {
        Self {
            deadline: (!timeout.is_zero()).then(|| Instant::now() + timeout),
            retries: 0,
        }
    }

    /// After a try that gave `result`: waits the pause and returns the time left for the next try (zero: no
    /// timeout), or `None` when it was not refused so or there is no time or try left.
    pub(super) async fn again<T>(&mut self, result: &Result<T, StoreError>) -> Option<Duration> {
        if !matches!(result, Err(StoreError::Redis(error)) if unstable(error))
            || self.retries >= MAX_UNSTABLE_RETRIES
        {
            return None;
        }
        self.retries += 1;
        let pause = UNSTABLE_PAUSE * self.retries;
        let left = match self.deadline {
            Some(deadline) => deadline
                .saturating_duration_since(Instant::now())
                .checked_sub(pause)
                .filter(|left| !left.is_zero())?,
            None => Duration::ZERO,
        };
        tokio::time::sleep(pause).await;
        Some(left)
    }
}

/// `ASKING` then `command` (an `EVALSHA`'s arguments) on `target`'s connection with nothing between them: `ASKING`
/// lets only the next command of its connection run on a slot being imported. A pipeline is written whole before
/// fred writes anything else, and its replies are read in order, so each answer goes to its own command.
pub(super) async fn ask(
    client: &Client,
    target: &Server,
    slot: u16,
    command: Vec<Value>,
    timeout: Duration,
) -> Result<Value, Error> {
    let pipeline = client.pipeline();
    let on_target = pipeline.with_options(&Options {
        cluster_node: Some(target.clone()),
        fail_fast: true,
        timeout: Some(timeout),
        ..Default::default()
    });
    // Queued, not sent: a pipeline's commands answer at once.
    let _: Value = on_target
        .custom(
            CustomCommand::new_static("ASKING", Some(slot), false),
            Vec::<Value>::new(),
        )
        .await?;
    let _: Value = on_target
        .custom(CustomCommand::new("EVALSHA", Some(slot), false), command)
        .await?;
    let mut replies = pipeline.try_all::<Value>().await.into_iter();
    match (replies.next(), replies.next()) {
        (Some(Ok(_)), Some(reply)) => reply,
        (Some(Err(error)), _) | (None, Some(Err(error))) => Err(error),
        _ => Err(Error::new(
            ErrorKind::Protocol,
            "no reply to a script call sent after ASKING",
        )),
    }
}

/// Whether a call failed because Redis redirected it: fred answers `ASK` and `MOVED` so when it follows neither
/// (after a `MOVED` it has read the new slot map first).
pub(super) fn redirected(error: &Error) -> bool {
    *error.kind() == ErrorKind::Routing && error.details().starts_with("Too many redirections")
}

/// Whether Redis refused a call for now because its keys are split between the two nodes of a slot on the move
/// (`TRYAGAIN`): some moved and some not, or, on the importing node, some not there (yet).
pub(super) fn unstable(error: &Error) -> bool {
    error.details().starts_with("TRYAGAIN")
}

/// From `CLUSTER NODES` as a node answers it, the address (host, port) of the node its own line says `slot` is
/// migrating to (`[slot->-node id]`).
fn migrating_to(nodes: &str, slot: u16) -> Option<(String, u16)> {
    let marker = format!("[{slot}->-");
    let myself = nodes.lines().find(|line| {
        line.split_whitespace()
            .nth(2)
            .is_some_and(|flags| flags.split(',').any(|flag| flag == "myself"))
    })?;
    let target_id = myself
        .split_whitespace()
        .find_map(|field| field.strip_prefix(&marker)?.strip_suffix(']'))?;
    let target = nodes
        .lines()
        .find(|line| line.split_whitespace().next() == Some(target_id))?;
    // `host:port@cport`, maybe followed by `,hostname`.
    let address = target.split_whitespace().nth(1)?;
    let address = address.split(['@', ',']).next()?;
    let (host, port) = address.rsplit_once(':')?;
    let port = port.parse().ok().filter(|&port| port != 0)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host-4 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@31002 master - 0 1426238316232 2 connected 5461-10922
292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master - 0 1426238318243 3 connected 10923-16383
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 [5000->-67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1] [93-<-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
";

    #[test]
    fn the_owners_own_line_names_where_a_migrating_slot_goes() {
        assert_eq!(
            migrating_to(NODES, 5000),
            Some(("127.0.0.1".to_owned(), 30002))
        );
        // Importing, not migrating: the owner is elsewhere.
        assert_eq!(migrating_to(NODES, 93), None);
        assert_eq!(migrating_to(NODES, 5001), None);
        // Another node's migration is not this node's to tell.
        let other = NODES.replace("myself,master", "master");
        assert_eq!(migrating_to(&other, 5000), None);
    }

    #[test]
    fn a_target_without_an_address_is_none() {
        let nodes = NODES.replace("127.0.0.1:30002@31002", ":0@0");
        assert_eq!(migrating_to(&nodes, 5000), None);
    }
}
