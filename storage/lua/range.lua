-- Active messages with ARGV[1] <= seq <= ARGV[2]. KEYS: active, msgs, stubs
-- Returns {messages (JSON array), stubs ({seq, stub, ...})}.
local seqs = scores(redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], ARGV[2], 'WITHSCORES'), false)
if #seqs == 0 then return {'[]', {}} end
return {json_array(hmget(KEYS[2], seqs)), stubs_of(KEYS[3], seqs)}
