-- submit: store new tasks; an existing task id is left as it is.
-- ARGV[3..]: TASK_ARGS (13) values per task: id, name, queue, priority, parameter JSON, retry
-- limit, retry interval, backoff, max duration ('' = none), created, run at, deadline
-- ('' = none), rate key ('' = none).
-- Returns per task 1 (created) or the stored task's fields (it existed).
local out = {}
local promoted = {}
local woken = {}
for i = 3, #ARGV, TASK_ARGS do
  local key = tkey(ARGV[i])
  if redis.call('EXISTS', key) == 1 then
    out[#out + 1] = redis.call('HGETALL', key)
  else
    store_task(i, promoted, woken)
    out[#out + 1] = 1
  end
end
for queue in pairs(woken) do
  wake(queue)
end
return out
