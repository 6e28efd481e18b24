-- Drop index entries of sessions that are gone. KEYS: an agent's sessions index.
-- ARGV: (member, score seen) pairs; an entry whose score moved since (a turn wrote it
-- again) stays.
local removed = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    removed = removed + redis.call('ZREM', KEYS[1], ARGV[i])
  end
end
return removed
