-- promote: due scheduled tasks of every queue become ready (claims also do this for their
-- own queues). ARGV[3] limit. Returns how many were promoted.
local limit = tonumber(ARGV[3])
local promoted = 0
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
