-- progress: store handlers' progress reports, each fenced like every write of a claim: only
-- where the task is RUNNING, held by `worker` under the claim's token and still leased.
-- ARGV[3] worker, ARGV[4..] triples of task id, token of its claim, progress (JSON).
-- Returns how many were stored.
local worker = ARGV[3]
local stored = 0
for i = 4, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 'w', 's', 'k')
  if task[1] == worker and task[2] == 'RUNNING' and task[3] == token
      and redis.call('ZSCORE', LEASES, id) then
    redis.call('HSET', key, 'pg', ARGV[i + 2])
    stored = stored + 1
  end
end
return stored
