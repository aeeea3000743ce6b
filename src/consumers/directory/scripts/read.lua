#!lua flags=no-writes
-- Reads the consumer directory together with its change counter, in one step so that the two agree.
-- KEYS[1]: the hash of records (field: consumer id, value: JSON); KEYS[2]: the change counter; KEYS[3]: the
-- counter's lineage (a random token set when the counter was created: a counter that starts again, after a flush
-- or on an empty Redis, has another one, so that no count can be taken for an earlier one's); KEYS[4], KEYS[5]:
-- the key index and its completeness (digests.lua).
-- ARGV[1]: "page" with ARGV[2] the HSCAN cursor ("0" to start) and ARGV[3] the fields to ask for, "head", "one"
-- with ARGV[2] the consumer id, or "key" with ARGV[2] a key's SHA-256 (64 lower-case hex digits).
-- Returns {version, records, lineage, indexed}: version as a string ("0" when there is no counter: an empty or new Redis);
-- records the HSCAN reply for "page" ({next cursor, flat fields and values}), the record's JSON (or false when
-- none) for "one", {consumer id or false, its record or false} for "key", false for "head"; lineage the token, or
-- false when there is none; indexed 1 when the key index is complete, else 0. A directory is read a page per call,
-- so that a large one (a million consumers) never holds Redis for long.
local version = redis.call('GET', KEYS[2]) or '0'
local lineage = redis.call('GET', KEYS[3])
local indexed = redis.call('EXISTS', KEYS[5])
if ARGV[1] == 'page' then
  return {version, redis.call('HSCAN', KEYS[1], ARGV[2], 'COUNT', ARGV[3]), lineage, indexed}
elseif ARGV[1] == 'head' then
  return {version, false, lineage, indexed}
elseif ARGV[1] == 'key' then
  local id = redis.call('HGET', KEYS[4], ARGV[2])
  local record = id and redis.call('HGET', KEYS[1], id)
  return {version, {id, record}, lineage, indexed}
end
return {version, redis.call('HGET', KEYS[1], ARGV[2]), lineage, indexed}
