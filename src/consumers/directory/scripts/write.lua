#!lua
-- Changes one consumer's record if it is still what the writer read (compare and set), and counts the change.
-- The line above declares the script's flags (none): Redis then checks for OOM before running it and refuses it
-- whole, never writing the record without counting it.
-- KEYS[1]: the hash of records; KEYS[2]: the change counter.
-- ARGV[1]: the consumer id; ARGV[2]: "absent" or "is" (then ARGV[3] the JSON read); ARGV[4]: the new JSON, or ""
-- to delete the record.
-- Returns the new value of the counter, or -1 when the record changed since it was read (the writer reads again).
local current = redis.call('HGET', KEYS[1], ARGV[1])
if ARGV[2] == 'absent' then
  if current then return -1 end
elseif current ~= ARGV[3] then
  return -1
end
if ARGV[4] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
end
return redis.call('INCR', KEYS[2])
