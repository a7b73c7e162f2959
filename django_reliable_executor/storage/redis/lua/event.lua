-- event: store event ARGV[4] for task ARGV[3] ("<sent at> <payload JSON>", ARGV[5]) unless one
-- of that name is stored (the first payload is kept), and make the task due now when it waits
-- for it in its queue's schedule (a task already ready, or claimed, is left where it is).
-- Returns 1, or 0 when the task does not exist or is terminal (nothing stored).
local id, name = ARGV[3], ARGV[4]
local key = tkey(id)
local task = redis.call('HMGET', key, 's', 'q', 'p', 'wt')
if not task[1] or not live(task[1]) then
  return 0
end
redis.call('HSETNX', P .. 'events:' .. id, name, ARGV[5])
if task[1] == 'PENDING' and task[4] then
  local wait = cjson.decode(task[4]) -- [kind, name, until, ids] (codec.packed_wait)
  if wait[1] == 'event' and wait[2] == name
      and redis.call('ZREM', P .. 'sched:' .. task[2], id) == 1 then
    redis.call('HSET', key, 'r', NOW)
    to_waiting(id, task[2], task[3], NOW)
  end
end
return 1
