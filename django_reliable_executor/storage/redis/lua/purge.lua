-- purge: delete these terminal tasks if they finished before the cutoff (the caller picked
-- them from the finished index; each is checked again here).
-- A queue whose last task this deletes is forgotten (see forget_if_empty in _common.lua); a
-- batch member leaves its batch's member index (the batch itself goes in batch_purge.lua);
-- the task's durable steps (`P steps:<id>`) and the events sent to it (`P events:<id>`) go
-- with it, and it leaves its tags' sets (`P tag:<tag>`) and its parameter index sets (`P
-- pidx:...`, listed in its `px`).
-- ARGV[3] cutoff, ARGV[4..] task ids. Returns how many were deleted.
local cutoff = tonumber(ARGV[3])
local deleted = 0
local emptied = {}
for i = 4, #ARGV do
  local id = ARGV[i]
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'q', 'f', 'bt', 'tg', 'px')
  if not task[1] or live(task[1]) then
    redis.call('ZREM', FINISHED, id) -- a stray entry: no such task, or not finished
  elseif not live(task[1]) and task[3] and tonumber(task[3]) < cutoff then
    redis.call('DEL', key, P .. 'deps:' .. id, P .. 'steps:' .. id, P .. 'events:' .. id)
    redis.call('ZREM', FINISHED, id)
    redis.call('ZREM', P .. 'done:' .. task[1], id)
    if task[5] then -- its tags' sets (a set emptied goes: ZREM deletes it)
      for _, tag in ipairs(cjson.decode(task[5])) do
        redis.call('ZREM', P .. 'tag:' .. tag, id)
      end
    end
    unindex_parameter(id, task[6])
    if task[4] and SHARD ~= BATCH_HOME then -- its batch's member index is on that shard
      send(BATCH_HOME, {k = 'purged', b = task[4], id = id, g = task[1]})
    elseif task[4] then
      redis.call('ZREM', members_key(task[4], task[1]), id)
    end
    recount(task[2], task[1], nil)
    emptied[task[2]] = true
    deleted = deleted + 1
  end
end
for queue in pairs(emptied) do
  forget_if_empty(queue)
end
return deleted
