-- Set or clear ('' ) compressed stubs. KEYS: msgs, stubs, meta. ARGV: (seq, stub) pairs.
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    if ARGV[i + 1] == '' then
      redis.call('HDEL', KEYS[2], ARGV[i])
    else
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    end
  end
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('HINCRBY', KEYS[3], 'version', 1)
end
return #ARGV / 2
