-- One turn's write. KEYS: meta, msgs, active, users, stubs, tools, writes, responses
-- ARGV: now, count, supersede_after ('' = none), supersede_until ('' = head),
--       nfields, (meta field, value) * nfields,
--       (fingerprint, role, tool_call_id, stub, body) * count,
--       nstubs, (seq, stub or '' to clear) * nstubs,  -- compression stubs of older messages
--       response id ('' = none: a Responses API id naming this write's seqs),
--       write id ('' = none)
-- body is the message JSON without seq and chain; it always starts with '{"'.
-- Returns {first seq, superseded count, meta (values of META)}. A write id already applied
-- returns its first seq again and writes nothing ({first, 0, meta}); one that a check
-- (landed.lua) gave up on returns {0}.
local meta, msgs, active, users, stubs, tools = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local now, count = ARGV[1], tonumber(ARGV[2])
local after, upto = ARGV[3], ARGV[4]
local nfields = tonumber(ARGV[5])
local write_id = ARGV[#ARGV]

if write_id ~= '' then
  local seen = redis.call('ZSCORE', KEYS[7], write_id)
  if seen then
    if tonumber(seen) == 0 then return {0} end
    return {tonumber(seen), 0, redis.call('HMGET', meta, unpack(META))}
  end
end

local state = redis.call('HMGET', meta, 'head_seq', 'head_chain', 'last_user_seq', 'version')
if not state[4] then
  -- a new session (or one stored before versions): start from the time (see records.py)
  local time = redis.call('TIME')
  local start = time[1] .. string.format('%06d', tonumber(time[2])) .. '000'
  redis.call('HSET', meta, 'version', start)
  redis.call('HSETNX', meta, 'created_at', now)
  redis.call('PERSIST', KEYS[7])  -- a write given up on before may have left it expiring
end
redis.call('HINCRBY', meta, 'version', 1)

local head = tonumber(state[1] or '0')
local chain = state[2] or ''
local last_user = tonumber(state[3] or '0')

local superseded = 0
if after ~= '' then
  local hi = upto ~= '' and upto or '+inf'
  superseded = redis.call('ZREMRANGEBYSCORE', active, '(' .. after, hi)
  if superseded > 0 then
    redis.call('ZREMRANGEBYSCORE', users, '(' .. after, hi)
    -- new messages chain from the last message still active
    chain = redis.call('ZREVRANGE', active, 0, 0)[1] or ''
    last_user = tonumber(redis.call('ZREVRANGE', users, 0, 0)[1] or '0')
  end
end

local first = head + 1
local base = 5 + 2 * nfields
for i = 0, count - 1 do
  local at = base + 5 * i
  local role, call_id, stub = ARGV[at + 2], ARGV[at + 3], ARGV[at + 4]
  head = head + 1
  chain = redis.sha1hex(chain .. ARGV[at + 1])
  redis.call('HSET', msgs, head,
    '{"seq":' .. head .. ',"chain":"' .. chain .. '",' .. string.sub(ARGV[at + 5], 2))
  redis.call('ZADD', active, head, chain)
  if role == 'user' then
    redis.call('ZADD', users, head, head)
    last_user = head
  end
  if stub ~= '' then redis.call('HSET', stubs, head, stub) end
  if call_id ~= '' then
    local seen = redis.call('HGET', tools, call_id)
    redis.call('HSET', tools, call_id, seen and (seen .. ' ' .. head) or head)
  end
end

local at = base + 5 * count + 1
for i = 0, tonumber(ARGV[at]) - 1 do
  local seq, stub = ARGV[at + 1 + 2 * i], ARGV[at + 2 + 2 * i]
  if redis.call('HEXISTS', msgs, seq) == 1 then
    if stub == '' then redis.call('HDEL', stubs, seq) else redis.call('HSET', stubs, seq, stub) end
  end
end

local fields = {
  'head_seq', head, 'head_chain', chain, 'last_user_seq', last_user,
  'active_count', redis.call('ZCARD', active), 'updated_at', now,
}
for i = 1, nfields do
  fields[#fields + 1] = ARGV[4 + 2 * i]
  fields[#fields + 1] = ARGV[5 + 2 * i]
end
redis.call('HSET', meta, unpack(fields))
if write_id ~= '' then remember_write(KEYS[7], write_id, first) end
local response_id = ARGV[#ARGV - 1]
if response_id ~= '' and count > 0 then
  redis.call('HSET', KEYS[8], response_id, first .. ' ' .. head .. ' ' .. now)
end
return {first, superseded, redis.call('HMGET', meta, unpack(META))}
