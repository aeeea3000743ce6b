#!lua
-- The line above declares the script's flags (Redis 7 script flags; none, so not `no-writes`): Redis then checks
-- for OOM before running it and refuses it whole. A script without it is checked only at its first write command
-- that may grow memory, and only if nothing was written before it: sliding_log's ZREMRANGEBYSCORE came first and
-- let its ZADD through past maxmemory. Flags also keep the script off read-only replicas (READONLY).
-- tollgate: decide a batch of requests, one after another; each request checks every one of its limits
-- atomically and consumes from all of them only if all admit.
--
-- The gateway coalesces the checks of concurrent requests into one call (crates/limiter/src/store/batcher.rs): one
-- request or a hundred, every decision is the one it would get from a call of its own, in batch order.
--
-- KEYS     the state keys the batch uses, each once.
-- ARGV[1]  the time in milliseconds since the Unix epoch, or "" to take it from Redis TIME (the normal case:
--          every gateway instance then shares Redis's clock). Tests pass explicit times.
-- ARGV[2]  the requests, as one MessagePack array of integers (decoded in C by cmsgpack: parsing hundreds of
--          arguments one by one in Lua cost more than deciding the requests). Per entry:
--   mode   1 to commit (consume from every limit if all admit), 0 for a dry run that decides but consumes
--          nothing, 2 to give back what a commit took, 3 to add a debt (a request settled for more than it
--          reserved: the cost is the difference, see `settle`), 4 to renew the leases of a request still in
--          flight (concurrency limits; the other limits are left alone), 5 to add the leases the in-process
--          fallback took while Redis was away for a request still in flight (whatever the key holds). Redis Cluster needs the dry run when a request's keys span
--          several hash slots: every slot is asked first, and committed only if all admit; should a slot's commit
--          deny after all (another request took the room meanwhile), the slots that admitted give back what they
--          took (see crates/limiter/src/store/redis/cluster.rs).
--   count  how many identical requests the entry stands for: 1, or a run of c > 1 consecutive committing
--          requests of one client (see "runs" below; never with a sliding_log limit, and each limit has a key of
--          its own),
--   n      the number of the request's limits,
--   deadline  Redis's time in ms from which the entry must not be decided (0: none). The gateway answers a request
--          without Redis once its time budget is spent (by `on_error`); a call that reaches Redis later (it waited
--          in a client's queue through a reconnection, or in Redis's through `CLIENT PAUSE` or a stall) must then
--          change nothing, or a request answered 503 or by the fallback would still be counted. The gateway sends
--          its deadline on Redis's clock as it last saw it, never later than the true one (see
--          crates/limiter/src/store/redis_clock.rs). For a give-back or a debt: the time its commit was decided, whose
--          window it gives back to or adds to,
--   then 8 integers per limit: the index of its key in KEYS, algorithm id, four parameters, cost, shadow (1:
--          decided and reported, never enforced: it denies nothing, and consumes only when it admits):
--   1 sliding_window  limit, period_ms
--   2 sliding_log     limit, period_ms
--   3 token_bucket    burst, rate count, rate period_ms
--   4 fixed_window    limit, period_ms
--   5 gcra            burst, ticks per ms, emission interval in ticks
--   6 leaky_bucket    burst, rate count, rate period_ms, max_delay_ms (0 in reject mode)
--   7 concurrency     max, lease_ms, the request's lease id (unique per request and instance: the member of the
--                     key's sorted set of leases), 1 when the limit has a queue; never in a run, cost 1
--   8 fixed_window    on a calendar (`calendar:`): limit, then the start and end of the window the gateway expects
--                     the call in and the end of the next (ms since the epoch, drawn in the limit's time zone
--                     around Redis's time as the gateway last saw it); Redis's clock picks one of the two windows
-- ARGV[3]  when the batch releases a slot of a limit with a queue: the channel on which a slot freed on a full key
--          is announced (its key as the message), for the requests waiting for one on every instance; "" or absent
--          otherwise.
-- ARGV[4]  the marker key that tells whether Redis lost its data (see "lost state" in 2-state.lua), "" or absent
--          for none (explicit times, a call without keys on Redis Cluster, or one sent behind ASKING to the node
--          its hash slot is migrating to). On Redis Cluster, the marker of the call's hash slot.
-- ARGV[5]  the epoch of the data the calling instance last saw in a reply (0: none yet).
-- ARGV[6]  "1" when the marker is one hash slot's (Redis Cluster): it vouches for the slot's data by being there
--          alone (see "lost state").
--
-- Returns, packed as one MessagePack array: now_ms, the epoch of the data (0 without a marker), the end of the
-- recovery window under way (0: none; see "lost state" in 2-state.lua), then per entry:
--   an entry past its deadline: -1 alone (whatever its count): it was neither decided nor counted.
--   a give-back, a debt, a renewal or an adoption of leases: 1 alone.
--   a single request: all_allowed, then per limit: allowed, remaining, wait_ms, reset_after_ms, where wait_ms is
--     delay_ms when the limit admits and retry_after_ms when it denies (the other is 0; the limit's capacity the
--     gateway knows). A committed admission reports the state after consuming; a denial, and any dry run, the
--     state as it stands (a dry run's all_allowed says whether a commit would admit). A concurrency limit
--     reports in place of reset_after_ms how many expired leases its call freed.
--   a run: per limit, the key's state before the run: 1 and its stored integers (0 for those it lacks), or 0 0
--     0 0 for a key without state. The gateway replays the run's decisions from it with the same algorithms
--     (crates/limiter/src/store/script/), which is cheaper there than encoding them here.
--
-- A dry run may still delete state no algorithm can read (a counter where sliding_log expects its sorted set), or
-- expired leases: that changes no decision. Otherwise a denial or a dry run writes nothing.
--
-- Every section mirrors crates/limiter/src/algorithms/*.rs integer for integer. Lua numbers are doubles; the gateway
-- keeps every product below 2^52 (see MAX_SCALED), where doubles are exact integers and floor(a / b) is exact.
--
-- Lua in Redis runs the whole script at every call and its costs are not C's: every closure, table and new string
-- is allocated and later collected, and a closure's upvalues are looked up one by one in a list as long as the
-- locals already captured. Defining a function per algorithm and per helper cost more than deciding a run of
-- requests. So: two functions decide (`evaluate` and
-- `span`, each switching on the algorithm) beside a handful of helpers; no table, closure or string per request;
-- the states of a batch in one flat table; every key read in one MGET; counters (but gcra's integer) packed as
-- binary, which decodes without creating strings. Measured with bench/script_cost.py.

local LIMIT_ARGS = 8
-- Integers in front of an entry's limits: mode, count, n, deadline.
local ENTRY_ARGS = 4

-- Library functions as locals: a global is a table lookup at every use. Numbers for Redis go through
-- format('%d'), as Lua's own conversion prints large integers in exponent notation.
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
local format, spack, sunpack = string.format, struct.pack, struct.unpack

local now
-- Explicit times (tests) are simulated: they may stand still or run backwards while real time passes, and Redis
-- expires keys in real time, so a key could vanish while its simulated state still matters. With explicit times
-- keys therefore get no expiry; the state an expiry would remove is by construction equivalent to no state.
local explicit_time = ARGV[1] ~= ""
if explicit_time then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + floor(tonumber(t[2]) / 1000)
end

