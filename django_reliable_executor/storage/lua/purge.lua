-- purge: delete up to `limit` terminal tasks finished before the cutoff.
-- ARGV[3] cutoff, ARGV[4] limit. Returns how many were deleted.
local old = redis.call('ZRANGEBYSCORE', FINISHED, '-inf', '(' .. ARGV[3], 'LIMIT', 0, ARGV[4])
local deleted = 0
for _, id in ipairs(old) do
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'q')
  redis.call('ZREM', FINISHED, id)
  if task[1] and not live(task[1]) then
    redis.call('DEL', key)
    recount(task[2], task[1], nil)
    deleted = deleted + 1
  end
end
return deleted
