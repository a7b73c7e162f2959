-- batch_purge: delete these batches if they finished before the cutoff (the caller picked them
-- from P batches:finished; each is checked again here): the batch hash, its member index
-- (UNLINK: one still large is freed off the main thread) and its index entries; see
-- _batches.lua. Members still stored keep their batch id; their endings count nowhere.
-- ARGV[3] cutoff, ARGV[4..] batch ids. Returns how many were deleted.
local cutoff = tonumber(ARGV[3])
local deleted = 0
for i = 4, #ARGV do
  local batch_id = ARGV[i]
  local bkey = batch_key(batch_id)
  local finished = redis.call('HGET', bkey, 'f')
  if finished and tonumber(finished) < cutoff then
    local keys = {bkey}
    for _, group in ipairs(MEMBER_GROUPS) do
      keys[#keys + 1] = members_key(batch_id, group)
    end
    if SHARDED then
      keys[#keys + 1] = P .. 'bx:' .. batch_id -- outbox_apply.lua's applied messages
    end
    redis.call('UNLINK', unpack(keys))
    redis.call('ZREM', P .. 'batches:finished', batch_id)
    redis.call('ZREM', P .. 'batches', batch_id)
    deleted = deleted + 1
  elseif not finished and redis.call('EXISTS', bkey) == 0 then
    redis.call('ZREM', P .. 'batches:finished', batch_id) -- a stray entry: no such batch
  end
end
return deleted
