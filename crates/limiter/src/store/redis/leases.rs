//! The leases this instance holds in Redis for its requests in flight (`concurrency` limits): each request's id,
//! renewed every third of its lease by one script call for all of them (one per hash slot on Cluster), and
//! released off the client's path through the batch queue. An instance that dies renews nothing, and its slots
//! come back within a lease.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::connection::Connection;
use super::RedisTopology;
use crate::store::script::{EncodedRequest, Mode};
use crate::store::{LimitCheck, StoreError};
use crate::{Limit, MIN_LEASE_MS};

/// How often the renewing task looks for leases due: a third of the shortest lease allowed.
const TICK: Duration = Duration::from_millis(MIN_LEASE_MS / 3);
/// How often a lease is renewed at least on Redis Cluster: a renewal is the one call of its holder on the lease's
/// hash slot, and so how the holder learns that the node serving the slot lost it (its marker, `lost.rs`), which
/// it must within the 2 s recovery window to put its leases back before others may take their slots. (Elsewhere
/// every instance's once-a-second health check reads the one marker.)
const CLUSTER_RENEWAL: Duration = Duration::from_secs(1);
/// How long a renewal call may take: past a third of a lease it would be late anyway.
const RENEWAL_TIMEOUT: Duration = Duration::from_millis(MIN_LEASE_MS / 3);

/// The leases of this instance's requests in flight.
#[derive(Debug)]
pub(super) struct Leases {
    /// This instance's part of every lease id (the high bits), random: ids of two instances never meet.
    instance: u64,
    next: AtomicU32,
    held: Mutex<HashMap<u64, Held>>,
    renewing: AtomicBool,
}

/// Which leases [`put_back`] puts into Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Which {
    /// Those Redis does not hold yet (taken by the fallback while it was away): Redis answers again.
    Outside,
    /// Every lease held, or on Redis Cluster those with a key in the hash slot given: Redis lost them (see
    /// `lost.rs`).
    Lost(Option<u16>),
}

/// One request's leases: the key and limit of each of its `concurrency` limits.
#[derive(Debug)]
struct Held {
    keys: Vec<(String, Limit)>,
    /// Renewed every third of the shortest lease among its limits.
    every: Duration,
    renewed: Instant,
    /// Whether Redis holds them: not yet for a request the in-process fallback admitted while Redis was away,
    /// until Redis answers again and adopts them (see [`RedisStore::adopt_leases`]).
    in_redis: bool,
}

// === impl Leases ===

impl Leases {
    pub(super) fn new() -> Self {
        Self {
            // 20 bits above a 32-bit counter: every id is an exact integer in Lua (below 2^53).
            instance: u64::from(fastrand::u32(1..(1 << 20))) << 32,
            next: AtomicU32::new(0),
            held: Mutex::new(HashMap::new()),
            renewing: AtomicBool::new(false),
        }
    }

    /// A lease id for one request, never 0.
    pub(super) fn next_id(&self) -> u64 {
        self.instance | u64::from(self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// The instance a lease id belongs to, as `GET /limits` shows it.
    pub(super) fn instance_of(id: u64) -> String {
        format!("{:05x}", id >> 32)
    }

    /// This instance's name in lease ids.
    pub(super) fn instance(&self) -> String {
        Self::instance_of(self.instance)
    }

    /// Keeps `lease`'s slots renewed until [`release`](Self::release); starts the renewing task at the first.
    pub(super) fn hold(
        self: &Arc<Self>,
        connection: &Arc<Connection>,
        lease: u64,
        keys: Vec<(String, Limit)>,
        in_redis: bool,
    ) {
        let shortest = keys
            .iter()
            .filter_map(|(_, limit)| match limit.algorithm() {
                crate::Algorithm::Concurrency { lease_ms, .. } => Some(*lease_ms),
                _ => None,
            })
            .min()
            .unwrap_or(MIN_LEASE_MS);
        let mut every = Duration::from_millis(shortest / 3);
        if connection.topology == RedisTopology::Cluster {
            every = every.min(CLUSTER_RENEWAL);
        }
        let held = Held {
            keys,
            every,
            renewed: Instant::now(),
            in_redis,
        };
        self.held.lock().insert(lease, held);
        if !self.renewing.swap(true, Ordering::AcqRel) {
            tokio::spawn(renew(Arc::downgrade(self), Arc::clone(connection)));
        }
    }

    /// Stops renewing `lease`; whether Redis held it.
    pub(super) fn release(&self, lease: u64) -> bool {
        self.held
            .lock()
            .remove(&lease)
            .is_some_and(|held| held.in_redis)
    }

    /// The leases `which` names, to be put into Redis.
    fn outside(&self, which: Which) -> Vec<(u64, Vec<(String, Limit)>)> {
        let in_slot = |slot: u16, keys: &[(String, Limit)]| {
            keys.iter()
                .any(|(key, _)| fred::util::redis_keyslot(key.as_bytes()) == slot)
        };
        self.held
            .lock()
            .iter()
            .filter(|(_, h)| match which {
                Which::Outside => !h.in_redis,
                Which::Lost(None) => true,
                Which::Lost(Some(slot)) => in_slot(slot, &h.keys),
            })
            .map(|(&lease, h)| (lease, h.keys.clone()))
            .collect()
    }

    /// How many slots of `key` this instance's requests hold through Redis (not those the fallback gave them).
    pub(super) fn held_on(&self, key: &str) -> u64 {
        let held = self.held.lock();
        let on_key = |h: &&Held| h.in_redis && h.keys.iter().any(|(k, _)| k == key);
        held.values().filter(on_key).count() as u64
    }

    /// Marks `lease` held by Redis, now renewed; false when its request ended meanwhile.
    fn adopted(&self, lease: u64) -> bool {
        match self.held.lock().get_mut(&lease) {
            Some(held) => {
                held.in_redis = true;
                held.renewed = Instant::now();
                true
            }
            None => false,
        }
    }

    /// The leases due for renewal, marked renewed.
    fn due(&self) -> Vec<(u64, Vec<(String, Limit)>)> {
        let now = Instant::now();
        let mut held = self.held.lock();
        held.iter_mut()
            .filter(|(_, h)| h.in_redis && now.duration_since(h.renewed) >= h.every)
            .map(|(&lease, h)| {
                h.renewed = now;
                (lease, h.keys.clone())
            })
            .collect()
    }
}

/// Renews the leases due, every [`TICK`], one call for all of them per hash slot; ends with the store.
async fn renew(leases: Weak<Leases>, connection: Arc<Connection>) {
    loop {
        tokio::time::sleep(TICK).await;
        let Some(due) = leases.upgrade().map(|leases| leases.due()) else {
            return;
        };
        if due.is_empty() {
            continue;
        }
        let mut by_slot: HashMap<Option<u16>, Vec<EncodedRequest>> = HashMap::new();
        for (lease, keys) in &due {
            let checks: Vec<LimitCheck<'_>> = keys
                .iter()
                .map(|(key, limit)| LimitCheck { key, limit })
                .collect();
            // A request's keys may span slots on Cluster: each renewed where it lives.
            for check in checks {
                let slot = connection.slot_of(&[check]);
                let request = EncodedRequest::new(&[check], Mode::Renew).leased(*lease);
                by_slot.entry(slot).or_default().push(request);
            }
        }
        for (slot, requests) in by_slot {
            if let Err(error) = call_on_slot(&connection, slot, requests.iter()).await {
                tracing::debug!(%error, leases = requests.len(), "leases not renewed, tried again soon");
            }
        }
    }
}

/// One script call of `requests`, all on `slot`, that no request's deadline cuts short: within [`RENEWAL_TIMEOUT`].
async fn call_on_slot<'a>(
    connection: &Connection,
    slot: Option<u16>,
    requests: impl Iterator<Item = &'a EncodedRequest>,
) -> Result<(), StoreError> {
    let requests: Vec<&EncodedRequest> = requests.collect();
    let deadlines = vec![0; requests.len()];
    let client = connection.pool.next();
    let call = connection.run_script(client, slot, &requests, &deadlines, None, RENEWAL_TIMEOUT);
    call.await.map(drop)
}

/// Puts into Redis, whatever the keys hold, the leases `which` names (adopted: renewed and released as the others
/// from now on): one call per hash slot. A lease whose request ended meanwhile is removed again at once; one whose
/// call failed is left as it was (tried again at the next recovery, or the next loss). Redis answered again after
/// an outage (the fallback's leases), or lost its data (every lease, or a Cluster hash slot's: see `lost.rs`).
pub(super) async fn put_back(leases: &Leases, connection: &Connection, which: Which) {
    let outside = leases.outside(which);
    if outside.is_empty() {
        return;
    }
    let mut by_slot: HashMap<Option<u16>, Vec<(u64, EncodedRequest)>> = HashMap::new();
    for (lease, keys) in &outside {
        for (key, limit) in keys {
            let check = [LimitCheck { key, limit }];
            let request = EncodedRequest::new(&check, Mode::Adopt).leased(*lease);
            by_slot
                .entry(connection.slot_of(&check))
                .or_default()
                .push((*lease, request));
        }
    }
    let mut failed = std::collections::HashSet::new();
    for (slot, requests) in by_slot {
        let adopting = requests.iter().map(|(_, request)| request);
        if let Err(error) = call_on_slot(connection, slot, adopting).await {
            tracing::debug!(%error, "slots held not put back in redis yet");
            failed.extend(requests.iter().map(|(lease, _)| *lease));
        }
    }
    let mut ended: HashMap<Option<u16>, Vec<EncodedRequest>> = HashMap::new();
    for (lease, keys) in outside {
        if failed.contains(&lease) || leases.adopted(lease) {
            continue;
        }
        // Its request ended while its slots were put back: they go at once.
        for (key, limit) in &keys {
            let check = [LimitCheck { key, limit }];
            let request = EncodedRequest::new(&check, Mode::GiveBack).leased(lease);
            ended
                .entry(connection.slot_of(&check))
                .or_default()
                .push(request);
        }
    }
    for (slot, requests) in ended {
        if let Err(error) = call_on_slot(connection, slot, requests.iter()).await {
            tracing::debug!(%error, "a slot was not released, its lease will end it");
        }
    }
}

// === impl RedisStore ===

impl super::RedisStore {
    /// Redis answers again: adds to its count, in a task of its own, the slots that requests still in flight took
    /// from the in-process fallback while it was away (`on_error: local`), so that they count against every
    /// instance until they end, renewed and released as the others (see `put_back`).
    pub fn adopt_leases(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (leases, connection) = (Arc::clone(&self.leases), Arc::clone(&self.connection));
        runtime.spawn(async move { put_back(&leases, &connection, Which::Outside).await });
    }
}
