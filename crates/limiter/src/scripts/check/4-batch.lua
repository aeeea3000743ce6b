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
    return level > 0 and (level - level % per) / per or 0

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
    if base > t + 2 * tolerance then
      base = t + 2 * tolerance
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

  elseif alg == 8 then -- fixed_window on a calendar (see `evaluate`)
    local limit, window_start, window_end = p1, p2, p3
    if now >= p3 then
      window_start, window_end = p3, p4
    end
    local b = load(k, 8)
    local count = 0
    if cache[b + 2] == window_start then
      count = cache[b + 3] or 0
    end
    if take then
      store(b, window_start, count + take * cost, nil, max(window_end - now, 1))
    end
    local room = limit - count
    return room > 0 and (room - room % cost) / cost or 0
  end

  -- leaky_bucket: a request is admitted while the water it adds stays within what `max_delay` lets drain beyond
  -- `burst`.
  local burst, per_ms, unit, max_delay = p1, p2, p3, p4
  local most = burst * unit + max_delay * per_ms
  local b = load(k, 6)
  local water = level_of(b, 0, most + burst * unit, per_ms, false)
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
    -- Ids 1 to 8 (the header's table); sliding_log and concurrency cannot run.
    if not KEYS[input[at]] or type(alg) ~= 'number' or alg < 1 or alg > 8 or alg % 1 ~= 0 or (run and (alg == 2 or alg == 7)) then
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
  now, epoch, recovering_until, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
  nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil
}
local r = 3

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
  if input[a] == 2 or input[a] == 3 then
    -- A give-back (2) or a debt (3): `deadline` is when its commit was decided.
    local debt = input[a] == 3
    a = a + ENTRY_ARGS
    for i = 0, n - 1 do
      settle(input[a + 1], input[a], input[a + 2], input[a + 3], input[a + 4], input[a + 5], input[a + 6], deadline,
        debt)
      a = a + LIMIT_ARGS
    end
    r = r + 1
    reply[r] = 1
  elseif input[a] == 4 or input[a] == 5 then
    -- The leases (concurrency limits) of a request still in flight, for a lease more. 4, a renewal: only a lease
    -- still held is renewed, so that a slot freed meanwhile (expired while Redis was out of reach) is never taken
    -- back past `max`. 5, a request the in-process fallback admitted while Redis was away: added whatever the key
    -- holds, so that Redis counts the request until it ends. The key may hold more than max meanwhile, and admits
    -- nobody until it is back under.
    local held_only = input[a] == 4
    a = a + ENTRY_ARGS
    for i = 0, n - 1 do
      if input[a + 1] == 7 then
        hold_slot(input[a], input[a + 3], input[a + 4], held_only)
      end
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
