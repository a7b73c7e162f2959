-- submit: store new tasks; an existing task id is left as it is. A unique task whose key is
-- held, within its window, by a task that is not terminal is not stored either.
-- ARGV[3..]: TASK_ARGS + 2 values per task: the TASK_ARGS (14) of store_task (id, name, queue,
-- priority, parameter JSON, retry limit, retry interval, backoff, max duration ('' = none),
-- created, run at, deadline ('' = none), rate key ('' = none), batch id ('' = none: counted
-- in the batch's total when stored)), then the unique key digest
-- ('' = not unique) and the end of the key's window.
-- Returns per task 1 (created), the stored task's fields (its id existed), or {holder id,
-- holder's fields} (its unique key was held).
--
-- P u:<digest>: STRING "<window end> <task id>" of the task holding a unique key, expiring
-- with the window (PX), so no key outlives it.
local out = {}
local promoted = {}
local woken = {}

-- The task holding a unique key, if its window lasts and it is not terminal.
local function holder_of(ukey)
  local held = redis.call('GET', ukey)
  if not held then
    return nil
  end
  local space = string.find(held, ' ', 1, true)
  if tonumber(string.sub(held, 1, space - 1)) <= NOWN then
    return nil
  end
  local id = string.sub(held, space + 1)
  local status = redis.call('HGET', tkey(id), 's')
  if status and live(status) then
    return id
  end
  return nil
end

for i = 3, #ARGV, TASK_ARGS + 2 do
  local key = tkey(ARGV[i])
  local ukey = ARGV[i + TASK_ARGS] ~= '' and (P .. 'u:' .. ARGV[i + TASK_ARGS]) or nil
  local holder = ukey and holder_of(ukey)
  if redis.call('EXISTS', key) == 1 then
    out[#out + 1] = redis.call('HGETALL', key)
  elseif holder then
    out[#out + 1] = {holder, redis.call('HGETALL', tkey(holder))}
  else
    if ukey then
      local until_ = ARGV[i + TASK_ARGS + 1]
      local ttl = math.max(1, math.ceil((tonumber(until_) - NOWN) / 1000))
      redis.call('SET', ukey, until_ .. ' ' .. ARGV[i], 'PX', string.format('%d', ttl))
    end
    store_task(i, promoted, woken)
    out[#out + 1] = 1
  end
end
for queue in pairs(woken) do
  wake(queue)
end
return out
