-- The newest tool message answering ARGV[1], preferring an active one.
-- KEYS: tools, active, msgs, stubs. Returns {message, stub} or nil.
local seen = redis.call('HGET', KEYS[1], ARGV[1])
if not seen then return nil end
local seqs = {}
for seq in string.gmatch(seen, '%d+') do seqs[#seqs + 1] = seq end
local pick = seqs[#seqs]
for i = #seqs, 1, -1 do
  if #redis.call('ZRANGEBYSCORE', KEYS[2], seqs[i], seqs[i], 'LIMIT', 0, 1) > 0 then
    pick = seqs[i]
    break
  end
end
return {redis.call('HGET', KEYS[3], pick), redis.call('HGET', KEYS[4], pick)}
