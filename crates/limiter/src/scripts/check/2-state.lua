-- === lost state ===
--
-- Concurrency slots are leases only their holders know they still need. Redis restarted without its data, a
-- FLUSHALL, a failover to a replica that missed writes, or an episode in which no call could write (out of memory,
-- a black hole) long enough for leases to end unrenewed: the slots live requests hold are then missing or expired
-- in Redis, and would be given again. A marker key, read by every call, tells: "<epoch>:<last>:<from>:<until>",
-- the epoch being when the data it vouches for began (ms), `last` the last call that wrote it (every instance's
-- once-a-second health check runs this script, so a live deployment writes it at least every second). Missing
-- (to a caller that saw an epoch before) or older than STALE_MS, the data is suspect: a new epoch begins with a
-- recovery window of RECOVERY_MS during which a concurrency limit admits no new slot and frees no lease that
-- ended after `from` (the last call before the dark episode; 0: keep all), while the holders, told by the new
-- epoch in their next reply (their health check within a second), put their leases back. A caller that has seen
-- no epoch yet (a gateway starting) opens no window on a missing marker: a cold start of every gateway is
-- refused nothing. Should such a caller have re-created the marker after a loss, the first caller that saw the
-- old epoch opens the window then (once per epoch).
--
-- On Redis Cluster no key is shared by every call: each hash slot has a marker of its own (ARGV[6] = "1"), in the
-- slot, read in the same call as the slot's keys; a node restarted empty or flushed loses the markers of its slots
-- with their keys. A slot no call touched for a while is not suspect there (its marker is written only by the calls
-- on its keys), so such a marker vouches by being there alone. Read with pcall: on the node a slot is migrating
-- from, a marker that moved already is refused as not local, and the call then goes on without it.
local RECOVERY_MS, STALE_MS, MARK_EVERY_MS = 2000, 2000, 200
-- While recovering: until when, and the time from which ended leases are kept for their holders.
local recovering_until, keep_from, epoch = 0, 0, 0
local marker = ARGV[4]
local per_hash_slot = ARGV[6] == '1'
local found = false
if marker and marker ~= '' and not explicit_time then
  found = redis.pcall('GET', marker)
  if type(found) == 'table' and found.err then
    marker = nil
  end
end
if marker and marker ~= '' and not explicit_time then
  local known = tonumber(ARGV[5]) or 0
  local born, last, from, till = string.match(found or '', '^(%d+):(%d+):(%d+):(%d+)$')
  born, last, from, till = tonumber(born), tonumber(last), tonumber(from), tonumber(till)
  local changed = true
  if not born then
    born, from, till = max(now, known + 1), 0, 0
    if known > 0 then
      till = now + RECOVERY_MS
    end
  elseif now - last > STALE_MS and not per_hash_slot then
    -- Always a later epoch than the one it replaces, whatever the clock did.
    born, from, till = max(now, born + 1), last, now + RECOVERY_MS
  elseif known > 0 and known < born and till == 0 then
    from, till = 0, now + RECOVERY_MS
  else
    changed = now - last >= MARK_EVERY_MS
  end
  if changed then
    -- A day past the last call: an abandoned prefix still empties itself, and a live deployment (whose health
    -- checks write it every second) never sees it expire.
    redis.call('SET', marker, format('%d:%d:%d:%d', born, now, from, till), 'PX', 86400000)
  end
  epoch = born
  if now < till then
    recovering_until, keep_from = till, from
  end
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
-- two, a cost worth avoiding on every call. The nils only reserve the slots.
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

