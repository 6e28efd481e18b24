-- Shared by every script (prepended by storage/redis.py).
-- Key suffixes: meta (hash), msgs (hash seq -> message JSON), active (zset chain scored
-- by seq: active messages only), users (zset of active user seqs), stubs (hash seq ->
-- compressed_content), tools (hash tool_call_id -> seqs), summaries (list), locks (hash),
-- media (hash digest -> media type, newline, bytes; written by storage/redis.py), writes
-- (zset: the ids of the latest turn writes scored by their first seq, 0 for a write given
-- up on; see landed.lua).

-- the meta fields a script returns, in SessionMeta's order (storage/redis_codec.py decode_meta)
local META = {
  'head_seq', 'active_count', 'head_chain', 'last_user_seq', 'boundary_seq', 'system_prompt',
  'system_tokens', 'calibration', 'model', 'created_at', 'updated_at', 'version',
}

-- unpack() is bounded by the Lua C stack (~8000 values): read big field lists in chunks
local function hmget(key, fields)
  local out = {}
  for lo = 1, #fields, 1000 do
    local part = redis.call('HMGET', key, unpack(fields, lo, math.min(lo + 999, #fields)))
    for i = 1, #part do out[#out + 1] = part[i] end
  end
  return out
end

-- seqs of a WITHSCORES reply (member, score, ...) in the given direction
local function scores(reply, descending)
  local seqs = {}
  if descending then
    for i = #reply, 2, -2 do seqs[#seqs + 1] = reply[i] end
  else
    for i = 2, #reply, 2 do seqs[#seqs + 1] = reply[i] end
  end
  return seqs
end

-- message JSONs as one JSON array: one bulk reply instead of one per message
local function json_array(values)
  local present = {}
  for i = 1, #values do
    if values[i] then present[#present + 1] = values[i] end
  end
  return '[' .. table.concat(present, ',') .. ']'
end

-- the stubs of these seqs that exist, as a flat {seq, stub, ...} list
local function stubs_of(key, seqs)
  local found = {}
  if #seqs == 0 or redis.call('EXISTS', key) == 0 then return found end
  local values = hmget(key, seqs)
  for i = 1, #seqs do
    if values[i] then
      found[#found + 1] = seqs[i]
      found[#found + 1] = values[i]
    end
  end
  return found
end

-- the turn writes remembered per session: enough to recognise a write whose reply was lost
-- (it is checked or retried within seconds), not a log
local KEPT_WRITES = 64

local function remember_write(key, write_id, first)
  redis.call('ZADD', key, first, write_id)
  if redis.call('ZCARD', key) > KEPT_WRITES then
    redis.call('ZREMRANGEBYRANK', key, 0, -KEPT_WRITES - 1)
  end
end
