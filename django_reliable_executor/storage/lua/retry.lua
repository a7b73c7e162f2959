-- retry (by hand): FAILED/TIMEOUT/ERROR/CANCELLED -> PENDING due now, with a fresh retry
-- budget and a fresh max-duration deadline. An earlier claim cannot start it: it is in no
-- lease (start.lua checks the lease) until the next claim, which raises the token. Refused while the previous attempt's holder still holds its lease (a timed-out handler
-- still running, see expire.lua): both would run at once.
-- ARGV[3] id, ARGV[4] the status read before, ARGV[5] new deadline ('' = none).
-- Returns {'retried', fields}, {'held', worker, lease expiry} when refused for a live lease,
-- or nil when the status changed meanwhile.
local id, expected, deadline = ARGV[3], ARGV[4], ARGV[5]
local key = tkey(id)
local task = redis.call('HMGET', key, 's', 'q', 'p', 'w')
if task[1] ~= expected or live(task[1]) or task[1] == 'COMPLETED' then
  return nil
end
local held = redis.call('ZSCORE', LEASES, id)
if held and tonumber(held) > NOWN then
  return {'held', task[4] or '', held}
end
-- A lease that lapsed and was not recovered yet: a task that timed out while running ends
-- first (its batch and dependents settled), as its recovery would have ended it.
if not handler_ended(id, key) then
  unlease(id, key)
end
redis.call('HSET', key, 's', 'PENDING', 'r', NOW, 'b', 0)
redis.call('HDEL', key, 'x', 'f', 'o', 'pg', 'wf') -- a fresh run reports its progress afresh;
-- a retried dependent runs at once, awaiting nothing
if deadline ~= '' then
  redis.call('HSET', key, 'd', deadline)
  redis.call('ZADD', DEADLINES, deadline, id)
else
  redis.call('HDEL', key, 'd')
end
redis.call('ZREM', FINISHED, id)
redis.call('ZREM', P .. 'done:' .. expected, id)
recount(task[2], expected, 'PENDING')
reopen_batch_member(id, key, expected)
to_waiting(id, task[2], task[3], NOW)
return {'retried', redis.call('HGETALL', key)}
