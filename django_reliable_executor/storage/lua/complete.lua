-- complete: RUNNING -> COMPLETED with the result, if the token still holds.
-- ARGV[3..] triples of task id, token, result JSON. Returns 1 (completed) or 0 per triple.
local out = {}
for i = 3, #ARGV, 3 do
  local id, token = ARGV[i], ARGV[i + 1]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'k', 'q')
  if task[1] == 'RUNNING' and task[2] == token then
    redis.call('HSET', key, 'o', ARGV[i + 2])
    finish(id, key, task[3], 'RUNNING', 'COMPLETED')
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
