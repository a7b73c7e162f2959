-- expire_claim: a claimed, unstarted task past its deadline -> TIMEOUT without running it.
-- ARGV[3] id, ARGV[4] token, ARGV[5] error. Returns the previous status, or nil.
local id = ARGV[3]
local key = tkey(id)
local task = redis.call('HMGET', key, 's', 'k', 'q')
if not waiting(task[1]) or task[2] ~= ARGV[4] or not redis.call('ZSCORE', LEASES, id) then
  return nil
end
redis.call('HSET', key, 'e', ARGV[5])
finish(id, key, task[3], task[1], 'TIMEOUT')
return task[1]
