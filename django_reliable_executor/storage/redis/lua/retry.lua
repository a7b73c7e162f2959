-- retry (by hand): FAILED/TIMEOUT/ERROR/CANCELLED -> PENDING due now, with a fresh retry
-- budget and a fresh max-duration deadline. An earlier claim cannot start it: it is in no
-- lease (start.lua checks the lease) until the next claim, which raises the token. Refused while the previous attempt's holder still holds its lease (a timed-out handler
-- still running, see expire.lua): both would run at once.
-- A dependent (field dp) is decided against its dependencies before anything is written: one
-- not ended is waited for again (CREATED in its queue's schedule at WAITING_RUN_AT, `wf` the
-- ones awaited, as submit.lua's wait_for leaves it: their endings settle it); one that ended
-- otherwise than COMPLETED, or was purged, refuses the retry unless the dependent runs on
-- failure (of = 'run'); all ended: due now as any task.
-- ARGV[3] id, ARGV[4] the status read before, ARGV[5] new deadline ('' = none), ARGV[6]
-- sharded: the statuses of its dependencies stored on other shards, a JSON object id ->
-- status ('' = live there, dep_link.lua registered the edge; '-' = stored nowhere), or ''
-- for none; ARGV[7] WAITING_RUN_AT (micros); ARGV[8] from_step: the durable step whose
-- checkpoint, and those of every step that finished after it (`P steps:<id>`, step.lua), the
-- retry deletes ('' = none).
-- Returns {'retried', fields}, {'held', worker, lease expiry} when refused for a live lease,
-- {'depfailed', dependency id, its status ('' = purged)} when refused for a dependency,
-- {'nostep', the task's steps hash (HGETALL)} when from_step has no checkpoint, or nil when
-- the status changed meanwhile.
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
local steps_key, from_step, first_discarded = P .. 'steps:' .. id, ARGV[8] or '', nil
if from_step ~= '' then
  local entry = redis.call('HGET', steps_key, from_step)
  if not entry then
    return {'nostep', redis.call('HGETALL', steps_key)}
  end
  first_discarded = tonumber(string.match(entry, '^(%d+) '))
end
local awaited, remote = {}, {}
local dp = redis.call('HGET', key, 'dp')
if dp then
  if (ARGV[6] or '') ~= '' then
    remote = cjson.decode(ARGV[6])
  end
  local run = redis.call('HGET', key, 'of') == 'run'
  for _, d in ipairs(cjson.decode(dp)) do
    local status = remote[d]
    if status == nil then
      status = redis.call('HGET', tkey(d), 's') or '-'
    end
    -- Not ended: live, or (here) terminal while its timed-out handler runs on (§6.1); a
    -- remote one's shard reported that as RUNNING (dep_link.lua).
    if status == '' or (status ~= '-' and (live(status) or (remote[d] == nil and not_ended(d, status)))) then
      awaited[#awaited + 1] = d
    elseif status ~= 'COMPLETED' and not run then
      return {'depfailed', d, status == '-' and '' or status}
    end
  end
end
-- Every refusal decided: from here on the retry happens. Checkpoints from from_step on go.
if first_discarded then
  local stored = redis.call('HGETALL', steps_key)
  for i = 1, #stored, 2 do
    if tonumber(string.match(stored[i + 1], '^(%d+) ')) >= first_discarded then
      redis.call('HDEL', steps_key, stored[i])
    end
  end
end
-- A lease that lapsed and was not recovered yet: a task that timed out while running ends
-- first (its batch and dependents settled), as its recovery would have ended it.
if not handler_ended(id, key) then
  unlease(id, key)
end
redis.call('HDEL', key, 'x', 'f', 'o', 'pg', 'wf') -- a fresh run reports its progress afresh
if #awaited > 0 then
  -- Waits again; its max duration counts from its release (release_dependent), as after its
  -- submit. Still in each local dependency's deps set (kept until purged), added again all
  -- the same; a remote one's shard has it registered (dep_link.lua, by the caller).
  redis.call('HSET', key, 's', 'CREATED', 'r', ARGV[7], 'b', 0, 'wf', cjson.encode(awaited))
  redis.call('HDEL', key, 'd')
  redis.call('ZREM', DEADLINES, id)
  for _, d in ipairs(awaited) do
    if remote[d] == nil then
      redis.call('SADD', P .. 'deps:' .. d, id)
    end
  end
  redis.call('ZREM', FINISHED, id)
  redis.call('ZREM', P .. 'done:' .. expected, id)
  recount(task[2], expected, 'CREATED')
  reopen_batch_member(id, key, expected)
  redis.call('ZADD', P .. 'sched:' .. task[2], ARGV[7], id)
  return {'retried', redis.call('HGETALL', key)}
end
redis.call('HSET', key, 's', 'PENDING', 'r', NOW, 'b', 0)
redis.call('HDEL', key, 'wt') -- not waiting: retried (suspend.lua)
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
