
-- Batches (batches.py holds the rule), prepended after _common.lua. A batch lives on shard
-- BATCH_HOME (0; the only one unless sharded); sharded, a member of another shard is counted
-- there by batch_join.lua and messages (see `send`): its ending and retry by hand send one,
-- and a callback of another shard's queue is sent to it to be stored. A batch is a hash
-- P b:<id>: n members stored (total), ok completed, ko failed (FAILED/TIMEOUT/ERROR), cx
-- cancelled, sl "1" once sealed, c created, f finished, cb the callbacks as JSON (for reading),
-- oc/os the on_complete/on_success task as a JSON array of store_task's TASK_ARGS values, g
-- its generation. A member's hash holds bt = its batch id and bg = that batch's generation:
-- an id may be used again once its batch was purged, and a member still stored counts only
-- in the batch whose generation it carries (a batch or member stored before generations
-- existed has none: they match). A callback's holds bc (counted in no batch).
-- P bm:<id>:<group>: ZSET of the batch's members scored by creation, so a page of them costs
-- a range read: group LIVE while a member has not ended, else its terminal status (moved by
-- the writes that count it: store_task, settle_batch, reopen_batch_member; a purged member
-- leaves it in purge.lua). P batches:finished: ZSET of finished batch ids by finish time
-- (what batch_purge.lua deletes past retention, with the batch's member indexes).
local BATCH_COUNTERS = {COMPLETED = 'ok', CANCELLED = 'cx', FAILED = 'ko', TIMEOUT = 'ko',
  ERROR = 'ko'}

local function batch_key(batch_id)
  return P .. 'b:' .. batch_id
end

-- The groups of a batch's member index (see above). A status holds no ':', so the group
-- after the last ':' names the key unambiguously whatever the batch id.
local MEMBER_GROUPS = {'LIVE', 'COMPLETED', 'FAILED', 'TIMEOUT', 'ERROR', 'CANCELLED'}

local function members_key(batch_id, group)
  return P .. 'bm:' .. batch_id .. ':' .. group
end

-- Is a member carrying generation `generation` (nil or false: none) one of the stored batch
-- `bkey`'s?
local function of_batch(bkey, generation)
  return (redis.call('HGET', bkey, 'g') or '') == (generation or '')
end

-- Store a batch's callback from its store_task values (made by fire_callback), unless its id
-- is taken (never store twice): here, or on the callback's shard by a message.
local function store_callback(values, batch_id)
  if redis.call('EXISTS', tkey(values[1])) == 1 then
    return
  end
  local woken = {}
  store_task(1, {}, woken, nil, values)
  redis.call('HSET', tkey(values[1]), 'bc', batch_id)
  for queue in pairs(woken) do
    wake(queue)
  end
end

-- Store a batch's callback (`field` oc/os) now: its delay and deadline count from now. Sharded,
-- the batch's `<field>h` names the shard of its queue when it is not this one.
local function fire_callback(bkey, field, batch_id)
  local packed = redis.call('HGET', bkey, field)
  if not packed then
    return
  end
  local values = cjson.decode(packed)
  local created = tonumber(values[10])
  values[11] = string.format('%.0f', NOWN + tonumber(values[11]) - created)
  if values[12] ~= '' then
    values[12] = string.format('%.0f', NOWN + tonumber(values[12]) - created)
  end
  values[10] = NOW
  values[15] = '' -- not a member (values[14]: the trace context of submit_batch's caller)
  values[16] = ''
  local shard = SHARDED and redis.call('HGET', bkey, field .. 'h')
  if shard then
    send(tonumber(shard), {k = 'fire', b = batch_id, v = values})
  else
    store_callback(values, batch_id)
  end
end

-- A sealed batch whose members have all ended, not finished before: finished now, and its
-- callbacks stored (on_success only when every member completed). Exactly once: this runs
-- inside the script that made the count, and 'f' stays set for good.
local function finish_batch_if_done(bkey, batch_id)
  local b = redis.call('HMGET', bkey, 'n', 'ok', 'ko', 'cx', 'sl', 'f')
  if b[5] ~= '1' or b[6] then
    return
  end
  local total, ok = tonumber(b[1] or 0), tonumber(b[2] or 0)
  if ok + tonumber(b[3] or 0) + tonumber(b[4] or 0) < total then
    return
  end
  redis.call('HSET', bkey, 'f', NOW)
  redis.call('ZADD', P .. 'batches:finished', NOW, batch_id)
  fire_callback(bkey, 'oc', batch_id)
  if ok == total then
    fire_callback(bkey, 'os', batch_id)
  end
end

-- Called by end_task for every task `id` reaching a terminal `status` (a dependent cancelled
-- by the cascade too): a member counts in its batch and moves to its status in the index.
settle_batch = function(id, key, status)
  local batch_id = redis.call('HGET', key, 'bt')
  if not batch_id then
    return
  end
  if SHARD ~= BATCH_HOME then
    send(BATCH_HOME, {k = 'member', b = batch_id, id = id, c = redis.call('HGET', key, 'c'),
      g = status, bg = redis.call('HGET', key, 'bg')})
    return
  end
  local bkey = batch_key(batch_id)
  if redis.call('EXISTS', bkey) == 0 or not of_batch(bkey, redis.call('HGET', key, 'bg')) then
    return -- the batch was purged before its member (and its id maybe used again since)
  end
  redis.call('HINCRBY', bkey, BATCH_COUNTERS[status], 1)
  redis.call('ZREM', members_key(batch_id, 'LIVE'), id)
  redis.call('ZADD', members_key(batch_id, status), redis.call('HGET', key, 'c'), id)
  finish_batch_if_done(bkey, batch_id)
end

-- A member retried by hand (retry.lua) leaves the counter of the `status` it had: pending
-- again, counted anew when it ends. A finished batch stays finished: no callback twice.
local function reopen_batch_member(id, key, status)
  local batch_id = redis.call('HGET', key, 'bt')
  if not batch_id then
    return
  end
  if SHARD ~= BATCH_HOME then
    send(BATCH_HOME, {k = 'member', b = batch_id, id = id, c = redis.call('HGET', key, 'c'),
      g = 'LIVE', bg = redis.call('HGET', key, 'bg')})
    return
  end
  local bkey = batch_key(batch_id)
  if redis.call('EXISTS', bkey) == 0 or not of_batch(bkey, redis.call('HGET', key, 'bg')) then
    return -- the batch was purged before its member (and its id maybe used again since)
  end
  redis.call('ZREM', members_key(batch_id, status), id)
  redis.call('ZADD', members_key(batch_id, 'LIVE'), redis.call('HGET', key, 'c'), id)
  local counter = BATCH_COUNTERS[status]
  if tonumber(redis.call('HGET', bkey, counter) or 0) > 0 then
    redis.call('HINCRBY', bkey, counter, -1)
  end
end

-- On the batch's shard: member `id` (of another shard, created `created`, carrying batch
-- generation `generation`) is now in `group` (LIVE, or the terminal status it ended with), as
-- batch_join.lua or a message says. A member not counted yet (its ending came before its
-- join) joins the total; `join` only adds a member not counted yet (one just stored by this
-- batch's submit). The counters follow the move; the batch finishes when that was the last.
local function move_member(batch_id, id, created, group, join, generation)
  local bkey = batch_key(batch_id)
  if redis.call('EXISTS', bkey) == 0 or not (join or of_batch(bkey, generation)) then
    return -- the batch was purged before its member (and its id maybe used again since)
  end
  local was = nil
  for _, g in ipairs(MEMBER_GROUPS) do
    if redis.call('ZSCORE', members_key(batch_id, g), id) then
      was = g
      break
    end
  end
  if join and was then
    return
  end
  if not was then
    redis.call('HINCRBY', bkey, 'n', 1)
  elseif was == group then
    return
  else
    redis.call('ZREM', members_key(batch_id, was), id)
    local counter = BATCH_COUNTERS[was]
    if counter and tonumber(redis.call('HGET', bkey, counter) or 0) > 0 then
      redis.call('HINCRBY', bkey, counter, -1)
    end
  end
  redis.call('ZADD', members_key(batch_id, group), created, id)
  if BATCH_COUNTERS[group] then
    redis.call('HINCRBY', bkey, BATCH_COUNTERS[group], 1)
    finish_batch_if_done(bkey, batch_id)
  end
end
