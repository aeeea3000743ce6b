#!lua
-- The line above declares the script's flags (Redis 7 script flags; none, so not `no-writes`): Redis then checks
-- for OOM before running it and refuses it whole. A script without it is checked only at its first write command
-- that may grow memory, and only if nothing was written before it: sliding_log's ZREMRANGEBYSCORE came first and
-- let its ZADD through past maxmemory. Flags also keep the script off read-only replicas (READONLY).
-- tollgate: decide a batch of requests, one after another; each request checks every one of its limits
-- atomically and consumes from all of them only if all admit.
--
-- The gateway coalesces the checks of concurrent requests into one call (src/limiter/store/batcher.rs): one
-- request or a hundred, every decision is the one it would get from a call of its own, in batch order.
--
-- KEYS     the state keys the batch uses, each once.
-- ARGV[1]  the time in milliseconds since the Unix epoch, or "" to take it from Redis TIME (the normal case:
--          every gateway instance then shares Redis's clock). Tests pass explicit times.
-- ARGV[2]  the requests, as one MessagePack array of integers (decoded in C by cmsgpack: parsing hundreds of
--          arguments one by one in Lua cost more than deciding the requests). Per entry:
--   mode   1 to commit (consume from every limit if all admit), 0 for a dry run that decides but consumes
--          nothing, 2 to give back what a commit took. Redis Cluster needs the dry run when a request's keys span
--          several hash slots: every slot is asked first, and committed only if all admit; should a slot's commit
--          deny after all (another request took the room meanwhile), the slots that admitted give back what they
--          took (see src/limiter/store/redis.rs).
--   count  how many identical requests the entry stands for: 1, or a run of c > 1 consecutive committing
--          requests of one client (see "runs" below; never with a sliding_log limit, and each limit has a key of
--          its own),
--   n      the number of the request's limits,
--   deadline  Redis's time in ms from which the entry must not be decided (0: none). The gateway answers a request
--          without Redis once its time budget is spent (by `on_error`); a call that reaches Redis later (it waited
--          in a client's queue through a reconnection, or in Redis's through `CLIENT PAUSE` or a stall) must then
--          change nothing, or a request answered 503 or by the fallback would still be counted. The gateway sends
--          its deadline on Redis's clock as it last saw it, never later than the true one (see
--          src/limiter/store/redis_clock.rs). For a give-back: the time its commit was decided, whose window it
--          gives back to,
--   then 8 integers per limit: the index of its key in KEYS, algorithm id, four parameters, cost, shadow (1:
--          decided and reported, never enforced: it denies nothing, and consumes only when it admits):
--   1 sliding_window  limit, period_ms
--   2 sliding_log     limit, period_ms
--   3 token_bucket    burst, rate count, rate period_ms
--   4 fixed_window    limit, period_ms
--   5 gcra            burst, ticks per ms, emission interval in ticks
--   6 leaky_bucket    burst, rate count, rate period_ms, max_delay_ms (0 in reject mode)
--
-- Returns, packed as one MessagePack array: now_ms, then per entry:
--   an entry past its deadline: -1 alone (whatever its count): it was neither decided nor counted.
--   a give-back: 1 alone.
--   a single request: all_allowed, then per limit: allowed, remaining, wait_ms, reset_after_ms, where wait_ms is
--     delay_ms when the limit admits and retry_after_ms when it denies (the other is 0; the limit's capacity the
--     gateway knows). A committed admission reports the state after consuming; a denial, and any dry run, the
--     state as it stands (a dry run's all_allowed says whether a commit would admit).
--   a run: per limit, the key's state before the run: 1 and its stored integers (0 for those it lacks), or 0 0
--     0 0 for a key without state. The gateway replays the run's decisions from it with the same algorithms
--     (src/limiter/store/script.rs), which is cheaper there than encoding them here.
--
-- A dry run may still delete state no algorithm can read (a counter where sliding_log expects its sorted set): that
-- changes no decision. Otherwise a denial or a dry run writes nothing.
--
-- Every section mirrors src/limiter/algorithms/*.rs integer for integer. Lua numbers are doubles; the gateway
-- keeps every product below 2^52 (see MAX_SCALED), where doubles are exact integers and floor(a / b) is exact.
--
-- Lua in Redis runs the whole script at every call and its costs are not C's: every closure, table and new string
-- is allocated and later collected, and a closure's upvalues are looked up one by one in a list as long as the
-- locals already captured. Defining a function per algorithm and per helper cost 117,000 instructions a call,
-- more than half of what a run of 50 requests then cost to decide. So: two functions decide (`evaluate` and
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

-- === state ===
--
-- Every counter is one string, written with its expiry in one command (`SET ... PX`): a command called from Lua
-- costs more than the arithmetic of a decision, so a key costs its share of one MGET and one SET per batch, not
-- three commands (HMGET, HSET, PEXPIRE). gcra keeps its one integer, the TAT in ticks, in decimal (Redis stores
-- it as an integer, 16 bytes less per key). The others keep the algorithm's id as one byte, then their integers as
-- little-endian doubles (exact below 2^53), so that a counter written by another algorithm is never read as this
-- one's, and decoding creates no strings:
--   1 sliding_window  window start ms, current count, previous count
--   3 token_bucket    level in scaled units, ms of the last update, the capacity it was computed under (scaled;
--                     absent in a bucket an earlier build wrote)
--   4 fixed_window    window start ms, count
--   6 leaky_bucket    water in scaled units, ms of the last update
-- (A sliding_log key is a sorted set, worked on in Redis itself.)

-- The value of every key as the batch found it (false: none, or not a string), read in one command and updated as
-- the batch writes. Keys are referred to by their index in KEYS.
local raw
if #KEYS == 0 then
  raw = {}
elseif #KEYS <= 1000 then
  -- MGET's reply is the table itself: no copy, and Redis sizes it as it builds it.
  raw = redis.call('MGET', unpack(KEYS))
else
  -- MGET in slices: `unpack` is bounded by Lua's C stack.
  raw = {}
  local from = 1
  while from <= #KEYS do
    local to = min(from + 999, #KEYS)
    local values = redis.call('MGET', unpack(KEYS, from, to))
    for i = 1, to - from + 1 do
      raw[from + i - 1] = values[i]
    end
    from = to + 1
  end
end

-- The state of each key the batch reads is decoded once and written back once, at the end, however many requests
-- use the key: a hot key (one client, one API key) costs one SET per batch, not one per request. Within the script
-- nobody else can see or change the key, so this is the same as reading and writing every time.
--
-- Per key index k, six slots from b = (k - 1) * 6 in `cache` (written as numbers, not named locals: a named local
-- is an upvalue in the functions, looked up at every use):
--   b + 1       the algorithm whose state it holds (its id; false: none)
--   b + 2 .. 4  its three integers (false where absent: no state)
--   b + 5       whether they changed since they were read
--   b + 6       the expiry in ms to write them with
-- Tables are made with room for a typical batch (4 keys here): Lua grows a table by rehashing it at every power of
-- two, which cost a run of one client's three limits 6% of its call. The nils only reserve the slots.
local cache = {
  nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
  nil, nil, nil, nil, nil, nil, nil, nil
}

-- Writes back the state cached for key k if it changed, and forgets it when `forget`. Every key expires once its
-- state is equivalent to no state, so Redis empties itself when traffic stops.
local function write_back(k, forget)
  local b = (k - 1) * 6
  local alg = cache[b + 1]
  if cache[b + 5] then
    local value
    -- sliding_window, and a token_bucket with its capacity: three integers
    if alg == 1 or (alg == 3 and cache[b + 4]) then
      value = spack('<Bddd', alg, cache[b + 2], cache[b + 3], cache[b + 4])
    elseif alg == 5 then -- gcra
      value = format('%d', cache[b + 2])
    else
      value = spack('<Bdd', alg, cache[b + 2], cache[b + 3])
    end
    if explicit_time then
      redis.call('SET', KEYS[k], value)
    else
      redis.call('SET', KEYS[k], value, 'PX', format('%d', max(cache[b + 6], 1)))
    end
    raw[k] = value
    cache[b + 5] = false
  end
  if forget then
    cache[b + 1] = false
  end
end

-- The integers of a counter that an earlier build of tollgate wrote as text (`sw:<start>:<current>:<previous>`,
-- `tb:<level>:<updated>`, `fw:<start>:<count>`, `lb:<water>:<updated>`), so that an upgrade keeps every client's
-- state (an earlier build reads a binary counter as no state); all false for anything else. Only called for a value
-- that is not in the binary layout.
local function decode_text(alg, value)
  local x, y, z
  if alg == 1 then -- sliding_window
    x, y, z = string.match(value, '^sw:(%d+):(%d+):(%d+)$')
  elseif alg == 3 then -- token_bucket
    x, y = string.match(value, '^tb:(%d+):(%d+)$')
  elseif alg == 4 then -- fixed_window
    x, y = string.match(value, '^fw:(%d+):(%d+)$')
  elseif alg == 6 then -- leaky_bucket
    x, y = string.match(value, '^lb:(%d+):(%d+)$')
  end
  x = tonumber(x)
  if not x then
    return false, false, false
  end
  return x, tonumber(y) or false, tonumber(z) or false
end

-- The state of key k for algorithm `alg`, from the cache or decoded from its value: returns b, the state's integers
-- being cache[b + 2], cache[b + 3] and cache[b + 4]. A value this algorithm did not write (another algorithm's,
-- or a hash left by an older tollgate) counts as no state.
local function load(k, alg)
  local b = (k - 1) * 6
  local cached = cache[b + 1]
  if cached == alg then
    return b
  elseif cached then
    -- Two configs in one batch: the other algorithm's state is written, then read as no state.
    write_back(k, true)
  end
  local value = raw[k]
  local _, x, y, z = nil, false, false, false
  if alg == 5 then -- gcra
    x = tonumber(value) or false
  elseif value then
    local fields = alg == 1 and 3 or 2 -- sliding_window
    if alg == 3 and #value == 25 then -- token_bucket with its capacity (without: an earlier build's)
      fields = 3
    end
    if #value == 1 + 8 * fields and string.byte(value) == alg then
      if fields == 3 then
        _, x, y, z = sunpack('<Bddd', value)
      else
        _, x, y = sunpack('<Bdd', value)
      end
    else
      x, y, z = decode_text(alg, value)
    end
  end
  cache[b + 1], cache[b + 2], cache[b + 3], cache[b + 4], cache[b + 5] = alg, x, y, z, false
  return b
end

-- Sets the integers and expiry of the state cached at b, to be written back at the end of the batch.
local function store(b, x, y, z, ttl)
  cache[b + 2], cache[b + 3], cache[b + 4], cache[b + 5], cache[b + 6] = x, y or false, z or false, true, ttl
end

-- The previous and current windows' counts of the sliding_window state at b, as of the window starting at
-- `window_start`.
local function window_counts(b, window_start, period)
  local w = cache[b + 2]
  if w == window_start then
    return cache[b + 4] or 0, cache[b + 3] or 0
  elseif w == window_start - period then
    return cache[b + 3] or 0, 0
  end
  return 0, 0
end

-- Bucket levels are in units of 1/rate.count token-periods: one request is `unit` (the period in ms) and each
-- millisecond refills (or leaks) `per_ms` (the rate's count), so fractions are never rounded away.
-- `capacity`: the level a filling bucket tops out at, or the most water a draining meter can hold.
local function level_of(b, empty_level, capacity, per_ms, filling)
  local stored, updated = cache[b + 2], cache[b + 3]
  if not stored then
    return empty_level
  end
  local elapsed = now - (updated or now)
  if elapsed < 0 then
    elapsed = 0
  end
  if filling then
    -- Compared, not added, so a long idle time cannot leave exact integers (a full or overfull bucket is full).
    if elapsed * per_ms >= capacity - stored then
      return capacity
    end
    return stored + elapsed * per_ms
  end
  -- Draining: `capacity` is the most water these parameters can hold.
  if stored > capacity then
    stored = capacity
  end
  if elapsed * per_ms >= stored then
    return 0
  end
  return stored - elapsed * per_ms
end

-- A token bucket written under a smaller burst than today's gets the new room at once: it keeps the tokens it
-- lacks, not the tokens it has. (Under a smaller one, level_of caps it.) Its state's third integer is the capacity
-- it was written under; a bucket an earlier build wrote has none and is read as it stands.
local function raise_to(b, capacity)
  local stored, was = cache[b + 2], cache[b + 4]
  if stored and was and was < capacity then
    cache[b + 2], cache[b + 4] = stored + capacity - was, capacity
  end
end

-- Runs `command` on a sliding_log key. A key holding a counter (the limit's algorithm was changed in the config) is
-- state it cannot read: it is dropped and read afresh rather than failing with WRONGTYPE. Checked only when the
-- command fails, so the common path costs no extra command.
local function log_read(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    redis.call('DEL', key)
    return redis.call(command, key, ...)
  end
  return reply
end

-- === algorithms ===
--
-- `evaluate` decides one limit (algorithm `alg`, key k, its four parameters and cost) for one request and returns,
-- as plain values:
--   ok                          whether the limit admits the request
--   remaining, reset            after consuming, when it admits
--   standing, standing_reset    remaining and reset as the state stands
--   retry                       ms until the request would be admitted, when it denies
--   delay                       ms an admitted request must be held (leaky_bucket in delay mode)
--   x, y, z, ttl                the state to store if the request is committed (see `commit`)
-- Algorithm ids: 1 sliding_window (limit, period_ms), 2 sliding_log (limit, period_ms), 3 token_bucket (burst,
-- rate count, rate period_ms), 4 fixed_window (limit, period_ms), 5 gcra (burst, ticks per ms, emission interval
-- in ticks), 6 leaky_bucket (burst, rate count, rate period_ms, max_delay_ms: 0 in reject mode).
--
-- Both `evaluate` and `span` (below) call no function they can do without on the path that admits (sliding_log
-- aside, whose sorted-set commands cost far more): a call costs Redis's Lua as much as six arithmetic operations
-- (measured: 290 instructions against 48). For integers a and b > 0, floor(a / b) is (a - a % b) / b and
-- ceil(a / b) is (a + -a % b) / b (`%` rounds toward minus infinity, and every step is exact in doubles below
-- 2^53); max and min are comparisons.

local GCRA_EPOCH_MS = 1735689600000

local function evaluate(alg, k, p1, p2, p3, p4, cost)
  if alg == 1 then -- sliding_window
    local limit, period = p1, p2
    local window_start = now - (now % period)
    local previous, current = window_counts(load(k, 1), window_start, period)
    local left = period - (now - window_start)
    local used = previous * left + current * period
    local capacity = limit * period
    local standing_reset = 0
    if current > 0 then
      standing_reset = left + period
    elseif previous > 0 then
      standing_reset = left
    end
    local free = capacity - used
    local standing = free > 0 and (free - free % period) / period or 0
    if used + cost * period <= capacity then
      local after = free - cost * period
      return true, (after - after % period) / period, left + period, standing,
        standing_reset, 0, 0, window_start, current + cost, previous, left + period
    end
    local retry
    if current + cost <= limit then
      retry = left - floor((limit - current - cost) * period / previous)
    else
      retry = left + period - floor((limit - cost) * period / current)
    end
    return false, 0, 0, standing, standing_reset, max(retry, 1), 0

  elseif alg == 2 then -- sliding_log
    local limit, period = p1, p2
    write_back(k, true)
    -- Whatever it held, the key holds no counter once a sliding_log has worked on it.
    raw[k] = false
    local key = KEYS[k]
    -- Time never runs backwards for a key, which keeps members unique (see `commit`).
    local t = now
    local newest = log_read('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest[2] and tonumber(newest[2]) > t then
      t = tonumber(newest[2])
    end
    -- The interval is (t - period, t]. Counted, not pruned: a denied request writes nothing.
    local oldest_kept = '(' .. format('%d', t - period)
    local count = redis.call('ZCOUNT', key, oldest_kept, '+inf')
    local standing_reset = 0
    if count > 0 then
      standing_reset = tonumber(newest[2]) + period - t
    end
    local standing = max(limit - count, 0)
    if count + cost <= limit then
      return true, limit - count - cost, period, standing, standing_reset, 0, 0, t
    end
    -- Denied: wait until enough of the oldest entries in the interval leave it for `cost` to fit.
    local entry =
      redis.call('ZRANGEBYSCORE', key, oldest_kept, '+inf', 'WITHSCORES', 'LIMIT', count + cost - limit - 1, 1)
    local retry = period
    if entry[2] then
      retry = tonumber(entry[2]) + period - t
    end
    return false, 0, 0, standing, standing_reset, retry, 0

  elseif alg == 3 then -- token_bucket
    local burst, per_ms, unit = p1, p2, p3
    local capacity = burst * unit
    local b = load(k, 3)
    local stored, was = cache[b + 2], cache[b + 4]
    if stored and was and was < capacity then -- raise_to, inline on the path that admits
      cache[b + 2], cache[b + 4] = stored + capacity - was, capacity
    end
    local level = level_of(b, capacity, capacity, per_ms, true)
    local need = cost * unit
    local standing = (level - level % unit) / unit
    local empty = capacity - level
    local standing_reset = (empty + -empty % per_ms) / per_ms
    if level >= need then
      local after = level - need
      empty = capacity - after
      local reset = (empty + -empty % per_ms) / per_ms
      return true, (after - after % unit) / unit, reset, standing, standing_reset, 0, 0, after, now, capacity,
        reset
    end
    return false, 0, 0, standing, standing_reset, ceil((need - level) / per_ms), 0

  elseif alg == 4 then -- fixed_window
    local limit, period = p1, p2
    local window_start = now - (now % period)
    local left = period - (now - window_start)
    local b = load(k, 4)
    local count = 0
    if cache[b + 2] == window_start then
      count = cache[b + 3] or 0
    end
    local standing_reset = 0
    if count > 0 then
      standing_reset = left
    end
    local standing = count < limit and limit - count or 0
    if count + cost <= limit then
      -- The key expires when its window ends.
      return true, limit - count - cost, left, standing, standing_reset, 0, 0, window_start, count + cost,
        nil, left
    end
    return false, 0, 0, standing, standing_reset, left, 0

  elseif alg == 5 then -- gcra
    local burst, ticks_per_ms, interval = p1, p2, p3
    -- Time in ticks of 1/ticks_per_ms ms since GCRA_EPOCH_MS: the emission interval is a whole number of ticks.
    local t = (now - GCRA_EPOCH_MS) * ticks_per_ms
    local tolerance = interval * burst
    -- A TAT beyond t + tolerance was written under another rate (the config changed): clamp it, so the key counts
    -- as fully used for one window instead of for years.
    local tat = cache[load(k, 5) + 2] or t
    if tat > t + tolerance then
      tat = t + tolerance
    end
    local new_tat = (tat > t and tat or t) + interval * cost
    local allow_at = new_tat - tolerance
    -- Remaining requests count whole emission intervals of tolerance left; times in ms are ticks rounded up.
    local standing_ttl = tat > t and tat - t or 0
    local free = tolerance - standing_ttl
    local standing = free > 0 and (free - free % interval) / interval or 0
    local standing_reset = (standing_ttl + -standing_ttl % ticks_per_ms) / ticks_per_ms
    if t >= allow_at then
      -- new_tat > t: the admission adds at least one interval to a TAT that is at least t.
      local ttl = new_tat - t
      local reset = (ttl + -ttl % ticks_per_ms) / ticks_per_ms
      free = tolerance - ttl
      return true, free > 0 and (free - free % interval) / interval or 0, reset, standing, standing_reset,
        0, 0, new_tat, nil, nil, reset
    end
    return false, 0, 0, standing, standing_reset, ceil(max(allow_at - t, 0) / ticks_per_ms), 0
  end

  local burst, per_ms, unit, max_delay = p1, p2, p3, p4
  local capacity = burst * unit
  -- More water than these parameters can hold was written under others (the config changed): clamp it.
  local water = level_of(load(k, 6), 0, capacity + max_delay * per_ms, per_ms, false)
  local need = cost * unit
  local free = capacity - water
  local standing = free > 0 and (free - free % unit) / unit or 0
  local standing_reset = (water + -water % per_ms) / per_ms
  local over = water + need - capacity
  local wait = over > 0 and (over + -over % per_ms) / per_ms or 0
  if wait <= max_delay then
    local after = water + need
    local reset = (after + -after % per_ms) / per_ms
    free = capacity - after
    return true, free > 0 and (free - free % unit) / unit or 0, reset, standing, standing_reset, 0,
      wait, after, now, nil, reset
  end
  return false, 0, 0, standing, standing_reset, wait - max_delay, 0
end

-- Stores the state an admission leaves: in the cache for every algorithm but sliding_log, which writes its
-- sorted set at once (`x` is its time, `period` and `cost` its parameters).
local function commit(k, alg, x, y, z, ttl, period, cost)
  if alg ~= 2 then -- not sliding_log
    store((k - 1) * 6, x, y, z, ttl)
    return
  end
  local key, t = KEYS[k], x
  redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', t - period))
  -- Members are "<ms>-<n>", n counting the entries already at this millisecond: entries at the newest
  -- millisecond are never pruned, so n only grows and every member is unique, however many requests share
  -- a millisecond.
  local score = format('%d', t)
  local seq = redis.call('ZCOUNT', key, score, score)
  local args = {}
  for j = 1, cost do
    args[#args + 1] = score
    args[#args + 1] = score .. '-' .. format('%d', seq + j)
    if #args >= 200 then
      redis.call('ZADD', key, unpack(args))
      args = {}
    end
  end
  if #args > 0 then
    redis.call('ZADD', key, unpack(args))
  end
  -- From the key's own (never backwards) time, which may be ahead of `now`.
  if not explicit_time then
    redis.call('PEXPIRE', key, format('%d', max(t - now + period, 1)))
  end
end

-- Gives back `cost` of what a commit decided at `at` took from the limit on key k, on the same window: a window that
-- has passed since holds nothing to give back, and no state goes below empty (or above full). Members of a
-- sliding_log are the newest ones at `at`, so that the numbering at that millisecond stays unbroken (see `commit`).
local function give_back(alg, k, p1, p2, p3, p4, cost, at)
  if alg == 2 then -- sliding_log
    local key, score = KEYS[k], format('%d', at)
    local held = log_read('ZCOUNT', key, score, score)
    local members = {}
    for j = held, max(held - cost + 1, 1), -1 do
      members[#members + 1] = score .. '-' .. format('%d', j)
    end
    if #members > 0 then
      redis.call('ZREM', key, unpack(members))
    end
    return
  end
  local b = load(k, alg)
  if alg == 1 then -- sliding_window
    local period, start = p2, cache[b + 2]
    local landed = at - at % period
    if start == landed then
      store(b, start, max((cache[b + 3] or 0) - cost, 0), cache[b + 4], start + 2 * period - now)
    elseif start == landed + period then
      store(b, start, cache[b + 3], max((cache[b + 4] or 0) - cost, 0), start + 2 * period - now)
    end
  elseif alg == 3 then -- token_bucket
    local burst, per_ms, unit = p1, p2, p3
    local capacity = burst * unit
    raise_to(b, capacity)
    local level = min(level_of(b, capacity, capacity, per_ms, true) + cost * unit, capacity)
    local empty = capacity - level
    store(b, level, now, capacity, (empty + -empty % per_ms) / per_ms)
  elseif alg == 4 then -- fixed_window
    local period, start = p2, cache[b + 2]
    if start == at - at % period then
      store(b, start, max((cache[b + 3] or 0) - cost, 0), nil, start + period - now)
    end
  elseif alg == 5 then -- gcra
    local ticks_per_ms, interval = p2, p3
    local t = (now - GCRA_EPOCH_MS) * ticks_per_ms
    local tat = cache[b + 2]
    if tat then
      tat = max(tat - interval * cost, t)
      local ahead = tat - t
      store(b, tat, nil, nil, (ahead + -ahead % ticks_per_ms) / ticks_per_ms)
    end
  else -- leaky_bucket
    local burst, per_ms, unit, max_delay = p1, p2, p3, p4
    local water = level_of(b, 0, burst * unit + max_delay * per_ms, per_ms, false)
    water = max(water - cost * unit, 0)
    store(b, water, now, nil, (water + -water % per_ms) / per_ms)
  end
end

-- === runs ===
--
-- A run is c identical requests at one `now`, each deciding after the previous one consumed. Per limit, the
-- requests it admits are the first m of them (after each admission the state only fills up, and a denial changes
-- nothing), so m has a closed form: how many times `cost` fits in what is left. The run admits the first
-- M = min(c, the m of every enforced limit) requests; a shadow limit consumes min(M, m).
--
-- `span` returns m for one limit of a run from the key's cached state and, given `take`, stores the state `take`
-- admissions leave (a run's keys are distinct, so the state is still the one m was worked out from). It mirrors
-- `evaluate`; sliding_log never runs.
local function span(alg, k, p1, p2, p3, p4, cost, take)
  if alg == 1 then -- sliding_window
    local limit, period = p1, p2
    local window_start = now - (now % period)
    local b = load(k, 1)
    local previous, current = window_counts(b, window_start, period)
    local left = period - (now - window_start)
    if take then
      store(b, window_start, current + take * cost, previous, left + period)
    end
    local room, per = limit * period - previous * left - current * period, cost * period
    return room > 0 and (room - room % per) / per or 0

  elseif alg == 3 then -- token_bucket
    local burst, per_ms, unit = p1, p2, p3
    local capacity = burst * unit
    local b = load(k, 3)
    raise_to(b, capacity)
    local level = level_of(b, capacity, capacity, per_ms, true)
    if take then
      local after = level - take * cost * unit
      local empty = capacity - after
      store(b, after, now, capacity, (empty + -empty % per_ms) / per_ms)
    end
    local per = cost * unit
    return (level - level % per) / per

  elseif alg == 4 then -- fixed_window
    local limit, period = p1, p2
    local window_start = now - (now % period)
    local b = load(k, 4)
    local count = 0
    if cache[b + 2] == window_start then
      count = cache[b + 3] or 0
    end
    if take then
      store(b, window_start, count + take * cost, nil, period - (now - window_start))
    end
    local room = limit - count
    return room > 0 and (room - room % cost) / cost or 0

  elseif alg == 5 then -- gcra
    local burst, ticks_per_ms, interval = p1, p2, p3
    local t = (now - GCRA_EPOCH_MS) * ticks_per_ms
    local tolerance = interval * burst
    local b = load(k, 5)
    -- After j admissions the TAT is base + j * increment; admission j + 1 needs it within the tolerance of t.
    local base = cache[b + 2] or t
    if base > t + tolerance then
      base = t + tolerance
    elseif base < t then
      base = t
    end
    if take then
      local tat = base + take * interval * cost
      local ahead = tat - t
      store(b, tat, nil, nil, (ahead + -ahead % ticks_per_ms) / ticks_per_ms)
    end
    local room, per = t + tolerance - base, interval * cost
    return room > 0 and (room - room % per) / per or 0
  end

  -- leaky_bucket: a request is admitted while the water it adds stays within what `max_delay` lets drain beyond
  -- `burst`.
  local burst, per_ms, unit, max_delay = p1, p2, p3, p4
  local most = burst * unit + max_delay * per_ms
  local b = load(k, 6)
  local water = level_of(b, 0, most, per_ms, false)
  if take then
    local after = water + take * cost * unit
    store(b, after, now, nil, (after + -after % per_ms) / per_ms)
  end
  local room, per = most - water, cost * unit
  return room > 0 and (room - room % per) / per or 0
end

-- === the batch ===

local input = cmsgpack.unpack(ARGV[2])

-- Checked before anything is evaluated, so a malformed call fails without having consumed anything.
local a = 1
while a <= #input do
  local run, n = input[a + 1] > 1, input[a + 2]
  if run and input[a] ~= 1 then
    return redis.error_reply('tollgate: a run of dry runs')
  end
  for i = 0, n - 1 do
    local at = a + ENTRY_ARGS + i * LIMIT_ARGS
    local alg = input[at + 1]
    -- Ids 1 to 6 (the header's table); sliding_log cannot run.
    if not KEYS[input[at]] or type(alg) ~= 'number' or alg < 1 or alg > 6 or alg % 1 ~= 0 or (run and alg == 2) then
      return redis.error_reply('tollgate: bad limit ' .. tostring(input[at]) .. ':' .. tostring(input[at + 1]))
    end
  end
  a = a + ENTRY_ARGS + n * LIMIT_ARGS
end

-- The reply is written as if the request will be consumed: an admitting limit's fields after consuming, a denying
-- limit's as they stand. What else the end of the request may need is kept per limit in `results`, reused from
-- request to request: the standing remaining and reset (if the request is not consumed after all), the state
-- to store (if it is) and where the limit's arguments are (false for a limit that denies); for a run, each limit's
-- fit. Per limit i of a request, seven slots from o = i * STRIDE:
--   o + 1, 2    the standing remaining and reset
--   o + 3 .. 6  the state to store (three integers) and its expiry in ms
--   o + 7       where the limit's arguments start in `input` (false: the limit denies)
local STRIDE = 7
-- With room for three limits and 31 reply fields, as `cache` has for four keys.
local results = {
  nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
}
local reply = {
  now, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
  nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
}
local r = 1

-- A run of `count` requests whose `n` limits start at input[a]: replies each key's state before the run, then
-- stores what the admitted requests leave.
local function decide_run(a, n, count)
  local admitted = count
  for i = 0, n - 1 do
    local at = a + i * LIMIT_ARGS
    local k = input[at]
    local fit = span(input[at + 1], k, input[at + 2], input[at + 3], input[at + 4], input[at + 5], input[at + 6])
    local b = (k - 1) * 6
    local x = cache[b + 2]
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = x and 1 or 0, x or 0, cache[b + 3] or 0,
      cache[b + 4] or 0
    r = r + 4
    results[i + 1] = fit
    if input[at + 7] ~= 1 and fit < admitted then
      admitted = fit
    end
  end
  for i = 0, n - 1 do
    local take = min(admitted, results[i + 1])
    if take > 0 then
      local at = a + i * LIMIT_ARGS
      span(input[at + 1], input[at], input[at + 2], input[at + 3], input[at + 4], input[at + 5], input[at + 6], take)
    end
  end
end

a = 1
while a <= #input do
  local commit_mode = input[a] == 1
  local count, n, deadline = input[a + 1], input[a + 2], input[a + 3]
  if input[a] == 2 then
    -- A give-back: `deadline` is when its commit was decided.
    a = a + ENTRY_ARGS
    for i = 0, n - 1 do
      give_back(input[a + 1], input[a], input[a + 2], input[a + 3], input[a + 4], input[a + 5], input[a + 6], deadline)
      a = a + LIMIT_ARGS
    end
    r = r + 1
    reply[r] = 1
  elseif deadline > 0 and now >= deadline then
    a = a + ENTRY_ARGS
    -- Its request was answered without Redis already: deciding it now would count what was never admitted.
    r = r + 1
    reply[r] = -1
    a = a + n * LIMIT_ARGS
  elseif count > 1 then
    a = a + ENTRY_ARGS
    decide_run(a, n, count)
    a = a + n * LIMIT_ARGS
  else
    a = a + ENTRY_ARGS
    local all_allowed = true
    local first = r
    r = r + 1
    for i = 0, n - 1 do
      local o = i * STRIDE
      local ok, remaining, reset, standing, standing_reset, retry, delay, x, y, z, ttl =
        evaluate(input[a + 1], input[a], input[a + 2], input[a + 3], input[a + 4], input[a + 5], input[a + 6])
      if ok then
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 1, remaining, delay, reset
        results[o + 1], results[o + 2], results[o + 3], results[o + 4], results[o + 5], results[o + 6], results[o + 7] =
          standing, standing_reset, x, y, z, ttl, a
      else
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = 0, standing, retry, standing_reset
        results[o + 7] = false
        -- A shadow limit that denies denies nothing: it only consumes nothing and reports its standing state.
        if input[a + 7] ~= 1 then
          all_allowed = false
        end
      end
      r = r + 4
      a = a + LIMIT_ARGS
    end
    reply[first + 1] = all_allowed and 1 or 0
    if all_allowed and commit_mode then
      for i = 0, n - 1 do
        local o = i * STRIDE
        local at = results[o + 7]
        if at then
          commit(input[at], input[at + 1], results[o + 3], results[o + 4], results[o + 5], results[o + 6],
            input[at + 3], input[at + 6])
        end
      end
    else
      -- Nothing consumed (a denial or a dry run): the admitting limits report their state as it stands.
      for i = 0, n - 1 do
        local o = i * STRIDE
        if results[o + 7] then
          local p = first + 1 + i * 4
          reply[p + 2], reply[p + 3], reply[p + 4] = results[o + 1], 0, results[o + 2]
        end
      end
    end
  end
end

for k = 1, #KEYS do
  write_back(k)
end
return cmsgpack.pack(reply)
