-- batch_seal: every member of the batch is stored: seal it, and finish it at once if all its
-- members ended already (else the ending that counts the last one will); see _batches.lua.
-- ARGV[3] batch id. Returns the batch hash's fields (HGETALL), empty for an unknown batch.
local bkey = batch_key(ARGV[3])
if redis.call('EXISTS', bkey) == 0 then
  return {}
end
if redis.call('HGET', bkey, 'sl') ~= '1' then
  redis.call('HSET', bkey, 'sl', '1')
  finish_batch_if_done(bkey, ARGV[3])
end
return redis.call('HGETALL', bkey)
