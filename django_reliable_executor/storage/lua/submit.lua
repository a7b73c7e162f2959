-- submit: store new tasks; an existing task id is left as it is.
-- ARGV[3..]: 12 values per task: id, name, queue, priority, parameter JSON, retry limit,
-- retry interval, backoff, max duration ('' = none), created, run at, deadline ('' = none).
-- Returns per task 1 (created) or the stored task's fields (it existed).
local out = {}
local promoted = {}
local woken = {}
for i = 3, #ARGV, 12 do
  local id, queue, priority = ARGV[i], ARGV[i + 2], ARGV[i + 3]
  local key = tkey(id)
  if redis.call('EXISTS', key) == 1 then
    out[#out + 1] = redis.call('HGETALL', key)
  else
    local run_at, deadline = ARGV[i + 10], ARGV[i + 11]
    redis.call('HSET', key, 'n', ARGV[i + 1], 'q', queue, 'p', priority, 's', 'CREATED',
      'j', ARGV[i + 4], 'rl', ARGV[i + 5], 'ri', ARGV[i + 6], 'rb', ARGV[i + 7],
      'c', ARGV[i + 9], 'r', run_at, 'a', 0, 'b', 0, 'k', 0)
    if ARGV[i + 8] ~= '' then
      redis.call('HSET', key, 'md', ARGV[i + 8])
    end
    if deadline ~= '' then
      redis.call('HSET', key, 'd', deadline)
      redis.call('ZADD', DEADLINES, deadline, id)
    end
    recount(queue, nil, 'CREATED')
    if not promoted[queue] then
      promoted[queue] = true
      redis.call('SADD', P .. 'queues', queue)
      promote(queue, 1000) -- earlier due tasks keep their place ahead of these
    end
    if tonumber(run_at) <= NOWN then
      push_ready(id, queue, priority, false)
    else
      redis.call('ZADD', P .. 'sched:' .. queue, run_at, id)
    end
    woken[queue] = true -- a delayed task too: an idle worker then waits until it is due
    out[#out + 1] = 1
  end
end
for queue in pairs(woken) do
  wake(queue)
end
return out
