-- Did a turn write whose reply was lost land? KEYS: writes, meta. ARGV: write id.
-- Returns {first seq, meta (values of META)} when it did. When it did not, the id is kept
-- as given up on (score 0), so the write, still on its way, can no longer apply: {0}.
local seen = redis.call('ZSCORE', KEYS[1], ARGV[1])
if seen and tonumber(seen) > 0 then
  return {tonumber(seen), redis.call('HMGET', KEYS[2], unpack(META))}
end
if not seen then
  remember_write(KEYS[1], ARGV[1], 0)
  -- a session whose first write was given up on has no other key: do not keep this one
  if redis.call('EXISTS', KEYS[2]) == 0 then redis.call('EXPIRE', KEYS[1], 3600) end
end
return {0}
