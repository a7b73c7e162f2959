-- handler_returned: the handlers of these claims returned after their tasks ended without
-- them (TIMEOUT while running, see end_running_on): each still leased under the claim's
-- token leaves the leases and ends now (handler_ended: its batch and dependents settled).
-- ARGV[3..] pairs of task id, token. Returns how many ended so; sharded, negated when an
-- ending sent a message to another shard (the caller then delivers its outbox).
local ended = 0
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  local key = tkey(id)
  if redis.call('HGET', key, 'k') == ARGV[i + 1] and redis.call('ZSCORE', LEASES, id)
      and handler_ended(id, key) then
    ended = ended + 1
  end
end
if SENT then
  return -ended - 1
end
return ended
