-- step: store a durable step's checkpoint (context.step) and renew the claim's lease, fenced
-- like every write of a claim: only where the task is RUNNING, held by `worker` under the
-- claim's token and still leased. A checkpoint of the same name is replaced (finishing now,
-- so last in the order). The task's `sn` counts the checkpoints ever written: their order.
-- ARGV[3] task id, ARGV[4] worker, ARGV[5] token of its claim, ARGV[6] lease expiry,
-- ARGV[7] step name, ARGV[8] its result (JSON).
-- Returns 1 when stored, 0 when refused (nothing written).
local id, worker, token = ARGV[3], ARGV[4], ARGV[5]
local key = tkey(id)
local task = redis.call('HMGET', key, 'w', 's', 'k')
if task[1] ~= worker or task[2] ~= 'RUNNING' or task[3] ~= token
    or not redis.call('ZSCORE', LEASES, id) then
  return 0
end
local seq = redis.call('HINCRBY', key, 'sn', 1)
redis.call('HSET', P .. 'steps:' .. id, ARGV[7], seq .. ' ' .. NOW .. ' ' .. ARGV[8])
redis.call('ZADD', LEASES, 'XX', ARGV[6], id)
return 1
