-- release: hand unstarted claims back to the head of their ready lists; no attempt counted.
-- ARGV[3..] pairs of task id, token, in claim order. Returns how many were handed back.
local released = 0
for i = #ARGV - 1, 3, -2 do -- last first, so the first claim ends up first in line
  local id, token = ARGV[i], ARGV[i + 1]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'k', 'q', 'p')
  if waiting(task[1]) and task[2] == token and redis.call('ZSCORE', LEASES, id) then
    hand_back(id, key, task[3], task[4])
    released = released + 1
  end
end
return released
