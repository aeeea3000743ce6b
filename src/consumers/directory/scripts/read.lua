#!lua flags=no-writes
-- Reads the consumer directory together with its change counter, in one step so that the two agree.
-- KEYS[1]: the hash of records (field: consumer id, value: JSON); KEYS[2]: the change counter.
-- ARGV[1]: "all", or "one" with ARGV[2] the consumer id.
-- Returns {version, records}: version as a string ("0" when there is no counter: an empty or new Redis); records
-- the flat HGETALL reply for "all", the record's JSON (or false when none) for "one".
local version = redis.call('GET', KEYS[2]) or '0'
if ARGV[1] == 'all' then
  return {version, redis.call('HGETALL', KEYS[1])}
end
return {version, redis.call('HGET', KEYS[1], ARGV[2])}
