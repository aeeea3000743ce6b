//! The limiter script's calling convention: requests encoded into `EVALSHA` keys and arguments, and its reply
//! decoded into one outcome per request (the layout is documented at the top of the script,
//! `scripts/check/1-arguments.lua`).

use std::collections::HashMap;

use bytes::Bytes;
use fred::types::Value;
use rmp::encode::ByteBuf;
use smallvec::SmallVec;

use super::{LimitCheck, StoreError, INLINE_LIMITS};
use crate::algorithms::fixed_window::FixedWindowState;
use crate::algorithms::gcra::{GcraState, Ticks};
use crate::algorithms::sliding_window::WindowState;
use crate::algorithms::token_bucket::BucketState;
use crate::algorithms::{self, State};
use crate::{Algorithm, Decision, Outcome, SLOT_RETRY_MS};

/// The script, reviewed as Lua in its own files, one per part, joined in their order into the one script Redis
/// runs (and whose SHA1 it is called by).
pub(super) const CHECK_SCRIPT: &str = concat!(
    include_str!("../../scripts/check/1-arguments.lua"),
    include_str!("../../scripts/check/2-state.lua"),
    include_str!("../../scripts/check/3-algorithms.lua"),
    include_str!("../../scripts/check/4-batch.lua"),
);

/// Fields per limit in the script's reply for a single request (after the request's `all_allowed`): allowed,
/// remaining, the wait (the delay when the limit admits, the retry when it denies) and the reset. The limit's
/// capacity is not sent back: it is the configured one.
const REPLY_FIELDS: usize = 4;
/// Fields per limit in the script's reply for a run of identical requests: whether the key had state, then its
/// integers before the run.
const RUN_FIELDS: usize = 4;
/// Integers per limit in a request's encoding: key index, algorithm id, four parameters, cost, shadow.
const ARGS_PER_LIMIT: usize = 8;
/// Integers in front of a request's limits: mode, how many identical requests it stands for, number of limits,
/// deadline.
const ARGS_PER_REQUEST: usize = 4;
/// What the script replies, alone, for an entry it reached past its deadline.
const PAST_DEADLINE: i64 = -1;

/// What the script does with a request that every limit admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Consume from every limit.
    Commit,
    /// Only decide: consume nothing.
    DryRun,
    /// Give back what a commit took, on the window it took it from (see [`EncodedRequest::give_back`]).
    GiveBack,
    /// Add the cost as a debt on the window a commit landed in (a request that settled for more than it
    /// reserved).
    Debt,
    /// Renew the leases of a request still in flight (its `concurrency` limits; the others are left alone).
    Renew,
    /// Add to Redis's count the leases of a request still in flight that the in-process fallback admitted while
    /// Redis was away (its `concurrency` limits; the others are left alone), whatever the keys hold.
    Adopt,
}

/// One request's share of a script call, owned so that it can wait in the batch queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct EncodedRequest {
    mode: Mode,
    /// The state keys of the limits, one after another: one allocation for them all.
    keys: Bytes,
    /// Per limit: where its key ends in `keys`.
    key_ends: SmallVec<[usize; INLINE_LIMITS]>,
    /// What the script needs of each limit, and what a run's replay needs (see [`replay_run`]). On the heap:
    /// the request is moved several times on its way through the batch queue, and inline it would be copied.
    limits: Vec<LimitSpec>,
}

/// A limit as the script sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct LimitSpec {
    algorithm: Algorithm,
    /// The request's lease id for a `concurrency` limit (the member of its key's sorted set), else 0.
    lease: u64,
    cost: u64,
    shadow: bool,
}

// === impl Mode ===

impl Mode {
    /// The entry's mode as the script reads it (see the header of the script).
    fn id(self) -> u64 {
        match self {
            Mode::DryRun => 0,
            Mode::Commit => 1,
            Mode::GiveBack => 2,
            Mode::Debt => 3,
            Mode::Renew => 4,
            Mode::Adopt => 5,
        }
    }
}

// === impl EncodedRequest ===

impl EncodedRequest {
    pub(super) fn new(checks: &[LimitCheck<'_>], mode: Mode) -> Self {
        let mut keys = Vec::with_capacity(checks.iter().map(|c| c.key.len()).sum());
        let key_ends = checks
            .iter()
            .map(|c| {
                keys.extend_from_slice(c.key.as_bytes());
                keys.len()
            })
            .collect();
        let limits = checks
            .iter()
            .map(|c| LimitSpec {
                algorithm: *c.limit.algorithm(),
                lease: 0,
                cost: c.limit.cost(),
                shadow: c.limit.is_shadow(),
            })
            .collect();
        Self {
            mode,
            keys: Bytes::from(keys),
            key_ends,
            limits,
        }
    }

    /// The same request holding the slots of its `concurrency` limits under `lease` (unique per request and
    /// instance): what its commit adds to each key's leases, its renewal renews and its give-back removes.
    pub(super) fn leased(mut self, lease: u64) -> Self {
        for limit in &mut self.limits {
            if limit.algorithm.holds_slots() {
                limit.lease = lease;
            }
        }
        self
    }

    /// What gives back what this request, committed, took from the limits `consumed` says (an admitted
    /// request's decisions: a shadow limit that denied took nothing).
    pub(super) fn give_back(&self, consumed: impl Iterator<Item = bool>) -> Self {
        let mut keys = Vec::with_capacity(self.keys.len());
        let mut key_ends = SmallVec::new();
        let mut limits = Vec::with_capacity(self.limits.len());
        for ((key, limit), consumed) in self.key_ranges().zip(&self.limits).zip(consumed) {
            if consumed {
                keys.extend_from_slice(&self.keys[key]);
                key_ends.push(keys.len());
                limits.push(*limit);
            }
        }
        Self {
            mode: Mode::GiveBack,
            keys: Bytes::from(keys),
            key_ends,
            limits,
        }
    }

    /// The request as one request per limit, each in `mode`: what decides it limit by limit where no one call
    /// may touch all its keys.
    pub(super) fn per_limit(&self, mode: Mode) -> Vec<Self> {
        self.key_ranges()
            .zip(&self.limits)
            .map(|(key, limit)| Self {
                mode,
                keys: self.keys.slice(key.clone()),
                key_ends: std::iter::once(key.len()).collect(),
                limits: vec![*limit],
            })
            .collect()
    }

    /// What the script does with the request when every limit admits.
    pub(super) fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether `other` has the same keys, in the same order.
    pub(super) fn same_keys(&self, other: &Self) -> bool {
        self.keys == other.keys && self.key_ends == other.key_ends
    }

    /// How many limits (and keys) the request has.
    pub(super) fn limits(&self) -> usize {
        self.key_ends.len()
    }

    /// Where each limit's key stands in `keys`.
    fn key_ranges(&self) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
        let starts = std::iter::once(0).chain(self.key_ends.iter().copied());
        starts
            .zip(self.key_ends.iter().copied())
            .map(|(start, end)| start..end)
    }

    /// The keys of a committing request whose state the fallback may start from (see `LastReported`), with their
    /// limit's index: none of a shadow limit's (which never denies), nor slots (which the fallback never takes
    /// over).
    pub(super) fn seeding_keys(&self) -> impl Iterator<Item = (usize, &str)> + '_ {
        let commits = self.mode == Mode::Commit;
        self.key_ranges()
            .zip(&self.limits)
            .enumerate()
            .filter(move |(_, (_, limit))| {
                commits && !limit.shadow && !limit.algorithm.holds_slots()
            })
            .filter_map(|(i, (range, _))| Some((i, std::str::from_utf8(&self.keys[range]).ok()?)))
    }

    /// Whether a run of copies of this request may be decided at once: committing requests whose limits each
    /// have a key of their own, none a `sliding_log` (whose state, a sorted set, the reply cannot carry).
    fn can_run(&self) -> bool {
        self.mode == Mode::Commit
            && !self.limits.iter().any(|l| {
                matches!(
                    l.algorithm,
                    Algorithm::SlidingLog { .. } | Algorithm::Concurrency { .. }
                )
                    // A run's closed form divides by the cost, and takes each request to fit the capacity.
                    || l.cost == 0
                    || l.cost > l.algorithm.capacity()
            })
            && self.key_ranges().enumerate().all(|(i, key)| {
                self.key_ranges()
                    .take(i)
                    .all(|other| self.keys[other] != self.keys[key.clone()])
            })
    }
}

/// Splits `requests` into runs, returning each run's length in order: consecutive requests that are identical
/// (same keys, limits and costs) and [can run](EncodedRequest::can_run) form one run, any other request a run of
/// one.
///
/// One client's concurrent requests to one route are such runs; the script decides each in closed form instead of
/// request by request. Only consecutive requests are joined, so batch order, and with it every decision, is kept.
pub(super) fn runs(requests: &[&EncodedRequest]) -> Vec<usize> {
    let mut runs = Vec::with_capacity(requests.len());
    let mut rest = requests;
    while let Some((first, others)) = rest.split_first() {
        let copies = if first.can_run() {
            others.iter().take_while(|r| **r == *first).count()
        } else {
            0
        };
        runs.push(1 + copies);
        rest = &others[copies..];
    }
    runs
}

/// The arguments of `EVALSHA` for `requests` in `runs` (from [`runs`]), decided at `now_ms` (or with Redis's
/// clock when `None`): every key once, the clock, and one entry per run packed as MessagePack.
///
/// `deadlines` holds, per request, Redis's time in ms from which the script must leave it undecided (0: none): a
/// run is given its earliest member's. A give-back's is instead the time its commit was decided at.
///
/// `marker`: the key that tells whether Redis lost its data (see [`Marker`]); the reply then tells the epoch (see
/// [`epoch_of`]).
///
/// `redis_now`: Redis's time as this process estimates it, never later than the true one; asked (once) only when a
/// request has a calendar window, whose boundaries are drawn around it. With an explicit `now_ms` (a test's) they
/// are drawn a millisecond before it, as an estimate a little behind Redis's clock would draw them: a test at a
/// boundary then sees the script move on to the next window itself.
#[allow(clippy::too_many_arguments)]
pub(super) fn command(
    sha: &Value,
    now_ms: Option<i64>,
    redis_now: impl Fn() -> i64,
    requests: &[&EncodedRequest],
    deadlines: &[u64],
    runs: &[usize],
    slots_channel: &Value,
    marker: Option<Marker>,
) -> Vec<Value> {
    let (mut integers, mut limits) = (0, 0);
    let mut at = 0;
    for &count in runs {
        let n = requests[at].limits();
        limits += n;
        integers += ARGS_PER_REQUEST + n * ARGS_PER_LIMIT;
        at += count;
    }
    // Sized for every key distinct (growing and rehashing would cost more than the encoding itself). Hashed with
    // foldhash, seeded per map: the map lives for one call of at most a few hundred keys, where SipHash costs more
    // than the lookup it serves.
    let mut keys: Vec<Value> = Vec::with_capacity(limits);
    let mut key_index: HashMap<&[u8], u64, foldhash::fast::RandomState> =
        HashMap::with_capacity_and_hasher(limits, foldhash::fast::RandomState::default());
    // At most 9 bytes per integer, 5 for the array header.
    let mut packed = ByteBuf::with_capacity(5 + integers * 9);
    let _ = rmp::encode::write_array_len(&mut packed, integers as u32);
    let mut at = 0;
    // Whether a release of a slot with a queue is in the call: the script then announces it on `slots_channel`.
    let mut announces = false;
    let mut around = None;
    let mut around_ms =
        || *around.get_or_insert_with(|| now_ms.map_or_else(&redis_now, |now| now - 1));
    for &count in runs {
        let request = requests[at];
        let deadline = deadlines[at..at + count]
            .iter()
            .copied()
            .reduce(earliest)
            .unwrap_or(0);
        at += count;
        put(&mut packed, request.mode.id());
        put(&mut packed, count as u64);
        put(&mut packed, request.limits() as u64);
        put(&mut packed, deadline);
        for (key, limit) in request.key_ranges().zip(&request.limits) {
            let index = *key_index
                .entry(&request.keys[key.clone()])
                .or_insert_with(|| {
                    keys.push(Value::Bytes(request.keys.slice(key)));
                    keys.len() as u64
                });
            put(&mut packed, index);
            let mut params = script_params(&limit.algorithm, &mut around_ms);
            if limit.algorithm.holds_slots() {
                params[3] = limit.lease;
                announces |= request.mode == Mode::GiveBack && params[4] == 1;
            }
            for arg in params {
                put(&mut packed, arg);
            }
            put(&mut packed, limit.cost);
            put(&mut packed, u64::from(limit.shadow));
        }
    }
    let mut command = Vec::with_capacity(4 + keys.len());
    command.push(sha.clone());
    command.push(Value::Integer(keys.len() as i64));
    command.extend(keys);
    command.push(now_ms.map_or_else(|| Value::from(""), Value::Integer));
    command.push(Value::Bytes(packed.into_vec().into()));
    let channel = announces.then(|| slots_channel.clone());
    push_channel_and_marker(&mut command, channel, marker);
    command
}

/// Appends the arguments after the requests (`ARGV[3]` on): the channel on which the call announces a slot freed on
/// a full key, when it releases one of a limit with a queue, and the marker; neither when the call needs none.
fn push_channel_and_marker(
    command: &mut Vec<Value>,
    channel: Option<Value>,
    marker: Option<Marker>,
) {
    if channel.is_some() || marker.is_some() {
        command.push(channel.unwrap_or_else(|| Value::from("")));
    }
    if let Some(marker) = marker {
        command.push(marker.key);
        command.push(Value::Integer(i64::try_from(marker.known).unwrap_or(0)));
        if marker.per_hash_slot {
            command.push(Value::from("1"));
        }
    }
}

/// `command` without its marker, for a call sent behind `ASKING` to the node a hash slot is migrating to: the
/// slot's marker may not be there yet, and a call there must neither take it for lost nor create a second one
/// (which would stop its migration with `BUSYKEY`).
pub(super) fn without_marker(mut command: Vec<Value>) -> Vec<Value> {
    let keys = command
        .get(1)
        .and_then(Value::as_i64)
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(0);
    // The script's name, the number of keys, the keys, the clock, the requests, the channel, then the marker.
    if let Some(marker) = command.get_mut(2 + keys + 3) {
        *marker = Value::from("");
    }
    command
}

/// The key that tells a call whether Redis lost its data (`lost.rs`), with the epoch this instance last saw of it
/// (0: none).
#[derive(Debug, Clone)]
pub struct Marker {
    /// `<key_prefix>epoch`, shared by every call; on Redis Cluster, the marker of the call's hash slot.
    pub key: Value,
    /// The epoch this instance last saw of it.
    pub known: u64,
    /// Whether it is one hash slot's (Cluster): it vouches for the slot by being there, and a slot with no call for
    /// a while is not suspect (a standalone marker is written every second by every instance's health check).
    pub per_hash_slot: bool,
}

/// The earlier of two deadlines, where 0 is none.
fn earliest(a: u64, b: u64) -> u64 {
    match (a, b) {
        (0, other) | (other, 0) => other,
        (a, b) => a.min(b),
    }
}

/// Appends one integer; writing into a `ByteBuf` cannot fail.
fn put(packed: &mut ByteBuf, value: u64) {
    let _ = rmp::encode::write_uint(packed, value);
}

/// The integers of the script's MessagePack reply.
pub(super) fn unpack_reply(reply: &Value) -> Result<Vec<i64>, StoreError> {
    let bad = |what: &str| StoreError::Reply(format!("{what} in the limiter script's reply"));
    let mut bytes = reply.as_bytes().ok_or_else(|| bad("no MessagePack"))?;
    let len = rmp::decode::read_array_len(&mut bytes).map_err(|_| bad("no array"))?;
    let mut values = Vec::with_capacity(len as usize);
    for _ in 0..len {
        values.push(
            rmp::decode::read_int(&mut bytes).map_err(|_| bad("a value that is no integer"))?,
        );
    }
    Ok(values)
}

/// The epoch of Redis's data a reply tells, and the end of the recovery window under way (Redis's ms; 0 for none,
/// and both 0 without a marker): see [`command`]'s `marker`.
pub(super) fn epoch_of(reply: &[i64]) -> (u64, u64) {
    let at = |i: usize| {
        reply
            .get(i)
            .and_then(|&value| u64::try_from(value).ok())
            .unwrap_or(0)
    };
    (at(1), at(2))
}

/// Splits the script's reply into one outcome per request of `requests`, sent as `runs`: a request the script
/// reached past its deadline is [`StoreError::Late`] (nothing was counted for it).
pub(super) fn parse_reply(
    reply: &[i64],
    requests: &[&EncodedRequest],
    runs: &[usize],
) -> Result<Vec<Result<Outcome, StoreError>>, StoreError> {
    let mut outcomes = Vec::with_capacity(requests.len());
    let wrong_length = || {
        StoreError::Reply(format!(
            "{} values in a reply for {} requests",
            reply.len(),
            requests.len()
        ))
    };
    // The header: Redis's time, the epoch of its data and the end of a recovery window.
    let [now_ms, _, _, ref rest @ ..] = *reply else {
        return Err(wrong_length());
    };
    let mut rest = rest;
    let mut at = 0;
    for &count in runs {
        let request = requests.get(at).ok_or_else(wrong_length)?;
        at += count;
        if matches!(
            request.mode,
            Mode::GiveBack | Mode::Debt | Mode::Renew | Mode::Adopt
        ) {
            rest.split_off_first().ok_or_else(wrong_length)?;
            outcomes.push(Ok(Outcome {
                allowed: true,
                decisions: Vec::new(),
                batch: 0,
            }));
            continue;
        }
        if rest.first() == Some(&PAST_DEADLINE) {
            rest = &rest[1..];
            outcomes.extend((0..count).map(|_| Err(StoreError::Late)));
            continue;
        }
        let n = request.limits();
        let len = if count == 1 {
            1 + n * REPLY_FIELDS
        } else {
            n * RUN_FIELDS
        };
        if rest.len() < len {
            return Err(wrong_length());
        }
        let (this, next) = rest.split_at(len);
        rest = next;
        if count > 1 {
            replay_run(request, this, now_ms, count, &mut outcomes)?;
            continue;
        }
        outcomes.push(Ok(Outcome {
            allowed: this[0] == 1,
            decisions: this[1..]
                .chunks_exact(REPLY_FIELDS)
                .zip(&request.limits)
                .map(|(fields, limit)| decision_of(limit, fields))
                .collect(),
            batch: 0,
        }));
    }
    if !rest.is_empty() || at != requests.len() {
        return Err(wrong_length());
    }
    let batch = u32::try_from(requests.len()).unwrap_or(u32::MAX);
    for outcome in outcomes.iter_mut().flatten() {
        outcome.batch = batch;
    }
    Ok(outcomes)
}

/// One limit's decision from its fields in a single request's reply: allowed, remaining, the wait (the delay when it
/// admits, the retry when it denies) and the reset.
fn decision_of(limit: &LimitSpec, fields: &[i64]) -> Decision {
    let as_u64 = |v: i64| u64::try_from(v).unwrap_or(0);
    let allowed = fields[0] == 1;
    let wait = as_u64(fields[2]);
    if limit.algorithm.holds_slots() {
        return slots_decision(limit, allowed, as_u64(fields[1]), as_u64(fields[3]));
    }
    Decision {
        allowed,
        limit: limit.algorithm.capacity(),
        // Below zero: how far the key stands past its capacity (a debt), which headers never show.
        remaining: as_u64(fields[1]),
        retry_after_ms: if allowed { 0 } else { wait },
        reset_after_ms: as_u64(fields[3]),
        delay_ms: if allowed { wait } else { 0 },
        owed: fields[1].min(0).unsigned_abs(),
    }
}

/// A `concurrency` limit's decision from its reply, whose last field is how many expired leases the call freed
/// (counted in `tollgate_leases_expired_total`: slots of requests whose instance stopped renewing them).
#[cold]
fn slots_decision(limit: &LimitSpec, allowed: bool, remaining: u64, expired: u64) -> Decision {
    if expired > 0 {
        metrics::counter!("tollgate_leases_expired_total").increment(expired);
    }
    let max = limit.algorithm.capacity();
    Decision {
        allowed,
        limit: max,
        remaining,
        retry_after_ms: if allowed { 0 } else { SLOT_RETRY_MS },
        reset_after_ms: if remaining < max { SLOT_RETRY_MS } else { 0 },
        delay_ms: 0,
        owed: 0,
    }
}

/// Decides `count` copies of `request` one after another from the state its keys held before the run, as the
/// script would have decided them one by one: the script only worked out how many fit and stored the state they
/// leave; the algorithms here are the ones the memory store runs, which mirror the script integer for integer.
fn replay_run(
    request: &EncodedRequest,
    fields: &[i64],
    now_ms: i64,
    count: usize,
    outcomes: &mut Vec<Result<Outcome, StoreError>>,
) -> Result<(), StoreError> {
    let mut states = request
        .limits
        .iter()
        .zip(fields.chunks_exact(RUN_FIELDS))
        .map(|(limit, f)| state_before_run(&limit.algorithm, f))
        .collect::<Result<Vec<_>, _>>()?;
    let limits = &request.limits;
    // One list for the run's requests, each evaluated into it in turn.
    let mut transitions = Vec::with_capacity(limits.len());
    for _ in 0..count {
        transitions.clear();
        transitions.extend(
            limits.iter().zip(&states).map(|(l, state)| {
                algorithms::evaluate(&l.algorithm, state.as_ref(), now_ms, l.cost)
            }),
        );
        outcomes.push(Ok(algorithms::combine(
            &transitions,
            |i| limits[i].shadow,
            |i, next, _| states[i] = Some(next),
        )));
    }
    Ok(())
}

/// A key's state from a run's reply: `[had state, integers...]` in the order the script stores them.
fn state_before_run(algorithm: &Algorithm, f: &[i64]) -> Result<Option<State>, StoreError> {
    if f[0] == 0 {
        return Ok(None);
    }
    let count = |v: i64| u64::try_from(v).unwrap_or(0);
    Ok(Some(match *algorithm {
        Algorithm::FixedWindow { .. } | Algorithm::CalendarWindow { .. } => {
            State::FixedWindow(FixedWindowState {
                window_start_ms: f[1],
                count: count(f[2]),
            })
        }
        Algorithm::SlidingWindow { .. } => State::Window(WindowState {
            window_start_ms: f[1],
            current: count(f[2]),
            previous: count(f[3]),
        }),
        Algorithm::TokenBucket { .. } => State::Bucket(BucketState {
            level: f[1],
            updated_ms: f[2],
            capacity: count(f[3]),
        }),
        Algorithm::LeakyBucket { .. } => State::Meter(BucketState {
            level: f[1],
            updated_ms: f[2],
            capacity: 0,
        }),
        Algorithm::Gcra { .. } => State::Gcra(GcraState { tat: f[1] }),
        Algorithm::SlidingLog { .. } | Algorithm::Concurrency { .. } => {
            return Err(StoreError::Reply(format!(
                "a run of {} requests, which is never sent",
                algorithm.name()
            )))
        }
    }))
}

/// The algorithm ids the script switches on, as its header lists them
/// (`the_script_and_the_gateway_name_the_same_algorithm_ids` checks that they agree).
mod algorithm_id {
    pub const SLIDING_WINDOW: u64 = 1;
    pub const SLIDING_LOG: u64 = 2;
    pub const TOKEN_BUCKET: u64 = 3;
    pub const FIXED_WINDOW: u64 = 4;
    pub const GCRA: u64 = 5;
    pub const LEAKY_BUCKET: u64 = 6;
    pub const CONCURRENCY: u64 = 7;
    pub const CALENDAR_WINDOW: u64 = 8;
}

/// The script's algorithm id and four parameters for a limit (see the header of the script). `around_ms` gives the
/// time a calendar window's boundaries are drawn around (Redis's clock as this process last saw it): asked only
/// for a calendar window, so that other limits cost nothing more.
fn script_params(algorithm: &Algorithm, around_ms: &mut impl FnMut() -> i64) -> [u64; 5] {
    use algorithm_id::*;
    match *algorithm {
        Algorithm::CalendarWindow { limit, calendar } => {
            // The script cannot know time zones: it is told the window the call is expected to land in and the
            // next one's end, and counts in the next one when Redis's clock has passed the first's end.
            let window = calendar.window_at(around_ms());
            let next = calendar.next(window);
            let ms = |t: i64| u64::try_from(t).unwrap_or(0);
            [
                CALENDAR_WINDOW,
                limit,
                ms(window.start_ms),
                ms(window.end_ms),
                ms(next.end_ms),
            ]
        }
        Algorithm::SlidingWindow { limit, period_ms } => [SLIDING_WINDOW, limit, period_ms, 0, 0],
        Algorithm::SlidingLog { limit, period_ms } => [SLIDING_LOG, limit, period_ms, 0, 0],
        Algorithm::TokenBucket { rate, burst } => {
            [TOKEN_BUCKET, burst, rate.count(), rate.period_ms(), 0]
        }
        Algorithm::FixedWindow { limit, period_ms } => [FIXED_WINDOW, limit, period_ms, 0, 0],
        Algorithm::Gcra { rate, burst } => {
            let ticks = Ticks::of(rate);
            [GCRA, burst, ticks.ticks_per_ms, ticks.interval, 0]
        }
        Algorithm::LeakyBucket { rate, burst, mode } => {
            let max_delay_ms = mode.max_delay_ms();
            [
                LEAKY_BUCKET,
                burst,
                rate.count(),
                rate.period_ms(),
                max_delay_ms,
            ]
        }
        // The lease id is the request's (set when encoding); the last says whether the limit has a queue.
        Algorithm::Concurrency {
            max,
            lease_ms,
            queue,
        } => [CONCURRENCY, max, lease_ms, 0, u64::from(queue.is_some())],
    }
}

#[cfg(test)]
mod tests;
