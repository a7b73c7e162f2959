-- suspend: a durable wait (context.sleep, wait_for_event, wait_for) or a stop hands a RUNNING
-- task back as PENDING without a lease, fenced like every write of a claim and only while no
-- cancel was requested. The attempt is handed back (`a`, `b` one less: the resumption's claim
-- counts it again) and a resumption counted (`rs`). A wait's record is stored among the
-- task's checkpoints (`P steps:<id>`, as step.lua) unless one of its name is.
-- ARGV[3] id, ARGV[4] worker, ARGV[5] token, ARGV[6] kind ('' for a stop: due now),
-- ARGV[7] the wait's name, ARGV[8] the wait, packed (codec.packed_wait), ARGV[9] its record (JSON),
-- ARGV[10] when it is due unless woken (µs: a sleep's end, a timeout, or WAITING_RUN_AT),
-- ARGV[11] the event waited for, ARGV[12] how many of the tasks waited for are on this shard,
-- then those (read here) and, sharded, the live ones of other shards (linked there already by
-- dep_link.lua: their ending sends this shard a message).
-- Returns {run at, awaited ids (JSON), resumptions}, or nil when refused (nothing written).
local id, worker, token, kind = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local key = tkey(id)
local task = redis.call('HMGET', key, 's', 'k', 'q', 'p', 'x', 'w')
if task[1] ~= 'RUNNING' or task[2] ~= token or task[6] ~= worker or task[5] == '1'
    or not redis.call('ZSCORE', LEASES, id) then
  return nil
end
local queue, priority = task[3], task[4]
local awaited, here = {}, {}
local last_local = 12 + tonumber(ARGV[12])
for i = 13, last_local do
  local status = redis.call('HGET', tkey(ARGV[i]), 's')
  if status and not_ended(ARGV[i], status) then -- a task gone was purged: it had ended
    awaited[#awaited + 1] = ARGV[i]
    here[#here + 1] = ARGV[i]
  end
end
for i = last_local + 1, #ARGV do
  awaited[#awaited + 1] = ARGV[i]
end
unlease(id, key)
redis.call('HSET', key, 's', 'PENDING')
redis.call('HINCRBY', key, 'a', -1)
redis.call('HINCRBY', key, 'b', -1)
local resumptions = redis.call('HINCRBY', key, 'rs', 1)
redis.call('HDEL', key, 'wf')
recount(queue, 'RUNNING', 'PENDING')
local run_at = NOW
if kind == '' then
  redis.call('HDEL', key, 'wt')
else
  redis.call('HSET', key, 'wt', ARGV[8])
  if redis.call('HSETNX', WAITS, id, kind) == 1 then -- counted for the gauge (_common.lua)
    redis.call('HINCRBY', WAITS .. ':count', kind, 1)
  end
  local steps = P .. 'steps:' .. id
  if redis.call('HEXISTS', steps, ARGV[7]) == 0 then
    local seq = redis.call('HINCRBY', key, 'sn', 1)
    redis.call('HSET', steps, ARGV[7], seq .. ' ' .. NOW .. ' ' .. ARGV[9])
  end
  if kind == 'sleep' then
    run_at = ARGV[10]
  elseif kind == 'event' then
    if redis.call('HEXISTS', P .. 'events:' .. id, ARGV[11]) == 0 then
      run_at = ARGV[10]
    end
  elseif #awaited > 0 then -- tasks: linked as a dependent is, their ending wakes it
    redis.call('HSET', key, 'wf', cjson.encode(awaited))
    for _, awaited_id in ipairs(here) do
      redis.call('SADD', P .. 'deps:' .. awaited_id, id)
    end
    run_at = ARGV[10]
  end
end
redis.call('HSET', key, 'r', run_at)
to_waiting(id, queue, priority, run_at)
return {run_at, cjson.encode(awaited), resumptions}
