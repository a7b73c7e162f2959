-- cancel: CREATED/PENDING -> CANCELLED; RUNNING -> cancel requested; terminal -> unchanged.
-- ARGV[3] id. Returns {'cancelled' | 'requested' | 'unchanged', fields}, or nil if unknown.
local id = ARGV[3]
local key = tkey(id)
local task = redis.call('HMGET', key, 's', 'q', 'p')
if not task[1] then
  return nil
end
local outcome = 'unchanged'
if waiting(task[1]) then
  if not redis.call('ZSCORE', LEASES, id) then
    unqueue(id, task[2], task[3])
  end -- a claimed task is dropped from the leases by finish: its start then fails
  finish(id, key, task[2], task[1], 'CANCELLED')
  outcome = 'cancelled'
elseif task[1] == 'RUNNING' then
  redis.call('HSET', key, 'x', '1')
  outcome = 'requested'
end
return {outcome, redis.call('HGETALL', key)}
