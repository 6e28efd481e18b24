-- Append a summary record. KEYS: meta, summaries
-- ARGV: expected boundary ('' = any), kind, to_seq, body (JSON without id, starts '{"')
-- Returns the new id, or nil when the session is missing or the boundary moved.
if redis.call('EXISTS', KEYS[1]) == 0 then return nil end
local boundary = redis.call('HGET', KEYS[1], 'boundary_seq') or '0'
if ARGV[1] ~= '' and ARGV[1] ~= boundary then return nil end
local id = redis.call('HINCRBY', KEYS[1], 'summary_id', 1)
redis.call('RPUSH', KEYS[2], '{"id":' .. id .. ',' .. string.sub(ARGV[4], 2))
if ARGV[2] == 'compaction' then redis.call('HSET', KEYS[1], 'boundary_seq', ARGV[3]) end
redis.call('HINCRBY', KEYS[1], 'version', 1)
return id
