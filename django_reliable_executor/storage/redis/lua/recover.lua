-- recover: claims whose lease expired. Unstarted ones go back to the head of the line (no
-- attempt); a started one records a failed attempt ("worker lost") decided by the caller; a
-- task that timed out while running (its holder kept the lease) ends now (handler_ended:
-- its worker is gone, so its handler counts as returned).
-- ARGV[3..] 7 values per task: id, token, status read, cancel flag read, outcome for a
-- started task, its next run time, error. Each is a compare-and-set on what was read.
-- Returns the ids of the started tasks that changed.
local out = {}
for i = 3, #ARGV, 7 do
  local id, token, expected, cancel = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'k', 'q', 'p', 'x')
  local lease = redis.call('ZSCORE', LEASES, id)
  if lease and tonumber(lease) < NOWN and task[1] == expected and task[2] == token
      and (task[5] or '0') == cancel then
    if waiting(expected) then
      hand_back(id, key, task[3], task[4])
    elseif expected == 'RUNNING' then
      record_failure(id, key, task[3], task[4], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6])
      out[#out + 1] = id
    elseif expected == 'TIMEOUT' and not handler_ended(id, key) then
      unlease(id, key)
    end
  end
end
return out
