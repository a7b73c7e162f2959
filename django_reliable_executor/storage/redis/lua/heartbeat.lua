-- heartbeat: extend the leases `worker` still holds under these tokens (fenced: a process
-- sharing the worker id with other claims renews none of this one's).
-- ARGV[3] worker, ARGV[4] lease expiry, ARGV[5..] pairs of task id, token of its claim.
-- Returns {id, token, cancel flag} for each task still held. A task that timed out while
-- running stays leased to its holder while the handler runs (expire.lua): it is reported
-- with the cancel flag set, so that the handler is told to stop.
local worker, lease_until = ARGV[3], ARGV[4]
local out = {}
for i = 5, #ARGV, 2 do
  local id, token = ARGV[i], ARGV[i + 1]
  local task = redis.call('HMGET', tkey(id), 'w', 's', 'k', 'x')
  if task[1] == worker and task[3] == token and (live(task[2]) or task[2] == 'TIMEOUT')
      and redis.call('ZSCORE', LEASES, id) then
    redis.call('ZADD', LEASES, 'XX', lease_until, id)
    local cancel = task[4] or '0'
    if task[2] == 'TIMEOUT' then
      cancel = '1'
    end
    out[#out + 1] = {id, task[3], cancel}
  end
end
return out
