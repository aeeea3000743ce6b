//! The limiter script's calling convention: requests encoded into `EVALSHA` keys and arguments, and its reply
//! decoded into one outcome per request (the layout is documented at the top of `check.lua`).

use std::collections::HashMap;

use bytes::Bytes;
use fred::types::Value;
use rmp::encode::ByteBuf;

use super::{LimitCheck, StoreError};
use crate::limiter::algorithms::gcra::Ticks;
use crate::limiter::{Algorithm, Decision, LeakyMode, Outcome};

/// The script, reviewed as Lua in its own file.
pub(super) const CHECK_SCRIPT: &str = include_str!("../scripts/check.lua");

/// Fields per limit in the script's reply (after the request's `all_allowed`).
const REPLY_FIELDS: usize = 6;
/// Integers per limit in a request's encoding: algorithm id, four parameters, cost, shadow. The script gets one
/// more in front, the index of the limit's key.
const ARGS_PER_LIMIT: usize = 7;

/// What the script does with a request that every limit admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Consume from every limit.
    Commit,
    /// Only decide: consume nothing.
    DryRun,
}

/// One request's share of a script call, owned so that it can wait in the batch queue.
#[derive(Debug)]
pub(super) struct EncodedRequest {
    /// The state key of each limit.
    keys: Vec<Bytes>,
    /// Mode, then `ARGS_PER_LIMIT` integers per limit.
    args: Vec<u64>,
}

// === impl EncodedRequest ===

impl EncodedRequest {
    pub(super) fn new(checks: &[LimitCheck<'_>], mode: Mode) -> Self {
        let keys = checks
            .iter()
            .map(|c| Bytes::copy_from_slice(c.key.as_bytes()))
            .collect();
        let mut args = Vec::with_capacity(1 + checks.len() * ARGS_PER_LIMIT);
        args.push(match mode {
            Mode::Commit => 1,
            Mode::DryRun => 0,
        });
        for check in checks {
            let [id, a, b, c, d] = script_params(check.limit.algorithm());
            let shadow = u64::from(check.limit.is_shadow());
            args.extend([id, a, b, c, d, check.limit.cost(), shadow]);
        }
        Self { keys, args }
    }

    /// How many limits (and keys) the request has.
    pub(super) fn limits(&self) -> usize {
        self.keys.len()
    }
}

/// The arguments of `EVALSHA` for `requests`, decided at `now_ms` (or with Redis's clock when `None`): every key
/// once, the clock, and the requests packed as MessagePack.
pub(super) fn command(
    sha: &Value,
    now_ms: Option<i64>,
    requests: &[&EncodedRequest],
) -> Vec<Value> {
    let limits: usize = requests.iter().map(|r| r.limits()).sum();
    let mut keys: Vec<Value> = Vec::with_capacity(limits);
    let mut key_index: HashMap<&Bytes, u64> = HashMap::with_capacity(limits);
    let integers = requests.len() * 2 + limits * (1 + ARGS_PER_LIMIT);
    // At most 9 bytes per integer, 5 for the array header.
    let mut packed = ByteBuf::with_capacity(5 + integers * 9);
    let _ = rmp::encode::write_array_len(&mut packed, integers as u32);
    for request in requests {
        let (mode, per_limit) = request.args.split_first().unwrap_or((&0, &[]));
        put(&mut packed, *mode);
        put(&mut packed, request.keys.len() as u64);
        for (key, args) in request
            .keys
            .iter()
            .zip(per_limit.chunks_exact(ARGS_PER_LIMIT))
        {
            let index = *key_index.entry(key).or_insert_with(|| {
                keys.push(Value::Bytes(key.clone()));
                keys.len() as u64
            });
            put(&mut packed, index);
            for &arg in args {
                put(&mut packed, arg);
            }
        }
    }
    let mut command = Vec::with_capacity(4 + keys.len());
    command.push(sha.clone());
    command.push(Value::Integer(keys.len() as i64));
    command.extend(keys);
    command.push(now_ms.map_or_else(|| Value::from(""), Value::Integer));
    command.push(Value::Bytes(packed.into_vec().into()));
    command
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

/// Splits the script's reply into one outcome per request; `limits` gives each request's number of limits.
pub(super) fn parse_reply(
    reply: &[i64],
    limits: impl ExactSizeIterator<Item = usize>,
) -> Result<Vec<Outcome>, StoreError> {
    let requests = limits.len();
    let mut outcomes = Vec::with_capacity(requests);
    let wrong_length = || {
        StoreError::Reply(format!(
            "{} values in a reply for {requests} requests",
            reply.len()
        ))
    };
    // reply[0] is the script's clock.
    let mut rest = reply.get(1..).ok_or_else(wrong_length)?;
    let as_u64 = |v: i64| u64::try_from(v).unwrap_or(0);
    for n in limits {
        let len = 1 + n * REPLY_FIELDS;
        if rest.len() < len {
            return Err(wrong_length());
        }
        let (this, next) = rest.split_at(len);
        rest = next;
        let decisions = this[1..]
            .chunks_exact(REPLY_FIELDS)
            .map(|f| Decision {
                allowed: f[0] == 1,
                limit: as_u64(f[1]),
                remaining: as_u64(f[2]),
                retry_after_ms: as_u64(f[3]),
                reset_after_ms: as_u64(f[4]),
                delay_ms: as_u64(f[5]),
            })
            .collect();
        outcomes.push(Outcome {
            allowed: this[0] == 1,
            decisions,
        });
    }
    if !rest.is_empty() {
        return Err(wrong_length());
    }
    Ok(outcomes)
}

/// The script's algorithm id and four parameters for a limit (see the header of `check.lua`).
fn script_params(algorithm: &Algorithm) -> [u64; 5] {
    match *algorithm {
        Algorithm::SlidingWindow { limit, period_ms } => [1, limit, period_ms, 0, 0],
        Algorithm::SlidingLog { limit, period_ms } => [2, limit, period_ms, 0, 0],
        Algorithm::TokenBucket { rate, burst } => [3, burst, rate.count(), rate.period_ms(), 0],
        Algorithm::FixedWindow { limit, period_ms } => [4, limit, period_ms, 0, 0],
        Algorithm::Gcra { rate, burst } => {
            let ticks = Ticks::of(rate);
            [5, burst, ticks.ticks_per_ms, ticks.interval, 0]
        }
        Algorithm::LeakyBucket { rate, burst, mode } => {
            let max_delay_ms = match mode {
                LeakyMode::Reject => 0,
                LeakyMode::Delay { max_delay_ms } => max_delay_ms,
            };
            [6, burst, rate.count(), rate.period_ms(), max_delay_ms]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::algorithms::gcra::EPOCH_MS;
    use crate::limiter::Limit;

    fn limit(algorithm: Algorithm) -> Limit {
        Limit::new("l", algorithm, 2).expect("valid")
    }

    #[test]
    fn a_batch_names_each_key_once_and_packs_the_requests() {
        let window = limit(Algorithm::FixedWindow {
            limit: 5,
            period_ms: 1_000,
        });
        let check = |key| LimitCheck {
            key,
            limit: &window,
        };
        let first = EncodedRequest::new(&[check("k1"), check("k2")], Mode::Commit);
        let second = EncodedRequest::new(&[check("k2"), check("k3")], Mode::DryRun);
        let sha = Value::from("sha");
        let mut command = command(&sha, Some(77), &[&first, &second]);
        let packed = command.pop().expect("packed requests");
        let strings: Vec<String> = command
            .iter()
            .map(|v| v.as_string().unwrap_or_default())
            .collect();
        assert_eq!(strings, ["sha", "3", "k1", "k2", "k3", "77"]);
        let fixed = [4, 5, 1000, 0, 0, 2, 0];
        let mut expected = vec![1, 2, 1];
        expected.extend(fixed);
        expected.push(2);
        expected.extend(fixed);
        expected.extend([0, 2, 2]);
        expected.extend(fixed);
        expected.push(3);
        expected.extend(fixed);
        assert_eq!(unpack_reply(&packed).expect("MessagePack"), expected);
        assert_eq!((first.limits(), second.limits()), (2, 2));
    }

    #[test]
    fn a_reply_that_is_not_messagepack_integers_is_an_error() {
        assert!(unpack_reply(&Value::Integer(1)).is_err());
        assert!(unpack_reply(&Value::Bytes(Bytes::from_static(b"\x92\x01"))).is_err());
        assert!(unpack_reply(&Value::Bytes(Bytes::from_static(b"\x92\x01\xa1x"))).is_err());
        let two = unpack_reply(&Value::Bytes(Bytes::from_static(b"\x92\x01\xd0\xff")));
        assert_eq!(two.expect("two integers"), [1, -1]);
    }

    #[test]
    fn the_reply_is_split_per_request() {
        let reply = [
            123, // now
            1, 1, 5, 3, 0, 900, 0, // request 1: allowed, one limit
            0, 0, 5, 0, 400, 1_000, 0, 1, 9, 9, 0, 0,
            0, // request 2: denied by the first of two
        ];
        let outcomes = parse_reply(&reply, [1, 2].into_iter()).expect("well formed");
        assert_eq!(outcomes.len(), 2);
        assert!(outcomes[0].allowed);
        assert_eq!(outcomes[0].decisions[0].remaining, 3);
        assert!(!outcomes[1].allowed);
        assert_eq!(outcomes[1].decisions[0].retry_after_ms, 400);
        assert_eq!(outcomes[1].decisions[1].limit, 9);
    }

    #[test]
    fn a_reply_of_the_wrong_length_is_an_error() {
        let reply = [123, 1, 1, 5, 3, 0, 900, 0];
        assert!(parse_reply(&reply, [1].into_iter()).is_ok());
        assert!(parse_reply(&reply, [2].into_iter()).is_err());
        assert!(parse_reply(&reply, [1, 1].into_iter()).is_err());
        assert!(parse_reply(&reply[..7], [1].into_iter()).is_err());
        assert!(parse_reply(&reply, std::iter::empty()).is_err());
        assert!(parse_reply(&[], std::iter::empty()).is_err());
    }

    #[test]
    fn script_and_rust_share_the_gcra_epoch() {
        assert!(CHECK_SCRIPT.contains(&format!("local GCRA_EPOCH_MS = {EPOCH_MS}\n")));
    }
}
