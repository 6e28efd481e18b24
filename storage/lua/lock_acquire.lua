-- KEYS: locks (hash name -> "expires_ms token"). ARGV: name, token, ttl_ms.
-- Returns 1 when taken, nil when another holder's lock has not expired.
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and tonumber(string.match(held, '^%d+')) > now then return nil end
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], string.format('%d %s', now + ttl, ARGV[2]))
-- the hash outlives each of its locks, and disappears after the last one expires
if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
return 1
