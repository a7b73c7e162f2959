-- expire: tasks past their max-duration deadline -> TIMEOUT, whatever they were doing.
-- A RUNNING one keeps its holder's lease (and its place in `held`): its handler may run on,
-- so the heartbeat renews the lease until it ends, retry.lua refuses while it lasts, and it
-- has not ended (end_running_on): handler_returned.lua ends it when the handler returns,
-- recover.lua once the lease lapses.
-- ARGV[3..] 4 values per task: id, token read, status read, error. Compare-and-set on what
-- was read. Returns the ids that timed out.
local out = {}
for i = 3, #ARGV, 4 do
  local id, token, expected = ARGV[i], ARGV[i + 1], ARGV[i + 2]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'k', 'q', 'p')
  local deadline = redis.call('ZSCORE', DEADLINES, id)
  if deadline and tonumber(deadline) <= NOWN and task[1] == expected and task[2] == token
      and live(expected) then
    if waiting(expected) and not redis.call('ZSCORE', LEASES, id) then
      unqueue(id, task[3], task[4])
    end
    local held = expected == 'RUNNING' and redis.call('ZSCORE', LEASES, id)
    redis.call('HSET', key, 'e', ARGV[i + 3])
    if held then
      end_running_on(id, key, task[3], 'TIMEOUT')
    else
      finish(id, key, task[3], expected, 'TIMEOUT')
    end
    out[#out + 1] = id
  end
end
return out
