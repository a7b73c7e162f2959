-- start: claimed CREATED/PENDING -> RUNNING, counting an attempt, if the token still holds.
-- ARGV[3] lease expiry, ARGV[4] this call's nonce, ARGV[5..] pairs of task id, token.
-- Returns 1 (started) or 0 per pair. Sent again after a lost reply (same nonce), it answers
-- the same.
-- rate_limit: a task claimed with its log window noted (`rw`, see claim.lua) starts only if
-- its logged claim is still in the window, and moves it to now; otherwise it is handed back
-- (waiting again, unclaimed, no attempt counted) and 0 is returned.
local lease_until, nonce = ARGV[3], ARGV[4]
local out = {}
for i = 5, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'k', 'q', 'rq', 'rw', 'n', 'rk', 'p')
  local held = waiting(task[1]) and task[2] == token and redis.call('ZSCORE', LEASES, id)
  if held and task[5] then
    redis.call('HDEL', key, 'rw')
    if not rate_restamp(rate_bucket(task[6], task[7]), id .. ':' .. token, tonumber(task[5])) then
      hand_back(id, key, task[3], task[8])
      held = false
    end
  end
  if task[1] == 'RUNNING' and task[2] == token and task[4] == nonce then
    out[#out + 1] = 1 -- this very call, sent again after a lost reply: already done
  elseif held then
    redis.call('HSET', key, 's', 'RUNNING', 'st', NOW, 'rq', nonce)
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
