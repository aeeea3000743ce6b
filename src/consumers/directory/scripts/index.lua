#!lua
-- Indexes the runtime API keys of a directory written before the key index existed, from the records an instance
-- has just read whole, a batch per call; the last batch marks the index complete. Nothing is written when the
-- directory changed since the read (the next full read indexes it): a batch never puts back a key revoked since.
-- KEYS[1]: the hash of records; KEYS[2]: the change counter; KEYS[3]: the counter's lineage; KEYS[4], KEYS[5]: the
-- key index and its completeness (digests.lua).
-- ARGV[1]: the change counter as the read found it ("0" for none); ARGV[2]: its lineage ("" for none); ARGV[3]:
-- "last" for the last batch; then digest, consumer id, digest, consumer id...
-- Returns 1 when the batch is indexed, 0 when the directory changed since the read.
local version = redis.call('GET', KEYS[2]) or '0'
local lineage = redis.call('GET', KEYS[3]) or ''
if version ~= ARGV[1] or lineage ~= ARGV[2] then
  return 0
end
for i = 4, #ARGV - 1, 2 do
  redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1])
end
if ARGV[3] == 'last' then
  redis.call('SET', KEYS[5], '1')
end
return 1
