-- Set meta fields of an existing session. KEYS: meta. ARGV: (field, value) pairs.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
