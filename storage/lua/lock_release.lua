-- KEYS: locks. ARGV: name, token. A stale token releases nothing.
local held = redis.call('HGET', KEYS[1], ARGV[1])
if held and string.match(held, ' (.*)$') == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
