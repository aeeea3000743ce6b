-- tollgate: check every limit of one request atomically, and consume from all of them only if all admit.
--
-- KEYS[i]  the state key of limit i.
-- ARGV[1]  the time in milliseconds since the Unix epoch, or "" to take it from Redis TIME (the normal case:
--          every gateway instance then shares Redis's clock). Tests pass explicit times.
-- ARGV[2]  "1" to commit (consume from every limit if all admit), "0" for a dry run that decides but consumes
--          nothing. Redis Cluster needs the dry run when a request's keys span several hash slots: every slot is
--          asked first, and committed only if all admit (see src/limiter/store/redis.rs).
-- ARGV[3 + 7(i-1) .. 9 + 7(i-1)]  limit i: algorithm id, four parameters, cost, shadow ("1": decided and
--          reported, never enforced: it denies nothing, and consumes only when it admits):
--   1 sliding_window  limit, period_ms
--   2 sliding_log     limit, period_ms
--   3 token_bucket    burst, rate count, rate period_ms
--   4 fixed_window    limit, period_ms
--   5 gcra            burst, ticks per ms, emission interval in ticks
--   6 leaky_bucket    burst, rate count, rate period_ms, max_delay_ms (0 in reject mode)
--
-- Returns {now_ms, all_allowed, then per limit: allowed, limit, remaining, retry_after_ms, reset_after_ms,
-- delay_ms}. A committed admission reports the state after consuming; a denial, and any dry run, the state as
-- it stands (a dry run's all_allowed says whether a commit would admit).
--
-- A dry run may still delete state no algorithm can read (a key of another type): that changes no decision.
-- Otherwise a denial or a dry run writes nothing.
--
-- Every section mirrors src/limiter/algorithms/*.rs integer for integer. Lua numbers are doubles; the gateway
-- keeps every product below 2^52 (see MAX_SCALED), where doubles are exact integers and floor(a / b) is exact.
-- Numbers are written to Redis with string.format("%d") because Lua's default conversion would print large
-- integers in exponent notation.

local ARGS_PER_LIMIT = 7
local FIRST_LIMIT_ARG = 3
local GCRA_EPOCH_MS = 1735689600000

local now
-- Explicit times (tests) are simulated: they may stand still or run backwards while real time passes, and Redis
-- expires keys in real time, so a key could vanish while its simulated state still matters. With explicit times
-- keys therefore get no expiry; the state an expiry would remove is by construction equivalent to no state.
local explicit_time = ARGV[1] ~= ""
if explicit_time then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(x)
  return string.format('%d', x)
end

-- Every key expires once its state is equivalent to no state, so Redis empties itself when traffic stops.
local function expire(key, ms)
  if not explicit_time then
    redis.call('PEXPIRE', key, int(math.max(ms, 1)))
  end
end

local function ceil_div(a, b)
  return math.ceil(a / b)
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

-- Each evaluator returns: the decision if the request is admitted, the decision if it is denied (nothing
-- consumed), and a function that commits the admission (nil when this limit denies). A decision is
-- {allowed, limit, remaining, retry_after_ms, reset_after_ms, delay_ms}.

local function sliding_window(key, limit, period, _, _, cost)
  local window_start = now - (now % period)
  local elapsed = now - window_start
  local st = read('HMGET', key, 'w', 'c', 'p')
  local w = tonumber(st[1])
  local previous, current = 0, 0
  if w == window_start then
    previous, current = tonumber(st[3]) or 0, tonumber(st[2]) or 0
  elseif w == window_start - period then
    previous, current = tonumber(st[2]) or 0, 0
  end
  local left = period - elapsed
  local used = previous * left + current * period
  local capacity = limit * period
  local standing_reset = 0
  if current > 0 then
    standing_reset = left + period
  elseif previous > 0 then
    standing_reset = left
  end
  local standing_remaining = math.floor(math.max(capacity - used, 0) / period)

  if used + cost * period <= capacity then
    local admitted = {1, limit, math.floor((capacity - used - cost * period) / period), 0, left + period, 0}
    local standing = {1, limit, standing_remaining, 0, standing_reset, 0}
    return admitted, standing, function()
      redis.call('HSET', key, 'w', int(window_start), 'c', int(current + cost), 'p', int(previous))
      expire(key, left + period)
    end
  end

  local retry
  if current + cost <= limit then
    retry = left - math.floor((limit - current - cost) * period / previous)
  else
    retry = left + period - math.floor((limit - cost) * period / current)
  end
  if retry < 1 then
    retry = 1
  end
  local denied = {0, limit, standing_remaining, retry, standing_reset, 0}
  return denied, denied, nil
end

local function sliding_log(key, limit, period, _, _, cost)
  -- Time never runs backwards for a key, which keeps members unique (see below).
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

  if count + cost <= limit then
    local admitted = {1, limit, limit - count - cost, 0, period, 0}
    local standing = {1, limit, limit - count, 0, standing_reset, 0}
    return admitted, standing, function()
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
      expire(key, t - now + period)
    end
  end

  -- Denied: wait until enough of the oldest entries in the interval leave it for `cost` to fit.
  local must_leave = count + cost - limit
  local entry = redis.call('ZRANGEBYSCORE', key, oldest_kept, '+inf', 'WITHSCORES', 'LIMIT', must_leave - 1, 1)
  local retry = period
  if entry[2] then
    retry = tonumber(entry[2]) + period - t
  end
  local denied = {0, limit, math.max(limit - count, 0), retry, standing_reset, 0}
  return denied, denied, nil
end

-- Bucket levels are in units of 1/rate.count token-periods: one request is `unit` (the period in ms) and each
-- millisecond refills (or leaks) `per_ms` (the rate's count), so fractions are never rounded away.
-- `capacity`: the level a filling bucket tops out at, or the most water a draining meter can hold.
local function read_level(key, field, empty_level, capacity, per_ms, filling)
  local st = read('HMGET', key, field, 'u')
  if not st[1] then
    return empty_level
  end
  local stored = tonumber(st[1])
  local elapsed = math.max(now - tonumber(st[2]), 0)
  if filling then
    -- Compared, not added, so a long idle time cannot leave exact integers.
    if elapsed * per_ms >= math.max(capacity - stored, 0) then
      return capacity
    end
    return stored + elapsed * per_ms
  end
  -- Draining: `capacity` is the most water these parameters can hold.
  stored = math.min(stored, capacity)
  if elapsed * per_ms >= stored then
    return 0
  end
  return stored - elapsed * per_ms
end

local function token_bucket(key, burst, per_ms, unit, _, cost)
  local capacity = burst * unit
  local level = read_level(key, 'l', capacity, capacity, per_ms, true)
  local need = cost * unit
  local standing_reset = ceil_div(capacity - level, per_ms)

  if level >= need then
    local after = level - need
    local reset = ceil_div(capacity - after, per_ms)
    local admitted = {1, burst, math.floor(after / unit), 0, reset, 0}
    local standing = {1, burst, math.floor(level / unit), 0, standing_reset, 0}
    return admitted, standing, function()
      redis.call('HSET', key, 'l', int(after), 'u', int(now))
      expire(key, reset)
    end
  end

  local denied = {0, burst, math.floor(level / unit), ceil_div(need - level, per_ms), standing_reset, 0}
  return denied, denied, nil
end

local function fixed_window(key, limit, period, _, _, cost)
  local window_start = now - (now % period)
  local left = period - (now - window_start)
  local st = read('HMGET', key, 'fw', 'fc')
  local count = 0
  if tonumber(st[1]) == window_start then
    count = tonumber(st[2]) or 0
  end
  local standing_reset = 0
  if count > 0 then
    standing_reset = left
  end
  if count + cost <= limit then
    local admitted = {1, limit, limit - count - cost, 0, left, 0}
    local standing = {1, limit, limit - count, 0, standing_reset, 0}
    return admitted, standing, function()
      if count == 0 then
        redis.call('HSET', key, 'fw', int(window_start), 'fc', int(cost))
        expire(key, left)
      else
        redis.call('HINCRBY', key, 'fc', int(cost))
      end
    end
  end
  local denied = {0, limit, math.max(limit - count, 0), left, standing_reset, 0}
  return denied, denied, nil
end

local function gcra(key, burst, ticks_per_ms, interval, _, cost)
  -- Time in ticks of 1/ticks_per_ms ms since GCRA_EPOCH_MS: the emission interval is a whole number of ticks.
  local t = (now - GCRA_EPOCH_MS) * ticks_per_ms
  local tolerance = interval * burst
  local increment = interval * cost
  -- A TAT beyond t + tolerance was written under another rate (the config changed): clamp it, so the key counts
  -- as fully used for one window instead of for years.
  local tat = math.min(tonumber(read('GET', key)) or t, t + tolerance)
  local new_tat = math.max(tat, t) + increment
  local allow_at = new_tat - tolerance
  local function to_ms(ticks)
    return ceil_div(math.max(ticks, 0), ticks_per_ms)
  end
  local function remaining(ttl)
    return math.floor(math.max(tolerance - ttl, 0) / interval)
  end
  local standing_ttl = math.max(tat - t, 0)
  local standing = {1, burst, remaining(standing_ttl), 0, to_ms(standing_ttl), 0}
  if t >= allow_at then
    local ttl = new_tat - t
    local admitted = {1, burst, remaining(ttl), 0, to_ms(ttl), 0}
    return admitted, standing, function()
      if explicit_time then
        redis.call('SET', key, int(new_tat))
      else
        redis.call('SET', key, int(new_tat), 'PX', int(math.max(to_ms(ttl), 1)))
      end
    end
  end
  local denied = {0, burst, remaining(standing_ttl), to_ms(allow_at - t), to_ms(standing_ttl), 0}
  return denied, denied, nil
end

local function leaky_bucket(key, burst, per_ms, unit, max_delay, cost)
  local capacity = burst * unit
  -- More water than these parameters can hold was written under others (the config changed): clamp it.
  local water = read_level(key, 'm', 0, capacity + max_delay * per_ms, per_ms, false)
  local need = cost * unit
  local function room(w)
    return math.floor(math.max(capacity - w, 0) / unit)
  end
  local standing = {1, burst, room(water), 0, ceil_div(water, per_ms), 0}
  local wait = ceil_div(math.max(water + need - capacity, 0), per_ms)
  if wait <= max_delay then
    local after = water + need
    local reset = ceil_div(after, per_ms)
    local admitted = {1, burst, room(after), 0, reset, wait}
    return admitted, standing, function()
      redis.call('HSET', key, 'm', int(after), 'u', int(now))
      expire(key, reset)
    end
  end
  local denied = {0, burst, room(water), wait - max_delay, ceil_div(water, per_ms), 0}
  return denied, denied, nil
end

local evaluators = {
  [1] = sliding_window,
  [2] = sliding_log,
  [3] = token_bucket,
  [4] = fixed_window,
  [5] = gcra,
  [6] = leaky_bucket,
}

local admitted, standing, commits = {}, {}, {}
local all_allowed = true
for i = 1, #KEYS do
  local base = FIRST_LIMIT_ARG + (i - 1) * ARGS_PER_LIMIT
  local evaluate = evaluators[tonumber(ARGV[base])]
  if not evaluate then
    return redis.error_reply('tollgate: unknown algorithm id ' .. tostring(ARGV[base]))
  end
  local a, s, commit = evaluate(KEYS[i], tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]),
    tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]), tonumber(ARGV[base + 5]))
  admitted[i], standing[i], commits[i] = a, s, commit
  if not commit and ARGV[base + 6] ~= '1' then
    all_allowed = false
  end
end

local reply = {now}
local chosen = standing
if all_allowed and ARGV[2] == '0' then
  reply[2] = 1
elseif all_allowed then
  chosen = {}
  for i = 1, #KEYS do
    -- A shadow limit that denies has no commit: it reports its standing state.
    if commits[i] then
      commits[i]()
      chosen[i] = admitted[i]
    else
      chosen[i] = standing[i]
    end
  end
  reply[2] = 1
else
  reply[2] = 0
end
for i = 1, #KEYS do
  for j = 1, 6 do
    reply[#reply + 1] = chosen[i][j]
  end
end
return reply
