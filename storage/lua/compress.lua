-- Set or clear ('' ) compressed stubs. KEYS: msgs, stubs. ARGV: (seq, stub) pairs.
for i = 1, #ARGV, 2 do
  if redis.call('HEXISTS', KEYS[1], ARGV[i]) == 1 then
    if ARGV[i + 1] == '' then
      redis.call('HDEL', KEYS[2], ARGV[i])
    else
      redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    end
  end
end
return #ARGV / 2
