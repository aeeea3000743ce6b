-- Changes one consumer's record if it is still what the writer read (compare and set), and counts the change.
-- The script starts with the line `#!lua` (added when it is loaded, before digests.lua's part), which declares its
-- flags (none): Redis then checks for OOM before running it and refuses it whole, never writing the record without
-- counting it or indexing its keys.
-- KEYS[1]: the hash of records; KEYS[2]: the change counter; KEYS[3]: the counter's lineage; KEYS[4], KEYS[5]: the
-- key index and its completeness (digests.lua).
-- ARGV[1]: the consumer id; ARGV[2]: "absent" or "is" (then ARGV[3] the JSON read); ARGV[4]: the new JSON, or ""
-- to delete the record; ARGV[5]: a fresh random token, the lineage of a counter this change creates.
-- Returns {the new value of the counter, its lineage}, or -1 when the record changed since it was read (the
-- writer reads again).
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == 'absent' then
  if current then return -1 end
elseif current ~= ARGV[3] then
  return -1
end
reindex(ARGV[1], current, ARGV[4])
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
end
local version = redis.call('INCR', KEYS[2])
local lineage = redis.call('GET', KEYS[3])
if version == 1 or not lineage then
  -- A counter starting (again), or one written before lineages were: a new lineage.
  lineage = ARGV[5]
  redis.call('SET', KEYS[3], lineage)
end
return {version, lineage}
