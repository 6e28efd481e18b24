-- Remove every key of a session (KEYS, meta first). Returns 1 when the session existed.
local existed = redis.call('EXISTS', KEYS[1])
redis.call('DEL', unpack(KEYS))
return existed
