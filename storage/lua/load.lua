-- One turn's read. KEYS: meta, msgs, active, stubs, summaries
-- ARGV: limit, since (all|boundary|turn), held version ('' = none), probe chain hashes...
-- Returns {meta (values of META), messages (JSON array), stubs ({seq, stub, ...}),
-- summaries, matched, matched_seq, held}; {0} when the session is missing. held is 1 when
-- the session's version is the held one: messages and summaries are then not read.
local meta = redis.call('HMGET', KEYS[1], unpack(META))
-- every append writes head_seq: a meta without it is a missing session
if not meta[1] and redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local PROBE = 4

local limit = tonumber(ARGV[1])
local since = ARGV[2]
local low = '-inf'
if since == 'boundary' then
  low = '(' .. (meta[5] or '0')
elseif since == 'turn' then
  local last_user = meta[4] or '0'
  if last_user ~= '0' then low = last_user end
end

local held = 0
if ARGV[3] ~= '' and meta[12] == ARGV[3] then held, limit = 1, 0 end

local seqs = {}
if limit > 0 then
  local tail = redis.call('ZREVRANGEBYSCORE', KEYS[3], '+inf', low, 'WITHSCORES', 'LIMIT', 0, limit)
  seqs = scores(tail, true)
end
local messages = '[]'
if #seqs > 0 then messages = json_array(hmget(KEYS[2], seqs)) end

-- Chains are cumulative, so the longest matched prefix ends at the last probe hash that is
-- an active chain. A resent history usually matches near its end: search backwards in
-- growing chunks.
local matched, matched_seq = 0, 0
local hi, size = #ARGV - PROBE + 1, 8
while hi > 0 and matched == 0 do
  local lo = math.max(1, hi - size + 1)
  local found = redis.call('ZMSCORE', KEYS[3], unpack(ARGV, lo + PROBE - 1, hi + PROBE - 1))
  for i = #found, 1, -1 do
    if found[i] then
      matched, matched_seq = lo + i - 1, tonumber(found[i])
      break
    end
  end
  hi, size = lo - 1, math.min(size * 8, 1000)
end

local summaries = {}
if held == 0 then summaries = redis.call('LRANGE', KEYS[5], 0, -1) end
return {meta, messages, stubs_of(KEYS[4], seqs), summaries, matched, matched_seq, held}
