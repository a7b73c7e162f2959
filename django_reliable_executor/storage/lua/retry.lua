-- retry (by hand): FAILED/TIMEOUT/ERROR/CANCELLED -> PENDING due now, with a fresh retry
-- budget and a fresh max-duration deadline. ARGV[3] id, ARGV[4] the status read before,
-- ARGV[5] new deadline ('' = none). Returns the task's fields, or nil when it changed meanwhile.
local id, expected, deadline = ARGV[3], ARGV[4], ARGV[5]
local key = tkey(id)
local task = redis.call('HMGET', key, 's', 'q', 'p')
if task[1] ~= expected or live(task[1]) or task[1] == 'COMPLETED' then
  return nil
end
redis.call('HSET', key, 's', 'PENDING', 'r', NOW, 'b', 0)
redis.call('HDEL', key, 'x', 'f', 'o')
if deadline ~= '' then
  redis.call('HSET', key, 'd', deadline)
  redis.call('ZADD', DEADLINES, deadline, id)
else
  redis.call('HDEL', key, 'd')
end
redis.call('ZREM', FINISHED, id)
redis.call('ZREM', P .. 'done:' .. expected, id)
recount(task[2], expected, 'PENDING')
to_waiting(id, task[2], task[3], NOW)
return redis.call('HGETALL', key)
