-- submit: store new tasks; an existing task id is left as it is. A unique task whose key is
-- held, within its window, by a task that is not terminal is not stored either. A debounced
-- task whose key is held, within its window, by a task waiting unclaimed and never started
-- joins that task instead (join_debounced in _common.lua); else it is stored and takes the key.
-- ARGV[3..]: TASK_ARGS + 6 values per task: the TASK_ARGS (21) of store_task (id, name, queue,
-- priority, parameter JSON, retry limit, retry interval, backoff, max duration ('' = none),
-- created, run at, deadline ('' = none), rate key ('' = none), trace context JSON ('' =
-- none), batch id ('' = none: counted in the batch's total when stored), batch generation
-- ('' = none; see _batches.lua), attempt timeout in seconds ('' = none), concurrency key
-- ('' = none), fair key: ':' and the key it takes turns under (core/fairness.fair_key) for a
-- name with fairness="round_robin", numbered a round by store_task ('' = none), tags as a
-- JSON list ('' = none), its parameter index entries as a JSON list of `P pidx:` set names
-- ('' = none; storage/redis/parameter_index.py)), then the unique key digest ('' = not
-- unique) and the end of the key's window
-- (a debounced task's: its run at + KEY_HOLD). Then its dependencies: a JSON list of task
-- ids ('' = none; the task then comes with run at WAITING_RUN_AT and no deadline) and the
-- on-failure policy ('run', or '' = cancel). Sharded, a dependency of another shard comes as
-- [id, its status when dep_link.lua registered the edge there] ('' = live then: its ending
-- sends a message, maybe arrived already in P xdone:<task id>, see outbox_apply.lua). Then
-- its debounce in µs ('' = not debounced: a unique key is unique_for's) and its
-- debounce_max_wait in µs ('' = none).
-- Returns per task 1 (created), {fields, 1} (created with dependencies: as it now stands),
-- the stored task's fields (its id existed), {holder id, holder's fields} (its unique key
-- was held), {holder id, holder's fields, 1} (a debounced task joined the holder: as it now
-- stands), 'elsewhere' (sharded: this shard's directory holds the id for a task of another
-- shard, see id_reserve.lua; an entry naming this shard is its own reservation), or
-- 'ureserved' (sharded: this shard, the unique key's home, holds the key for a task of
-- another shard, see unique_reserve.lua; stored nothing; a debounced task's caller then joins
-- that task or takes the key, see reservations.take_unique).
-- Returns {'missing', task id, dependency id}, storing nothing, when a dependency of a task
-- to store neither exists here nor is stored by this call before it (a task of the call
-- that is not stored, its key held or its id another shard's, does not count).
--
-- P u:<digest>: STRING "<window end> <task id>" of the task holding a unique key, expiring
-- with the window (PX), so no key outlives it. Sharded, the key lives on its home shard
-- (sharding.py); a task of another shard is submitted here without it (unique_reserve.lua
-- took it there).
local out = {}
local promoted = {}
local woken = {}

local RESERVED = {}
-- The task a unique key names while its window lasts: its id (maybe purged since), RESERVED,
-- or nil.
local function key_task(ukey)
  local held = redis.call('GET', ukey)
  if not held then
    return nil
  end
  local space = string.find(held, ' ', 1, true)
  if tonumber(string.sub(held, 1, space - 1)) <= NOWN then
    return nil
  end
  local id = string.sub(held, space + 1)
  if SHARDED and string.find(id, ' ', 1, true) then
    -- Reserved (unique_reserve.lua) for a task of another shard, or of this one by a call of
    -- several shards: one of this shard stored here is read here; else the caller checks.
    local task_id, shard = string.match(id, '^(%S+) (%d+) ')
    if tonumber(shard) ~= SHARD or redis.call('EXISTS', tkey(task_id)) == 0 then
      return RESERVED
    end
    return task_id
  end
  return id
end

-- The task holding a unique key, if its window lasts and it has not ended (not_ended).
local function holder_of(ukey)
  local id = key_task(ukey)
  if id == nil or id == RESERVED then
    return id
  end
  local status = redis.call('HGET', tkey(id), 's')
  return status and not_ended(id, status) and id or nil
end

local STRIDE = TASK_ARGS + 6

-- Sharded, on an id's directory shard: whether its entry (id_reserve.lua) names another shard.
-- One naming this shard is this shard's own reservation (a call of several shards reserves
-- every id before its first write): the task is stored here, and the entry dropped.
local function reserved_elsewhere(id)
  local entry = redis.call('GET', P .. 'i:' .. id)
  return entry ~= false and string.match(entry, '^(%d+) ') ~= tostring(SHARD)
end

-- Every task's fate is decided before anything is written, and so is every refusal: a Lua
-- error or an early return does not undo what the script wrote before it. fate[i] is
-- 'existing' (its id is stored here, perhaps by a task before it in this call), 'elsewhere',
-- 'ureserved', 'join' (a debounced task joins joins[i]), a holder's id (its unique key is
-- held: the holder is returned), or 'store'.
local fate = {}
local storing = {} -- ids this call stores (only these count as coming for a dependent)
local taken = {} -- unique keys taken by tasks this call stores -> that task's id
local cancelled = {} -- ids this call stores that wait_for cancels as they are stored
local joins = {} -- i -> the task a debounced task joins (fate[i] 'join')

-- The task a debounced submit of key `ukey` joins: one this call stores, or the key's task
-- while it may be joined (joinable); RESERVED; or nil: the submit stores a task, which takes
-- the key (the holder, running or ended, does not answer it, as a unique task's would).
local function join_target(ukey)
  if taken[ukey] then
    return taken[ukey]
  end
  local id = key_task(ukey)
  if id == nil or id == RESERVED then
    return id
  end
  return joinable(id) and id or nil
end

-- Whether wait_for will cancel a task this call stores, as it stores it: a dependency ended
-- other than COMPLETED (or is a task of this call so cancelled), and the task does not say
-- "run". Such a task has ended (DESIGN 6.1): like a task submitted alone before, it holds
-- no unique key for a later request of the call.
local function cancelled_at_once(id, deps_json, on_failure)
  if deps_json == '' or on_failure == 'run' then
    return false
  end
  local told = {}
  if SHARDED then
    local xdone = redis.call('HGETALL', P .. 'xdone:' .. id)
    for j = 1, #xdone, 2 do
      told[xdone[j]] = string.match(xdone[j + 1], ' (.*)$')
    end
  end
  for _, d in ipairs(cjson.decode(deps_json)) do
    if type(d) ~= 'string' then
      local status = told[d[1]] or (d[2] ~= '' and d[2]) or 'CREATED'
      if not live(status) and status ~= 'COMPLETED' then
        return true
      end
    elseif storing[d] then
      if cancelled[d] then
        return true
      end
    else
      local status = redis.call('HGET', tkey(d), 's')
      if not not_ended(d, status) and status ~= 'COMPLETED' then
        return true
      end
    end
  end
  return false
end

for i = 3, #ARGV, STRIDE do
  local id = ARGV[i]
  local ukey = ARGV[i + TASK_ARGS] ~= '' and (P .. 'u:' .. ARGV[i + TASK_ARGS]) or nil
  local debounced = ARGV[i + TASK_ARGS + 4] ~= ''
  local holder
  if ukey and debounced then
    holder = join_target(ukey)
  elseif ukey then
    holder = taken[ukey] or holder_of(ukey)
  end
  if storing[id] or redis.call('EXISTS', tkey(id)) == 1 then
    fate[i] = 'existing'
  elseif SHARDED and reserved_elsewhere(id) then
    fate[i] = 'elsewhere' -- this shard is the id's directory: it lives on another
  elseif holder == RESERVED then
    fate[i] = 'ureserved'
  elseif holder and debounced then
    fate[i] = 'join'
    joins[i] = holder
  elseif holder then
    fate[i] = holder
  else
    local deps = ARGV[i + TASK_ARGS + 2]
    if deps ~= '' then
      for _, d in ipairs(cjson.decode(deps)) do
        if type(d) == 'string' and not storing[d] and redis.call('EXISTS', tkey(d)) == 0 then
          return {'missing', id, d}
        end
      end
    end
    fate[i] = 'store'
    storing[id] = true
    if cancelled_at_once(id, deps, ARGV[i + TASK_ARGS + 3]) then
      cancelled[id] = true
    elseif ukey then
      taken[ukey] = id
    end
  end
end

-- The new task `id` (stored waiting) records its dependencies and is settled against those
-- already ended, as settle_dependents would have.
local function wait_for(id, key, queue, deps_json, on_failure)
  local deps = cjson.decode(deps_json)
  local remote = {}
  if SHARDED and string.find(deps_json, '[', 2, true) then
    local xdone = redis.call('HGETALL', P .. 'xdone:' .. id)
    local told = {}
    for j = 1, #xdone, 2 do
      told[xdone[j]] = string.match(xdone[j + 1], ' (.*)$')
    end
    for j, d in ipairs(deps) do
      if type(d) ~= 'string' then
        remote[d[1]] = told[d[1]] or (d[2] ~= '' and d[2]) or 'CREATED'
        deps[j] = d[1]
      end
    end
    redis.call('DEL', P .. 'xdone:' .. id)
    deps_json = cjson.encode(deps)
  end
  redis.call('HSET', key, 'dp', deps_json, 'wf', deps_json)
  if on_failure == 'run' then
    redis.call('HSET', key, 'of', 'run')
  end
  local remaining, failed = {}, nil
  for _, d in ipairs(deps) do
    local status = remote[d]
    if not status then
      redis.call('SADD', P .. 'deps:' .. d, id)
      status = redis.call('HGET', tkey(d), 's')
    end
    if not_ended(d, status) then -- (a remote one's status says so: dep_link.lua)
      remaining[#remaining + 1] = d
    elseif status ~= 'COMPLETED' and not failed then
      failed = {d, status}
    end
  end
  if failed and on_failure ~= 'run' then
    cancel_dependent(id, key, queue, failed[1], failed[2])
  elseif #remaining == 0 then
    release_dependent(id, key, queue, redis.call('HGET', key, 'p'), redis.call('HGET', key, 'md'))
  else
    redis.call('HSET', key, 'wf', cjson.encode(remaining))
  end
end

-- Debounced task `i` joins task `holder` (join_debounced); the key then holds as long past
-- the holder's new run at as the submit's own window would past its run at (KEY_HOLD).
local function join(i, holder)
  local run_at = join_debounced(holder, ARGV[i + 4], ARGV[i + 9], ARGV[i + TASK_ARGS + 4],
    ARGV[i + TASK_ARGS + 5], ARGV[i + 20])
  local hold = tonumber(ARGV[i + TASK_ARGS + 1]) - tonumber(ARGV[i + 10])
  extend_key(P .. 'u:' .. ARGV[i + TASK_ARGS], holder,
    string.format('%.0f', tonumber(run_at) + hold))
  return {holder, redis.call('HGETALL', tkey(holder)), 1}
end

for i = 3, #ARGV, STRIDE do
  local key = tkey(ARGV[i])
  local chosen = fate[i]
  if chosen == 'existing' then
    out[#out + 1] = redis.call('HGETALL', key)
  elseif chosen == 'elsewhere' or chosen == 'ureserved' then
    out[#out + 1] = chosen
  elseif chosen == 'join' then
    out[#out + 1] = join(i, joins[i])
  elseif chosen ~= 'store' then
    out[#out + 1] = {chosen, redis.call('HGETALL', tkey(chosen))}
  else
    if ARGV[i + TASK_ARGS] ~= '' then
      local until_ = ARGV[i + TASK_ARGS + 1]
      local ttl = math.max(1, math.ceil((tonumber(until_) - NOWN) / 1000))
      redis.call('SET', P .. 'u:' .. ARGV[i + TASK_ARGS], until_ .. ' ' .. ARGV[i], 'PX',
        string.format('%d', ttl))
    end
    store_task(i, promoted, woken)
    if SHARDED then
      redis.call('DEL', P .. 'i:' .. ARGV[i]) -- (only this shard's own: see reserved_elsewhere)
    end
    local deps = ARGV[i + TASK_ARGS + 2]
    if deps == '' then
      out[#out + 1] = 1
    else
      wait_for(ARGV[i], key, ARGV[i + 2], deps, ARGV[i + TASK_ARGS + 3])
      out[#out + 1] = {redis.call('HGETALL', key), 1}
    end
  end
end
for queue in pairs(woken) do
  wake(queue)
end
return out
