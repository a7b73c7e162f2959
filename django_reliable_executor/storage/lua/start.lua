-- start: claimed CREATED/PENDING -> RUNNING, counting an attempt, if the token still holds.
-- ARGV[3] lease expiry, ARGV[4..] pairs of task id, token. Returns 1 (started) or 0 per pair.
local lease_until = ARGV[3]
local out = {}
for i = 4, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'k', 'q')
  if waiting(task[1]) and task[2] == token and redis.call('ZSCORE', LEASES, id) then
    redis.call('HSET', key, 's', 'RUNNING', 'st', NOW)
    redis.call('HINCRBY', key, 'a', 1)
    redis.call('HINCRBY', key, 'b', 1)
    redis.call('ZADD', LEASES, lease_until, id)
    recount(task[3], task[1], 'RUNNING')
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
