-- promote: due scheduled tasks of every queue become ready (claims also do this for their
-- own queues). ARGV[3] limit. Returns how many were promoted.
-- Also the safety net of max_concurrency: a name with parked tasks and nothing held (so below
-- any cap) wakes the workers of its next parked task's queue, whose claims take it.
local limit = tonumber(ARGV[3])
local promoted = 0
for _, name in ipairs(redis.call('SMEMBERS', PARKED)) do
  if not redis.call('HGET', HELD, name) then
    wake_parked(name)
  end
end
for _, queue in ipairs(redis.call('SMEMBERS', P .. 'queues')) do
  if promoted >= limit then
    break
  end
  local n = promote(queue, limit - promoted)
  if n > 0 then
    wake(queue)
  end
  promoted = promoted + n
end
return promoted
