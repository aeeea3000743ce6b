-- === algorithms ===
--
-- `evaluate` decides one limit (algorithm `alg`, key k, its four parameters and cost) for one request and returns,
-- as plain values:
--   ok                          whether the limit admits the request
--   remaining, reset            after consuming, when it admits
--   standing, standing_reset    remaining and reset as the state stands; remaining is below zero by what the key
--                               owes past its capacity (a debt, a lowered limit, a leaky_bucket's held requests),
--                               which the gateway shows in the admin API and never in headers
--   retry                       ms until the request would be admitted, when it denies
--   delay                       ms an admitted request must be held (leaky_bucket in delay mode)
--   x, y, z, ttl                the state to store if the request is committed (see `commit`)
-- Algorithm ids: 1 sliding_window (limit, period_ms), 2 sliding_log (limit, period_ms), 3 token_bucket (burst,
-- rate count, rate period_ms), 4 fixed_window (limit, period_ms), 5 gcra (burst, ticks per ms, emission interval
-- in ticks), 6 leaky_bucket (burst, rate count, rate period_ms, max_delay_ms: 0 in reject mode), 7 concurrency
-- (max, lease_ms, the request's lease id), 8 fixed_window on a calendar (limit, window start, window end, next
-- window's end).
--
-- Both `evaluate` and `span` (below) call no function they can do without on the path that admits (sliding_log
-- aside, whose sorted-set commands cost far more): a call costs Redis's Lua several arithmetic operations
-- (bench/script_cost.py counts them). For integers a and b > 0, floor(a / b) is (a - a % b) / b and
-- ceil(a / b) is (a + -a % b) / b (`%` rounds toward minus infinity, and every step is exact in doubles below
-- 2^53); max and min are comparisons.

local GCRA_EPOCH_MS = 1735689600000

local function evaluate(alg, k, p1, p2, p3, p4, cost)
  if cost > p1 then
    -- More than the capacity (p1 for every algorithm) is never admitted: denied with the state as it stands and
    -- the limit's whole window (the period, or the time to refill an empty bucket: burst * period / count, for
    -- gcra in ticks), or longer while the key is in debt.
    local _, _, _, standing, standing_reset, retry = evaluate(alg, k, p1, p2, p3, p4, 0)
    local window = p2
    -- token_bucket, gcra and leaky_bucket: the time to refill (in ticks for gcra, whose p2 and p3 are reduced).
    if alg == 3 or alg == 5 or alg == 6 then
      window = p1 * p3
      window = (window + -window % p2) / p2
    elseif alg == 8 then -- fixed_window on a calendar: the length of the window `now` falls in
      window = now < p3 and p3 - p2 or p4 - p3
    end
    return false, 0, 0, standing, standing_reset, max(window, retry), 0
  end
  if alg == 7 then -- concurrency
    -- A sorted set of the requests in flight, each scored by when its lease expires on Redis's clock: an instance
    -- renews its requests' leases while they live, so a lease past its time belongs to an instance that died or
    -- lost Redis, and its slot is freed here. What was freed is reported in place of the reset (the gateway counts
    -- it in tollgate_leases_expired_total).
    local max_held, lease, member = p1, p2, p3
    write_back(k, true)
    raw[k] = false
    local key = KEYS[k]
    if now < recovering_until then
      -- Redis lost state: no new slot until the holders put theirs back; only leases that ended before the dark
      -- episode are freed (see "lost state").
      local expired = 0
      if keep_from > 0 then
        expired = redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', keep_from))
      end
      local held = redis.call('ZCARD', key)
      return false, 0, 0, max(max_held - held, 0), expired, recovering_until - now, 0
    end
    local expired = redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', now))
    local held = redis.call('ZCARD', key)
    local standing = max(max_held - held, 0)
    if held + cost <= max_held then
      return true, standing - cost, expired, standing, expired, 0, 0, member, lease
    end
    return false, 0, 0, standing, expired, 1000, 0
  end
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
    local standing = (free - free % period) / period
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
    local standing = limit - count
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
    -- Below zero while the bucket is in debt (a settlement added more than was reserved).
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
    local standing = limit - count
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
    -- A TAT beyond t + 2 * tolerance (a full bucket and a debt of one more) was written under another rate (the
    -- config changed): clamp it, so the key counts as fully used for two windows at most instead of for years.
    local tat = cache[load(k, 5) + 2] or t
    if tat > t + 2 * tolerance then
      tat = t + 2 * tolerance
    end
    local new_tat = (tat > t and tat or t) + interval * cost
    local allow_at = new_tat - tolerance
    -- Remaining requests count whole emission intervals of tolerance left; times in ms are ticks rounded up.
    local standing_ttl = tat > t and tat - t or 0
    local free = tolerance - standing_ttl
    local standing = (free - free % interval) / interval
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

  elseif alg == 8 then -- fixed_window on a calendar
    -- The window the gateway expects the call in, [p2, p3), or the next one, [p3, p4), once Redis's clock has
    -- passed its end: the boundaries of a time zone's calendar come with the call, the script knows no zones. The
    -- gateway draws them around Redis's time as it last saw it, never later than the true one; a call later than
    -- the next window's end (past any deadline) still counts in it, for at least a millisecond.
    local limit, window_start, window_end = p1, p2, p3
    if now >= p3 then
      window_start, window_end = p3, p4
    end
    local left = max(window_end - now, 1)
    local b = load(k, 8)
    local count = 0
    if cache[b + 2] == window_start then
      count = cache[b + 3] or 0
    end
    local standing_reset = 0
    if count > 0 then
      standing_reset = left
    end
    local standing = limit - count
    if count + cost <= limit then
      return true, limit - count - cost, left, standing, standing_reset, 0, 0, window_start, count + cost,
        nil, left
    end
    return false, 0, 0, standing, standing_reset, left, 0
  end

  local burst, per_ms, unit, max_delay = p1, p2, p3, p4
  local capacity = burst * unit
  -- More water than these parameters can hold was written under others (the config changed): clamp it.
  -- (Held requests and a debt of one capacity at most.)
  local water = level_of(load(k, 6), 0, 2 * capacity + max_delay * per_ms, per_ms, false)
  local need = cost * unit
  local free = capacity - water
  local standing = (free - free % unit) / unit
  local standing_reset = (water + -water % per_ms) / per_ms
  local over = water + need - capacity
  local wait = over > 0 and (over + -over % per_ms) / per_ms or 0
  if wait <= max_delay then
    local after = water + need
    local reset = (after + -after % per_ms) / per_ms
    free = capacity - after
    return true, (free - free % unit) / unit, reset, standing, standing_reset, 0,
      wait, after, now, nil, reset
  end
  return false, 0, 0, standing, standing_reset, wait - max_delay, 0
end

-- Stores the state an admission leaves: in the cache for every algorithm but sliding_log, which writes its
-- sorted set at once (`cost` entries at `x`, `period` its parameter; `y` the key's own time when it is later than
-- `x`, a debt's).
local function commit(k, alg, x, y, z, ttl, period, cost)
  if alg == 7 then -- concurrency: the request's lease, x its id, y its length
    redis.call('ZADD', KEYS[k], format('%d', now + y), format('%d', x))
    -- Every lease in the set ends within y of now (renewals too); the set outlives the last by as long again, so
    -- that the next request finds a lease its holder stopped renewing, frees it and counts it as expired.
    if not explicit_time then
      redis.call('PEXPIRE', KEYS[k], format('%d', 2 * y))
    end
    return
  end
  if alg ~= 2 then -- not sliding_log
    store((k - 1) * 6, x, y, z, ttl)
    return
  end
  local key, t, newest = KEYS[k], x, y or x
  redis.call('ZREMRANGEBYSCORE', key, '-inf', format('%d', newest - period))
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
    redis.call('PEXPIRE', key, format('%d', max(newest - now + period, 1)))
  end
end

-- Keeps the slot `member` of a request on the concurrency limit on key k for `lease` ms from now; with `held_only`,
-- only if the key still holds it.
local function hold_slot(k, lease, member, held_only)
  local key, until_ms = KEYS[k], format('%d', now + lease)
  if held_only then
    redis.call('ZADD', key, 'XX', until_ms, format('%d', member))
  else
    redis.call('ZADD', key, until_ms, format('%d', member))
  end
  if not explicit_time then
    redis.call('PEXPIRE', key, format('%d', 2 * lease))
  end
end

-- What a key holds taken (a count, a bucket's scaled units, a GCRA's ticks) once `delta` of it is settled: given
-- back (delta < 0) never below empty, owed (delta > 0) never past `most`.
local function settled(held, delta, most)
  held = held + delta
  if delta < 0 then
    return held > 0 and held or 0
  end
  return held < most and held or most
end

-- Settles `amount` for a commit decided at `at` on the limit on key k, on the window it was decided in: given back
-- (a held request whose client left, a Cluster slot whose request another slot denied, a refund), or with `debt`
-- added as a debt (a request that settled for more than it reserved), even past the maximum: a window's counter
-- goes over its limit, a bucket below empty, a GCRA's TAT later, a meter over full, a log gets entries at `at`.
-- A window that has passed since holds nothing of it. A give-back finds nothing to give back to on a key that holds
-- nothing of that window, and takes no state below empty; a debt on a key forgotten meanwhile starts it fresh, and
-- is carried at most one capacity beyond full (the state holds at most twice the capacity, p1 for every algorithm),
-- which keeps every integer exact. Mirrors the algorithms' `settle` (crates/limiter/src/algorithms/settle.rs).
local function settle(alg, k, p1, p2, p3, p4, amount, at, debt)
  if alg == 7 then -- concurrency: the request's slot is released, whenever it ends; a slot is owed whole
    if debt then -- (never sent)
      return
    end
    local key, member = KEYS[k], format('%d', p3)
    -- A limit with a queue (p4 = 1) announces on ARGV[3] a slot freed on a key that was full for a request of its
    -- amount: requests of every instance may be waiting for it. A key that was not full has nobody waiting.
    -- Protected (pcall): a user the ACL denies the channel must still release, and fail none of the batch's other
    -- requests (waiters then find the slot by their own timer).
    if p4 == 1 and ARGV[3] and ARGV[3] ~= '' then
      local held = redis.call('ZCARD', key)
      if redis.call('ZREM', key, member) == 1 and held + amount > p1 then
        redis.pcall('PUBLISH', ARGV[3], key)
      end
      return
    end
    redis.call('ZREM', key, member)
    return
  end
  local most, delta = 2 * p1, -amount
  if debt then
    -- A decision is never later than its settlement.
    if at > now then
      at = now
    end
    amount = min(amount, most)
    delta = amount
  end
  if alg == 2 then -- sliding_log
    local period = p2
    write_back(k, true)
    raw[k] = false
    local key = KEYS[k]
    -- The key's own time, which never runs backwards (see `evaluate`).
    local t = now
    local newest = log_read('ZRANGE', key, -1, -1, 'WITHSCORES')
    if newest[2] and tonumber(newest[2]) > t then
      t = tonumber(newest[2])
    end
    if at <= t - period then
      return
    end
    if debt then
      -- Entries at `at`, numbered after those already there, by `commit`.
      local held = redis.call('ZCOUNT', key, '(' .. format('%d', t - period), '+inf')
      commit(k, 2, at, t, nil, nil, period, max(settled(held, amount, most) - held, 0))
      return
    end
    -- `at` is never later than the decision (a time this process worked out from its own clock may be a little
    -- earlier), so the oldest members from `at` on go: the decision's own, or others' from a moment before it,
    -- which leave the log no emptier than the decision's would. At each millisecond the newest members go, so that
    -- the numbering there stays unbroken (see `commit`).
    local from = format('%d', at)
    while amount > 0 do
      local first = log_read('ZRANGEBYSCORE', key, from, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
      if #first == 0 then
        return
      end
      local score = first[2]
      local held = log_read('ZCOUNT', key, score, score)
      local members = {}
      for j = held, max(held - amount + 1, 1), -1 do
        members[#members + 1] = score .. '-' .. format('%d', j)
      end
      redis.call('ZREM', key, unpack(members))
      amount = amount - #members
      from = '(' .. score
    end
    return
  end
  local b = load(k, alg)
  if not cache[b + 2] and not debt then -- no state: nothing to give back to
    return
  end
  if alg == 8 then -- fixed_window on a calendar: the window `at` landed in, of the two the call names
    local landed, ends = p2, p3
    if at >= p3 then
      landed, ends = p3, p4
    end
    if ends <= now or at < p2 then -- gone by (a window before the call's has ended)
      return
    end
    local start, count = cache[b + 2], cache[b + 3] or 0
    if start ~= landed then
      if not debt then
        return
      end
      start, count = landed, 0
    end
    store(b, start, settled(count, delta, most), nil, ends - now)
    return
  end
  -- sliding_window and fixed_window: the counts of aligned windows
  if alg == 1 or alg == 4 then
    local period, sliding = p2, alg == 1 -- sliding_window
    local landed = at - at % period
    local start, current, previous = cache[b + 2], cache[b + 3] or 0, cache[b + 4] or 0
    local kept = sliding and 2 * period or period
    if landed + kept <= now then
      return
    end
    -- The window it landed in, or for a sliding_window the next one (where it counts as the previous window).
    if start ~= landed and not (sliding and start == landed + period) then
      if not debt then
        return
      end
      if sliding and start and start > landed then
        -- A debt on a key whose clock ran further ahead goes to its previous window too.
      elseif sliding and start == landed - period then
        start, current, previous = landed, 0, current
      else
        start, current, previous = landed, 0, 0
      end
    end
    if start == landed then
      current = settled(current, delta, most)
    else
      previous = settled(previous, delta, most)
    end
    store(b, start, current, sliding and previous or nil, start + kept - now)
  elseif alg == 3 then -- token_bucket: what the bucket lacks of full, below empty in debt
    local burst, per_ms, unit = p1, p2, p3
    local capacity = burst * unit
    raise_to(b, capacity)
    local taken = capacity - level_of(b, capacity, capacity, per_ms, true)
    taken = settled(taken, delta * unit, 2 * capacity)
    store(b, capacity - taken, now, capacity, (taken + -taken % per_ms) / per_ms)
  elseif alg == 5 then -- gcra: how far the TAT is ahead of now (a TAT in the past is now)
    local burst, ticks_per_ms, interval = p1, p2, p3
    local t = (now - GCRA_EPOCH_MS) * ticks_per_ms
    local ahead = (cache[b + 2] or t) - t
    if ahead < 0 then
      ahead = 0
    end
    ahead = settled(ahead, delta * interval, 2 * interval * burst)
    store(b, t + ahead, nil, nil, (ahead + -ahead % ticks_per_ms) / ticks_per_ms)
  else -- leaky_bucket: the water, up to the most these parameters hold
    local burst, per_ms, unit, max_delay = p1, p2, p3, p4
    local full = 2 * burst * unit + max_delay * per_ms
    local water = settled(level_of(b, 0, full, per_ms, false), delta * unit, full)
    store(b, water, now, nil, (water + -water % per_ms) / per_ms)
  end
end
