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
--          nothing. Redis Cluster needs the dry run when a request's keys span several hash slots: every slot is
--          asked first, and committed only if all admit (see src/limiter/store/redis.rs).
--   count  how many identical requests the entry stands for: 1, or a run of c > 1 consecutive committing
--          requests of one client (see "runs" below; never with a sliding_log limit, and each limit has a key of
--          its own),
--   n      the number of the request's limits,
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
--   a single request: all_allowed, then per limit: allowed, limit, remaining, retry_after_ms, reset_after_ms,
--     delay_ms. A committed admission reports the state after consuming; a denial, and any dry run, the state as
--     it stands (a dry run's all_allowed says whether a commit would admit).
--   a run: per limit, the key's state before the run: 1 and its stored integers (0 for those it lacks), or 0 0
--     0 0 for a key without state. The gateway replays the run's decisions from it with the same algorithms
--     (src/limiter/store/script.rs), which is cheaper there than encoding them here.
--
-- A dry run may still delete state no algorithm can read (a key of another type): that changes no decision.
-- Otherwise a denial or a dry run writes nothing.
--
-- Every section mirrors src/limiter/algorithms/*.rs integer for integer. Lua numbers are doubles; the gateway
-- keeps every product below 2^52 (see MAX_SCALED), where doubles are exact integers and floor(a / b) is exact.
-- Numbers are written to Redis with string.format("%d") because Lua's default conversion would print large
-- integers in exponent notation.

local LIMIT_ARGS = 8
local GCRA_EPOCH_MS = 1735689600000
local GCRA = 5
local SLIDING_LOG = 2

-- Library functions as locals: a global is a table lookup at every use, and these run for every limit.
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

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

local function int(x)
  return string.format('%d', x)
end

local function ceil_div(a, b)
  return ceil(a / b)
end

-- Reads `key` with `command`. A key left by another algorithm (the limit's algorithm was changed in the config) is
-- state we cannot read: it is dropped and read afresh rather than failing with WRONGTYPE. Checked only when the read
-- fails, so the common path costs no extra command.
local function read(command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    redis.call('DEL', key)
    return redis.call(command, key, ...)
  end
  return reply
end

-- === state cache ===
--
-- The state of a key is read from Redis once per batch and written back once at its end, however many requests
-- of the batch use the key: a hot key (one client, one API key) costs two commands per batch, not per request.
-- Within the script nobody else can see or change the key, so this is the same as reading and writing every time.
--
-- Every counter is one string, written with its expiry in one command (`SET ... PX`): a command called from Lua
-- costs more than the arithmetic of a decision, so a key costs two (GET, SET) rather than three (HMGET, HSET,
-- PEXPIRE). GCRA keeps its one integer (the TAT in ticks); the others keep a tag naming the algorithm and their
-- integers, separated by colons, so that a counter written by another algorithm is never read as this one's:
local FORMATS = {
  [1] = {tag = 'sw', fields = 3}, -- sliding_window: sw:<window start ms>:<current count>:<previous count>
  [3] = {tag = 'tb', fields = 2}, -- token_bucket: tb:<level in scaled units>:<ms of the last update>
  [4] = {tag = 'fw', fields = 2}, -- fixed_window: fw:<window start ms>:<count>
  [6] = {tag = 'lb', fields = 2}, -- leaky_bucket: lb:<water in scaled units>:<ms of the last update>
}
for _, format in pairs(FORMATS) do
  format.pattern = '^' .. format.tag .. string.rep(':(%d+)', format.fields) .. '$'
end

local states = {}   -- key -> {alg, v (the integers, in the order above), dirty, ttl (ms)}
local touched = {}  -- keys in the order first read, so writes happen in a stable order

-- Every key expires once its state is equivalent to no state, so Redis empties itself when traffic stops.
local function write_back(key, s)
  if not s.dirty then
    return
  end
  local value
  if s.alg == GCRA then
    value = int(s.v[1])
  else
    local format = FORMATS[s.alg]
    value = format.tag
    for i = 1, format.fields do
      value = value .. ':' .. int(s.v[i])
    end
  end
  if explicit_time then
    redis.call('SET', key, value)
  else
    redis.call('SET', key, value, 'PX', int(max(s.ttl, 1)))
  end
  s.dirty = false
end

-- Writes back and forgets a cached state, for a limit that will work on the key in Redis itself or read it as
-- another algorithm (two configs in one batch).
local function evict(key)
  local s = states[key]
  if s then
    write_back(key, s)
    states[key] = nil
  end
end

-- The state of `key` for algorithm `alg`: its integers (none for a fresh key). A value this algorithm did not
-- write (another algorithm's, or a hash left by an older tollgate) counts as no state.
local function load(key, alg)
  local s = states[key]
  if s and s.alg == alg then
    return s
  end
  evict(key)
  local raw = read('GET', key)
  local v
  if alg == GCRA then
    v = {tonumber(raw)}
  elseif raw then
    v = {string.match(raw, FORMATS[alg].pattern)}
    for i = 1, #v do
      v[i] = tonumber(v[i])
    end
  else
    v = {}
  end
  s = {alg = alg, v = v, dirty = false}
  states[key] = s
  touched[#touched + 1] = key
  return s
end

-- Sets a cached state's integers and expiry, to be written back at the end of the batch.
local function store(s, x, y, z, ttl)
  local v = s.v
  v[1], v[2], v[3] = x, y, z
  s.dirty = true
  s.ttl = ttl
end

-- === algorithms ===
--
-- Each evaluator decides one limit for one request and returns, as plain values (tables and closures per request
-- cost more than the arithmetic):
--   ok                          whether the limit admits the request
--   capacity                    the limit's `limit` or `burst`
--   remaining, reset            after consuming, when it admits
--   standing, standing_reset    remaining and reset as the state stands
--   retry                       ms until the request would be admitted, when it denies
--   delay                       ms an admitted request must be held (leaky_bucket in delay mode)
--   x, y, z, ttl                the state to store if the request is committed (see `commit`)

-- The previous and current windows' counts of a sliding_window state, as of the window starting at `window_start`.
local function window_counts(v, window_start, period)
  local w = v[1]
  if w == window_start then
    return v[3] or 0, v[2] or 0
  elseif w == window_start - period then
    return v[2] or 0, 0
  end
  return 0, 0
end

local function sliding_window(key, limit, period, _, _, cost)
  local window_start = now - (now % period)
  local elapsed = now - window_start
  local previous, current = window_counts(load(key, 1).v, window_start, period)
  local left = period - elapsed
  local used = previous * left + current * period
  local capacity = limit * period
  local standing_reset = 0
  if current > 0 then
    standing_reset = left + period
  elseif previous > 0 then
    standing_reset = left
  end
  local standing = floor(max(capacity - used, 0) / period)

  if used + cost * period <= capacity then
    return true, limit, floor((capacity - used - cost * period) / period), left + period, standing,
      standing_reset, 0, 0, window_start, current + cost, previous, left + period
  end

  local retry
  if current + cost <= limit then
    retry = left - floor((limit - current - cost) * period / previous)
  else
    retry = left + period - floor((limit - cost) * period / current)
  end
  if retry < 1 then
    retry = 1
  end
  return false, limit, 0, 0, standing, standing_reset, retry, 0
end

local function sliding_log(key, limit, period, _, _, cost)
  evict(key)
  -- Time never runs backwards for a key, which keeps members unique (see `log_commit`).
  local t = now
  local newest = read('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] and tonumber(newest[2]) > t then
    t = tonumber(newest[2])
  end
  -- The interval is (t - period, t]. Counted, not pruned: a denied request writes nothing.
  local oldest_kept = '(' .. int(t - period)
  local count = redis.call('ZCOUNT', key, oldest_kept, '+inf')
  local standing_reset = 0
  if count > 0 then
    standing_reset = tonumber(newest[2]) + period - t
  end
  local standing = max(limit - count, 0)

  if count + cost <= limit then
    return true, limit, limit - count - cost, period, standing, standing_reset, 0, 0, t
  end

  -- Denied: wait until enough of the oldest entries in the interval leave it for `cost` to fit.
  local must_leave = count + cost - limit
  local entry = redis.call('ZRANGEBYSCORE', key, oldest_kept, '+inf', 'WITHSCORES', 'LIMIT', must_leave - 1, 1)
  local retry = period
  if entry[2] then
    retry = tonumber(entry[2]) + period - t
  end
  return false, limit, 0, 0, standing, standing_reset, retry, 0
end

-- Records an admission in a sliding log at the key's time `t`.
local function log_commit(key, t, period, cost)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(t - period))
  -- Members are "<ms>-<n>", n counting the entries already at this millisecond: entries at the newest
  -- millisecond are never pruned, so n only grows and every member is unique, however many requests share
  -- a millisecond.
  local seq = redis.call('ZCOUNT', key, int(t), int(t))
  local score = int(t)
  local args = {}
  for j = 1, cost do
    args[#args + 1] = score
    args[#args + 1] = score .. '-' .. int(seq + j)
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
    redis.call('PEXPIRE', key, int(max(t - now + period, 1)))
  end
end

-- Bucket levels are in units of 1/rate.count token-periods: one request is `unit` (the period in ms) and each
-- millisecond refills (or leaks) `per_ms` (the rate's count), so fractions are never rounded away.
-- `capacity`: the level a filling bucket tops out at, or the most water a draining meter can hold.
local function level_of(v, empty_level, capacity, per_ms, filling)
  local stored, updated = v[1], v[2]
  if not stored then
    return empty_level
  end
  local elapsed = max(now - (updated or now), 0)
  if filling then
    -- Compared, not added, so a long idle time cannot leave exact integers.
    if elapsed * per_ms >= max(capacity - stored, 0) then
      return capacity
    end
    return stored + elapsed * per_ms
  end
  -- Draining: `capacity` is the most water these parameters can hold.
  stored = min(stored, capacity)
  if elapsed * per_ms >= stored then
    return 0
  end
  return stored - elapsed * per_ms
end

local function token_bucket(key, burst, per_ms, unit, _, cost)
  local capacity = burst * unit
  local level = level_of(load(key, 3).v, capacity, capacity, per_ms, true)
  local need = cost * unit
  local standing = floor(level / unit)
  local standing_reset = ceil_div(capacity - level, per_ms)

  if level >= need then
    local after = level - need
    local reset = ceil_div(capacity - after, per_ms)
    return true, burst, floor(after / unit), reset, standing, standing_reset, 0, 0, after, now, nil, reset
  end
  return false, burst, 0, 0, standing, standing_reset, ceil_div(need - level, per_ms), 0
end

local function fixed_window(key, limit, period, _, _, cost)
  local window_start = now - (now % period)
  local left = period - (now - window_start)
  local s = load(key, 4)
  local count = 0
  if s.v[1] == window_start then
    count = s.v[2] or 0
  end
  local standing_reset = 0
  if count > 0 then
    standing_reset = left
  end
  local standing = max(limit - count, 0)
  if count + cost <= limit then
    -- The key expires when its window ends.
    return true, limit, limit - count - cost, left, standing, standing_reset, 0, 0, window_start, count + cost,
      nil, left
  end
  return false, limit, 0, 0, standing, standing_reset, left, 0
end

local function gcra(key, burst, ticks_per_ms, interval, _, cost)
  -- Time in ticks of 1/ticks_per_ms ms since GCRA_EPOCH_MS: the emission interval is a whole number of ticks.
  local t = (now - GCRA_EPOCH_MS) * ticks_per_ms
  local tolerance = interval * burst
  local increment = interval * cost
  -- A TAT beyond t + tolerance was written under another rate (the config changed): clamp it, so the key counts
  -- as fully used for one window instead of for years.
  local tat = min(load(key, GCRA).v[1] or t, t + tolerance)
  local new_tat = max(tat, t) + increment
  local allow_at = new_tat - tolerance
  -- Remaining requests count whole emission intervals of tolerance left; times in ms are ticks rounded up.
  local standing_ttl = max(tat - t, 0)
  local standing = floor(max(tolerance - standing_ttl, 0) / interval)
  local standing_reset = ceil_div(standing_ttl, ticks_per_ms)
  if t >= allow_at then
    local ttl = new_tat - t
    local reset = ceil_div(max(ttl, 0), ticks_per_ms)
    return true, burst, floor(max(tolerance - ttl, 0) / interval), reset, standing, standing_reset, 0,
      0, new_tat, nil, nil, reset
  end
  return false, burst, 0, 0, standing, standing_reset, ceil_div(max(allow_at - t, 0), ticks_per_ms), 0
end

local function leaky_bucket(key, burst, per_ms, unit, max_delay, cost)
  local capacity = burst * unit
  -- More water than these parameters can hold was written under others (the config changed): clamp it.
  local water = level_of(load(key, 6).v, 0, capacity + max_delay * per_ms, per_ms, false)
  local need = cost * unit
  local standing = floor(max(capacity - water, 0) / unit)
  local standing_reset = ceil_div(water, per_ms)
  local wait = ceil_div(max(water + need - capacity, 0), per_ms)
  if wait <= max_delay then
    local after = water + need
    local reset = ceil_div(after, per_ms)
    return true, burst, floor(max(capacity - after, 0) / unit), reset, standing, standing_reset, 0,
      wait, after, now, nil, reset
  end
  return false, burst, 0, 0, standing, standing_reset, wait - max_delay, 0
end

local evaluators = {
  [1] = sliding_window,
  [SLIDING_LOG] = sliding_log,
  [3] = token_bucket,
  [4] = fixed_window,
  [GCRA] = gcra,
  [6] = leaky_bucket,
}

-- Stores the state an admission leaves: in the cache for every algorithm but sliding_log, which writes its
-- sorted set at once (`x` is its time, `period` and `cost` its parameters).
local function commit(key, alg, x, y, z, ttl, period, cost)
  if alg == SLIDING_LOG then
    log_commit(key, x, period, cost)
    return
  end
  store(states[key], x, y, z, ttl)
end

-- === runs ===
--
-- A run is c identical requests at one `now`, each deciding after the previous one consumed. Per limit, the
-- requests it admits are the first m of them (after each admission the state only fills up, and a denial changes
-- nothing), so m has a closed form: how many times `cost` fits in what is left. The run admits the first
-- M = min(c, the m of every enforced limit) requests; a shadow limit consumes min(M, m). Each span returns the
-- key's stored state as read, m, and a function that stores the state k admissions leave; each mirrors its
-- evaluator above.

local function sliding_window_span(key, limit, period, _, _, cost)
  local window_start = now - (now % period)
  local s = load(key, 1)
  local previous, current = window_counts(s.v, window_start, period)
  local left = period - (now - window_start)
  local used = previous * left + current * period
  return s.v, floor(max(limit * period - used, 0) / (cost * period)), function(k)
    store(s, window_start, current + k * cost, previous, left + period)
  end
end

local function token_bucket_span(key, burst, per_ms, unit, _, cost)
  local capacity = burst * unit
  local s = load(key, 3)
  local level = level_of(s.v, capacity, capacity, per_ms, true)
  local need = cost * unit
  return s.v, floor(level / need), function(k)
    local after = level - k * need
    store(s, after, now, nil, ceil_div(capacity - after, per_ms))
  end
end

local function fixed_window_span(key, limit, period, _, _, cost)
  local window_start = now - (now % period)
  local s = load(key, 4)
  local count = 0
  if s.v[1] == window_start then
    count = s.v[2] or 0
  end
  return s.v, floor(max(limit - count, 0) / cost), function(k)
    store(s, window_start, count + k * cost, nil, period - (now - window_start))
  end
end

local function gcra_span(key, burst, ticks_per_ms, interval, _, cost)
  local t = (now - GCRA_EPOCH_MS) * ticks_per_ms
  local tolerance = interval * burst
  local increment = interval * cost
  local s = load(key, GCRA)
  -- After k admissions the TAT is base + k * increment; admission k + 1 needs it within the tolerance of t.
  local base = max(min(s.v[1] or t, t + tolerance), t)
  return s.v, floor(max(t + tolerance - base, 0) / increment), function(k)
    local tat = base + k * increment
    store(s, tat, nil, nil, ceil_div(tat - t, ticks_per_ms))
  end
end

local function leaky_bucket_span(key, burst, per_ms, unit, max_delay, cost)
  -- A request is admitted while the water it adds stays within what `max_delay` lets drain beyond `burst`.
  local most = burst * unit + max_delay * per_ms
  local s = load(key, 6)
  local water = level_of(s.v, 0, most, per_ms, false)
  local need = cost * unit
  return s.v, floor(max(most - water, 0) / need), function(k)
    local after = water + k * need
    store(s, after, now, nil, ceil_div(after, per_ms))
  end
end

local spans = {
  [1] = sliding_window_span,
  [3] = token_bucket_span,
  [4] = fixed_window_span,
  [GCRA] = gcra_span,
  [6] = leaky_bucket_span,
}

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
    local at = a + 3 + i * LIMIT_ARGS
    if not KEYS[input[at]] or not evaluators[input[at + 1]] or (run and not spans[input[at + 1]]) then
      return redis.error_reply('tollgate: bad limit ' .. tostring(input[at]) .. ':' .. tostring(input[at + 1]))
    end
  end
  a = a + 3 + n * LIMIT_ARGS
end

-- The reply is written as if the request will be consumed: an admitting limit's fields after consuming, a denying
-- limit's as they stand. What else the end of the request may need is kept per limit in `results`, reused from
-- request to request: the standing remaining and reset (if the request is not consumed after all), the state
-- to store (if it is) and where the limit's arguments are (false for a limit that denies).
local STRIDE = 7
local results = {}
local reply = {now}
local r = 1

-- A run of `count` requests whose `n` limits start at input[a]: stores what the admitted ones leave, and replies
-- each key's state before the run.
local function decide_run(a, n, count)
  local admitted = count
  local fits, advance = {}, {}
  for i = 0, n - 1 do
    local at = a + i * LIMIT_ARGS
    local v, fit, apply =
      spans[input[at + 1]](KEYS[input[at]], input[at + 2], input[at + 3], input[at + 4], input[at + 5], input[at + 6])
    reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4] = v[1] and 1 or 0, v[1] or 0, v[2] or 0, v[3] or 0
    r = r + 4
    fits[i], advance[i] = fit, apply
    if input[at + 7] ~= 1 and fit < admitted then
      admitted = fit
    end
  end
  for i = 0, n - 1 do
    local k = min(admitted, fits[i])
    if k > 0 then
      advance[i](k)
    end
  end
end

a = 1
while a <= #input do
  local commit_mode = input[a] == 1
  local count, n = input[a + 1], input[a + 2]
  a = a + 3
  if count > 1 then
    decide_run(a, n, count)
    a = a + n * LIMIT_ARGS
  else
    local all_allowed = true
    local first = r
    r = r + 1
    for i = 0, n - 1 do
      local o = i * STRIDE
      local ok, capacity, remaining, reset, standing, standing_reset, retry, delay, x, y, z, ttl =
        evaluators[input[a + 1]](KEYS[input[a]], input[a + 2], input[a + 3], input[a + 4], input[a + 5], input[a + 6])
      if ok then
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] =
          1, capacity, remaining, 0, reset, delay
        results[o + 1], results[o + 2], results[o + 3], results[o + 4], results[o + 5], results[o + 6], results[o + 7] =
          standing, standing_reset, x, y, z, ttl, a
      else
        reply[r + 1], reply[r + 2], reply[r + 3], reply[r + 4], reply[r + 5], reply[r + 6] =
          0, capacity, standing, retry, standing_reset, 0
        results[o + 7] = false
        -- A shadow limit that denies denies nothing: it only consumes nothing and reports its standing state.
        if input[a + 7] ~= 1 then
          all_allowed = false
        end
      end
      r = r + 6
      a = a + LIMIT_ARGS
    end
    reply[first + 1] = all_allowed and 1 or 0
    if all_allowed and commit_mode then
      for i = 0, n - 1 do
        local o = i * STRIDE
        local at = results[o + 7]
        if at then
          commit(KEYS[input[at]], input[at + 1], results[o + 3], results[o + 4], results[o + 5], results[o + 6],
            input[at + 3], input[at + 6])
        end
      end
    else
      -- Nothing consumed (a denial or a dry run): the admitting limits report their state as it stands.
      for i = 0, n - 1 do
        local o = i * STRIDE
        if results[o + 7] then
          local p = first + 1 + i * 6
          reply[p + 3], reply[p + 5], reply[p + 6] = results[o + 1], results[o + 2], 0
        end
      end
    end
  end
end

for _, key in ipairs(touched) do
  local s = states[key]
  if s then
    write_back(key, s)
  end
end
return cmsgpack.pack(reply)
