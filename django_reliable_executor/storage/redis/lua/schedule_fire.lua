-- schedule_fire: fire schedules, each as one step: only if the schedule still expects this fire
-- (it exists, is not paused, and its next run is the one the fire was planned from), store the
-- fire's tasks (a task id that exists is left alone) and move the schedule on. A schedule
-- paused, redefined, deleted or fired by another master after the planning stores nothing.
-- KEYS[1]: any key of the prefix (the caller passes P counts), so the call is routed to the
-- prefix's Cluster slot; the other keys are P-prefixed names in the same slot, as in every
-- script (see _common.lua).
-- ARGV[3..]: per schedule, 7 values: id, the next run the fire planned from, the new next run,
-- the planned time of the latest run fired ('' = none), its task id ('' = none), its overlap
-- policy ('skip', or '' to fire whatever runs), the number n of its tasks; then its n tasks,
-- TASK_ARGS values each as submit.lua takes them (without the unique key's two).
-- Returns per schedule 0 (it no longer expects this fire: nothing stored), a list with 1 and
-- then, per task, 1 (created) or 0 (its id existed), or {2, task id, n} when overlap is 'skip'
-- and the schedule's previous run (its `lt`) is not terminal: then no task is stored, the
-- schedule still moves on, and its `os` (runs skipped for overlap) grows by n, `ol` = now.
local out = {}
local promoted = {}
local woken = {}
local batch = new_batch()
local moved = {} -- ZADD arguments: the schedules' new next runs, added together at the end
local i = 3
while i <= #ARGV do
  local id, expected, next_run, last_run, last_task = ARGV[i], ARGV[i + 1], ARGV[i + 2],
    ARGV[i + 3], ARGV[i + 4]
  local overlap = ARGV[i + 5]
  local count = tonumber(ARGV[i + 6])
  local first = i + 7
  i = first + TASK_ARGS * count
  local key = P .. 's:' .. id
  local state = redis.call('HMGET', key, 'nr', 'pa', 'lt')
  local running = nil
  if overlap == 'skip' and count > 0 and state[3] then
    local status = redis.call('HGET', tkey(state[3]), 's')
    if status and not_ended(state[3], status) then
      running = state[3]
    end
  end
  if state[1] == expected and not state[2] and running then
    redis.call('HSET', key, 'nr', next_run, 'ol', NOW)
    redis.call('HINCRBY', key, 'os', count)
    moved[#moved + 1] = next_run
    moved[#moved + 1] = id
    out[#out + 1] = {2, running, count}
  elseif state[1] == expected and not state[2] then
    local fired = {1}
    for t = first, i - 1, TASK_ARGS do
      if redis.call('EXISTS', tkey(ARGV[t])) == 1 then
        fired[#fired + 1] = 0
      else
        store_task(t, promoted, woken, batch)
        fired[#fired + 1] = 1
      end
    end
    if last_run ~= '' then
      redis.call('HSET', key, 'nr', next_run, 'lr', last_run, 'lt', last_task)
    else
      redis.call('HSET', key, 'nr', next_run)
    end
    moved[#moved + 1] = next_run
    moved[#moved + 1] = id
    out[#out + 1] = fired
  else
    out[#out + 1] = 0
  end
end
flush_stored(batch)
for first = 1, #moved, 4000 do
  redis.call('ZADD', P .. 'schedules:due', unpack(moved, first, math.min(first + 3999, #moved)))
end
for queue in pairs(woken) do
  wake(queue)
end
return out
