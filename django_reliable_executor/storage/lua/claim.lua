-- claim: take up to `limit` ready tasks of these queues under a lease for `worker`, highest
-- priority first, first in first out within a priority. A claimed task keeps its status
-- (CREATED or PENDING) until start; its token goes up by one, fencing every later write.
-- ARGV[3] worker, ARGV[4] lease expiry, ARGV[5] limit, ARGV[6] a random token increment,
-- ARGV[7..] queues. The random step (not +1) keeps a claim that a Redis failover lost from
-- sharing its token with the next claim of the same task.
-- Returns {next scheduled time of these queues or '', then id, values of each claimed task}
-- (the values of CLAIMED_FIELDS, in order: codec.CLAIMED_FIELDS reads them).
local CLAIMED_FIELDS = {'n', 'q', 'p', 's', 'j', 'a', 'b', 'rl', 'ri', 'rb', 'md', 'c', 'r',
  'd', 'e', 'w', 'k'}
local worker, lease_until, limit, step = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local queues = {}
for i = 7, #ARGV do
  queues[#queues + 1] = ARGV[i]
  promote(ARGV[i], 1000)
end

-- The ready list to take from next, and whether more than one queue ties for it (then take
-- one task at a time, comparing the heads' due times, so the order stays exact).
local function best()
  local list, queue, priority, member, tie, run_at
  for _, q in ipairs(queues) do
    local top = redis.call('ZREVRANGE', P .. 'prio:' .. q, 0, 0, 'WITHSCORES')
    if top[1] then
      local prio = tonumber(top[2])
      local candidate = P .. 'ready:' .. q .. ':' .. top[1]
      if priority == nil or prio > priority then
        list, queue, priority, member, tie, run_at = candidate, q, prio, top[1], false, nil
      elseif prio == priority then
        run_at = run_at or tonumber(redis.call('HGET', tkey(redis.call('LINDEX', list, 0)), 'r'))
        local other = tonumber(redis.call('HGET', tkey(redis.call('LINDEX', candidate, 0)), 'r'))
        tie = true
        if other < run_at then
          list, queue, member, run_at = candidate, q, top[1], other
        end
      end
    end
  end
  return list, queue, member, tie
end

local out = {''}
local taken = 0
while taken < limit do
  local list, queue, member, tie = best()
  if not list then
    break
  end
  local ids = redis.call('LPOP', list, tie and 1 or (limit - taken)) or {}
  if redis.call('LLEN', list) == 0 then
    redis.call('ZREM', P .. 'prio:' .. queue, member)
  end
  for _, id in ipairs(ids) do
    local key = tkey(id)
    -- The double check: still waiting and nobody's claim (a stray entry is dropped).
    if waiting(redis.call('HGET', key, 's')) and not redis.call('ZSCORE', LEASES, id) then
      redis.call('HINCRBY', key, 'k', step)
      redis.call('HSET', key, 'w', worker)
      redis.call('ZADD', LEASES, lease_until, id)
      out[#out + 1] = id
      out[#out + 1] = redis.call('HMGET', key, unpack(CLAIMED_FIELDS))
      taken = taken + 1
    end
  end
end

local next_due
for _, q in ipairs(queues) do
  -- Work left behind a full batch: wake another idle worker to take it.
  if taken >= limit and redis.call('ZCARD', P .. 'prio:' .. q) > 0 then
    wake(q)
  end
  local first = redis.call('ZRANGE', P .. 'sched:' .. q, 0, 0, 'WITHSCORES')
  if first[2] and (next_due == nil or tonumber(first[2]) < tonumber(next_due)) then
    next_due = first[2]
  end
end
out[1] = next_due or ''
return out
