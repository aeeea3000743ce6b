#!lua flags=no-writes
-- Reads the consumer directory together with its change counter, in one step so that the two agree.
-- KEYS[1]: the hash of records (field: consumer id, value: JSON); KEYS[2]: the change counter; KEYS[3]: the
-- counter's lineage (a random token set when the counter was created: a counter that starts again, after a flush
-- or on an empty Redis, has another one, so that no count can be taken for an earlier one's); KEYS[4], KEYS[5]:
-- the key index and its completeness (digests.lua).
-- ARGV[1]: "page" with ARGV[2] the HSCAN cursor ("0" to start) and ARGV[3] the fields to ask for, "head", "one"
-- with ARGV[2] the consumer id, "key" with ARGV[2] a key's SHA-256 (64 lower-case hex digits), or "holders" with
-- ARGV[2...] keys' SHA-256.
-- Returns {version, records, lineage, indexed, size}: version as a string ("0" when there is no counter: an empty
-- or new Redis); records the HSCAN reply for "page" ({next cursor, flat fields and values}), the record's JSON (or
-- false when none) for "one", {consumer id or false, its record or false} for "key", for "holders" the id of the
-- consumer whose record holds each key (false for none), false for "head"; lineage the token, or false when there
-- is none; indexed 1 when the key index is complete, else 0; size the number of records with the first page
-- (cursor "0"), else absent. A directory is read a page per call, so that a large one (a million consumers) never
-- holds Redis for long.
local version = redis.call('GET', KEYS[2]) or '0'
local lineage = redis.call('GET', KEYS[3])
local indexed = redis.call('EXISTS', KEYS[5])
if ARGV[1] == 'page' then
  -- The first page also says how many records there are, so that the reader sizes its tables once.
  local size = ARGV[2] == '0' and redis.call('HLEN', KEYS[1]) or false
  return {version, redis.call('HSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3]), lineage, indexed, size}
elseif ARGV[1] == 'head' then
  return {version, false, lineage, indexed}
elseif ARGV[1] == 'key' then
  local id = redis.call('HGET', KEYS[4], ARGV[2])
  local record = id and redis.call('HGET', KEYS[1], id)
  return {version, {id, record}, lineage, indexed}
elseif ARGV[1] == 'holders' then
  local holders = {}
  for i = 2, #ARGV do
    local id = redis.call('HGET', KEYS[4], ARGV[i])
    local record = id and redis.call('HGET', KEYS[1], id)
    -- The index is a pointer; the record is the truth.
    local holds = record and string.find(string.lower(record), ARGV[i], 1, true)
    holders[#holders + 1] = holds and id or false
  end
  return {version, holders, lineage, indexed}
end
return {version, redis.call('HGET', KEYS[1], ARGV[2]), lineage, indexed}
