-- complete: RUNNING -> COMPLETED with the result, if the token still holds.
-- ARGV[3] this call's nonce, ARGV[4..] triples of task id, token, result JSON.
-- Returns 1 (completed) or 0 per triple; sharded, 2 (completed) from the first task whose
-- ending sent a message to another shard on (the caller then delivers its outbox). Sent
-- again after a lost reply (same nonce), it answers 1 for those it completed.
local nonce = ARGV[3]
local out = {}
for i = 4, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'k', 'q', 'rq')
  if task[1] == 'COMPLETED' and task[2] == token and task[4] == nonce then
    out[#out + 1] = 1 -- this very call, sent again after a lost reply: already done
  elseif task[1] == 'RUNNING' and task[2] == token then
    redis.call('HSET', key, 'o', ARGV[i + 2], 'rq', nonce)
    finish(id, key, task[3], 'RUNNING', 'COMPLETED')
    out[#out + 1] = SENT and 2 or 1
  else
    out[#out + 1] = 0
  end
end
return out
