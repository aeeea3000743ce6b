-- tollgate: check every limit of one request atomically, and consume from all of them only if all admit.
--
-- KEYS[i]  the state key of limit i.
-- ARGV[1]  the time in milliseconds since the Unix epoch, or "" to take it from Redis TIME (the normal case:
--          every gateway instance then shares Redis's clock). Tests pass explicit times.
-- ARGV[2+5(i-1) .. 6+5(i-1)]  limit i: algorithm id, three parameters, cost.
--
-- Returns {now_ms, all_allowed, then per limit: allowed, limit, remaining, retry_after_ms, reset_after_ms}.
--
-- Every section mirrors src/limiter/algorithms/*.rs integer for integer. Lua numbers are doubles; the gateway
-- keeps every product below 2^52 (see MAX_SCALED), where doubles are exact integers and floor(a / b) is exact.
-- Numbers are written to Redis with string.format("%d") because Lua's default conversion would print large
-- integers in exponent notation.

local SLIDING_WINDOW, SLIDING_LOG, TOKEN_BUCKET = 1, 2, 3

local now
if ARGV[1] ~= "" then
  now = tonumber(ARGV[1])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function int(x)
  return string.format('%d', x)
end

local function ceil_div(a, b)
  return math.ceil(a / b)
end

-- Each evaluator returns: the decision if the request is admitted, the decision if it is denied (nothing
-- consumed), and a function that commits the admission (nil when this limit denies).

local function sliding_window(key, limit, period, _, cost)
  local window_start = now - (now % period)
  local elapsed = now - window_start
  local st = redis.call('HMGET', key, 'w', 'c', 'p')
  local w = tonumber(st[1])
  local previous, current = 0, 0
  if w == window_start then
    previous, current = tonumber(st[3]), tonumber(st[2])
  elseif w == window_start - period then
    previous, current = tonumber(st[2]), 0
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
    local admitted = {1, limit, math.floor((capacity - used - cost * period) / period), 0, left + period}
    local standing = {1, limit, standing_remaining, 0, standing_reset}
    return admitted, standing, function()
      redis.call('HSET', key, 'w', int(window_start), 'c', int(current + cost), 'p', int(previous))
      redis.call('PEXPIRE', key, int(left + period))
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
  local denied = {0, limit, standing_remaining, retry, standing_reset}
  return denied, denied, nil
end

local function sliding_log(key, limit, period, _, cost)
  -- Time never runs backwards for a key, which keeps members unique (see below).
  local t = now
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] and tonumber(newest[2]) > t then
    t = tonumber(newest[2])
  end
  redis.call('ZREMRANGEBYSCORE', key, '-inf', int(t - period))
  local count = redis.call('ZCARD', key)
  local standing_reset = 0
  if count > 0 then
    standing_reset = tonumber(newest[2]) + period - t
  end

  if count + cost <= limit then
    local admitted = {1, limit, limit - count - cost, 0, period}
    local standing = {1, limit, limit - count, 0, standing_reset}
    return admitted, standing, function()
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
      redis.call('PEXPIRE', key, int(period))
    end
  end

  local must_leave = count + cost - limit
  local entry = redis.call('ZRANGE', key, must_leave - 1, must_leave - 1, 'WITHSCORES')
  local retry = period
  if entry[2] then
    retry = tonumber(entry[2]) + period - t
  end
  local denied = {0, limit, math.max(limit - count, 0), retry, standing_reset}
  return denied, denied, nil
end

local function token_bucket(key, burst, per_ms, unit, cost)
  -- Levels are in units of 1/rate.count token-periods: one token is `unit` (the period in ms) and each
  -- millisecond refills `per_ms` (the rate's count), so fractions of a token are never rounded away.
  local capacity = burst * unit
  local st = redis.call('HMGET', key, 'l', 'u')
  local level = capacity
  if st[1] then
    local stored = tonumber(st[1])
    local elapsed = math.max(now - tonumber(st[2]), 0)
    local missing = math.max(capacity - stored, 0)
    if elapsed * per_ms < missing then
      level = stored + elapsed * per_ms
    end
  end
  local need = cost * unit
  local standing_reset = ceil_div(capacity - level, per_ms)

  if level >= need then
    local after = level - need
    local reset = ceil_div(capacity - after, per_ms)
    local admitted = {1, burst, math.floor(after / unit), 0, reset}
    local standing = {1, burst, math.floor(level / unit), 0, standing_reset}
    return admitted, standing, function()
      redis.call('HSET', key, 'l', int(after), 'u', int(now))
      redis.call('PEXPIRE', key, int(math.max(reset, 1)))
    end
  end

  local denied = {0, burst, math.floor(level / unit), ceil_div(need - level, per_ms), standing_reset}
  return denied, denied, nil
end

local evaluators = {
  [SLIDING_WINDOW] = sliding_window,
  [SLIDING_LOG] = sliding_log,
  [TOKEN_BUCKET] = token_bucket,
}

local admitted, standing, commits = {}, {}, {}
local all_allowed = true
for i = 1, #KEYS do
  local base = 2 + (i - 1) * 5
  local evaluate = evaluators[tonumber(ARGV[base])]
  if not evaluate then
    return redis.error_reply('tollgate: unknown algorithm id ' .. tostring(ARGV[base]))
  end
  local a, s, commit = evaluate(KEYS[i], tonumber(ARGV[base + 1]), tonumber(ARGV[base + 2]),
    tonumber(ARGV[base + 3]), tonumber(ARGV[base + 4]))
  admitted[i], standing[i], commits[i] = a, s, commit
  if not commit then
    all_allowed = false
  end
end

local reply = {now}
local chosen = standing
if all_allowed then
  for i = 1, #KEYS do
    commits[i]()
  end
  chosen = admitted
  reply[2] = 1
else
  reply[2] = 0
end
for i = 1, #KEYS do
  for j = 1, 5 do
    reply[#reply + 1] = chosen[i][j]
  end
end
return reply
