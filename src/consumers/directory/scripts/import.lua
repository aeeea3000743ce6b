-- Sets many consumers' records at once (a batch of a bulk import); the import's last call counts it as one change.
-- The script starts with the line `#!lua` (added when it is loaded, before digests.lua's part), which declares its
-- flags (none): Redis then checks for OOM before running it and refuses it whole.
-- KEYS[1]: the hash of records; KEYS[2]: the change counter; KEYS[3]: the counter's lineage; KEYS[4], KEYS[5]: the
-- key index and its completeness (digests.lua).
-- ARGV[1]: "count" to count the change (the last batch), anything else to leave it uncounted for now; ARGV[2]: a
-- fresh random token, the lineage of a counter this change creates; then consumer id, record JSON, consumer id,
-- record JSON...
-- Returns the new value of the counter, or 0 when not counted.
for i = 3, #ARGV - 1, 2 do
  reindex(ARGV[i], redis.call('HGET', KEYS[1], ARGV[i]), ARGV[i + 1])
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
if ARGV[1] ~= 'count' then
  return 0
end
local version = redis.call('INCR', KEYS[2])
if version == 1 or not redis.call('GET', KEYS[3]) then
  -- A counter starting (again), or one written before lineages were: a new lineage, as write.lua does.
  redis.call('SET', KEYS[3], ARGV[2])
end
return version
