-- heartbeat: extend the leases `worker` still holds.
-- ARGV[3] worker, ARGV[4] lease expiry, ARGV[5..] task ids.
-- Returns {id, token, cancel flag} for each task still held.
local worker, lease_until = ARGV[3], ARGV[4]
local out = {}
for i = 5, #ARGV do
  local id = ARGV[i]
  local task = redis.call('HMGET', tkey(id), 'w', 's', 'k', 'x')
  if task[1] == worker and live(task[2]) and redis.call('ZSCORE', LEASES, id) then
    redis.call('ZADD', LEASES, 'XX', lease_until, id)
    out[#out + 1] = {id, task[3], task[4] or '0'}
  end
end
return out
