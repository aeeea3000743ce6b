-- The key index's part of every script that changes records (prepended to write.lua, import.lua; see index.lua for
-- the keys). KEYS[4]: the index of runtime API keys, a hash of field: a key's SHA-256 (64 lower-case hex digits),
-- value: the consumer id holding it; KEYS[5]: set once the index holds every record's keys (a directory written
-- before the index existed has none until an instance has read it whole and indexed it).

-- The SHA-256 digests of a record's keys, lower-cased; none for a record that is not one (written by hand).
local function digests(json)
  local found = {}
  if not json or json == '' then
    return found
  end
  local ok, record = pcall(cjson.decode, json)
  if not ok or type(record) ~= 'table' or type(record.keys) ~= 'table' then
    return found
  end
  for _, key in ipairs(record.keys) do
    if type(key) == 'table' and type(key.sha256) == 'string' and #key.sha256 == 64 then
      found[#found + 1] = string.lower(key.sha256)
    end
  end
  return found
end

-- Replaces consumer `id`'s record `before` (JSON, or false) with `after` (JSON, or '' for none) in the index. A
-- directory that had no record yet starts with a complete index.
local function reindex(id, before, after)
  for _, digest in ipairs(digests(before)) do
    if redis.call('HGET', KEYS[4], digest) == id then
      redis.call('HDEL', KEYS[4], digest)
    end
  end
  for _, digest in ipairs(digests(after)) do
    redis.call('HSET', KEYS[4], digest, id)
  end
end

if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SET', KEYS[5], '1')
end
