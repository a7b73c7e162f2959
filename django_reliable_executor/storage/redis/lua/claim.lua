-- claim: take up to `limit` ready tasks of these queues under a lease for `worker`, highest
-- priority first, first in first out within a priority (a fair name's in round order). A
-- claimed task keeps its status (CREATED or PENDING) until start; its token goes up by one,
-- fencing every later write.
-- ARGV[3] worker, ARGV[4] lease expiry, ARGV[5] limit, ARGV[6] a random token increment,
-- ARGV[7] how many of the claimed tasks to start at once (the worker has that many idle threads
-- to run them right now), ARGV[8..] queues, then optionally '' and pairs of task name, cap
-- (max_concurrency), then optionally '' and triples of task name, count and log window in
-- microseconds (rate_limit), then optionally '' and pairs of task name, cap per concurrency
-- key (max_concurrency_per_key), then optionally '' and how many tasks of fair names to take
-- at most (fairness; absent: no bound) followed by those names (the names fair now: a task
-- keeps its round once its name loses fairness, but counts only while its name is fair); a
-- later part comes after every earlier one, maybe empty.
-- The random step (not +1) keeps a claim that a Redis failover lost from sharing its token
-- with the next claim of the same task.
-- Starting: the first tasks claimed (up to ARGV[7]) become RUNNING with one more attempt and
-- started at now, as start.lua does it, in this same call; a task past its deadline is left
-- unstarted (the worker times it out rather than running it).
-- max_concurrency: a task of a capped name whose held count (`held`) has reached its cap is
-- parked (see park in _common.lua) instead of taken, out of everyone's way; the parked tasks
-- of a name with free slots compete here with the ready lists, in the same order. At most
-- PARK_MAX tasks are parked per call, so one call stays short.
-- max_concurrency_per_key: a task with a concurrency key (`ck`) whose key holds its name's cap
-- per key (`heldkey:<name>`) is parked by key (key_park in _common.lua), where no claim looks;
-- a slot of the key freed sends the key's next one to the name's parked set (unlease), and so
-- does a task of the key taken while its key has room left (a cap raised). Tasks parked by key
-- of a name this call does not cap by key go back to the name's parked set (up to PARK_MAX a
-- call). Parking by key counts in PARK_MAX; both caps must have room for a task to be taken.
-- rate_limit: a task of a rate-limited name is taken only while its bucket's log has room
-- (see rate_room in _common.lua), and logged there under "<id>:<new token>" at now; one not
-- started by this call keeps the log window in its hash (`rw`) for start.lua, which moves
-- the logged time to its start. A task over the limit is held back in the schedule until its
-- window frees (or its turn after the tasks held back before it); held-back tasks count in
-- PARK_MAX.
-- Debounce: a task whose run at a debounced submit moved later while it waited due (`jd`: see
-- join_debounced in _common.lua) goes back to the schedule when popped before that run at;
-- these count in PARK_MAX too.
-- fairness="round_robin": the due tasks of a fair name wait in fair sets scored by round
-- (fair_push in _common.lua), found through `fprio:<queue>` and `fnames:<queue>:<prio>`, and
-- are taken in round order; a fair set's first task competes with the ready lists and parked
-- sets as they do with each other (higher priority, then the earlier run at), but against its
-- own name's parked tasks of its queue by round. Parked, by name or by key, it is scored by
-- its round, so it keeps its turn (a parked set mixing tasks scored by round and by run at,
-- its name having gained or lost fairness, gives the older first: first_in in _common.lua).
-- A task parked by name with a round is also in its fair parked set (fair_park), where
-- submits find the round being served; one parked by key joins it only once its key's slot
-- lets it out to its name's parked set (key_unpark_next). Every cap and limit above applies to it as to any task. A claim
-- takes at most the fair limit of the tasks of the names it is told are fair (a worker's idle
-- threads): the others wait in their turns here, not in the worker's local queue. A task of a
-- fair name waiting in a ready list (stored before the name gained fairness) counts, but the
-- list's pop is not cut short for it.
-- Returns {next scheduled time of these queues or '', then id, values of each claimed task}
-- (the values of CLAIMED_FIELDS, in order: codec.CLAIMED_FIELDS reads them).
local CLAIMED_FIELDS = {'n', 'q', 'p', 's', 'j', 'a', 'b', 'rl', 'ri', 'rb', 'md', 'c', 'r',
  'd', 'e', 'w', 'k', 'tc', 'at', 'rs', 'ck', 'rk', 'tg'}
local PARK_MAX = 1000
local worker, lease_until, limit, step = ARGV[3], ARGV[4], tonumber(ARGV[5]), ARGV[6]
local to_start = tonumber(ARGV[7])
local queues = {}
local claimed_queue = {}
local caps = {}
local capped = false
local rates = {}
local key_caps = {}
local arg = 8
while arg <= #ARGV and ARGV[arg] ~= '' do
  -- A paused queue is left out of the whole call: nothing taken, promoted or waited for.
  if not queue_paused(ARGV[arg]) then
    queues[#queues + 1] = ARGV[arg]
    claimed_queue[ARGV[arg]] = true
  end
  arg = arg + 1
end
arg = arg + 1
while arg < #ARGV and ARGV[arg] ~= '' do
  caps[ARGV[arg]] = tonumber(ARGV[arg + 1])
  capped = true
  arg = arg + 2
end
arg = arg + 1
while arg + 2 <= #ARGV and ARGV[arg] ~= '' do
  rates[ARGV[arg]] = {count = tonumber(ARGV[arg + 1]), window = tonumber(ARGV[arg + 2])}
  arg = arg + 3
end
arg = arg + 1
while arg < #ARGV and ARGV[arg] ~= '' do
  key_caps[ARGV[arg]] = tonumber(ARGV[arg + 1])
  arg = arg + 2
end
local fair_left = ARGV[arg + 1] and tonumber(ARGV[arg + 1]) -- nil: no bound
local fair_names = {}
for i = arg + 2, #ARGV do
  fair_names[ARGV[i]] = true
end

-- Whether this call may take no more tasks of `name`: fair, and the fair limit reached.
local function fair_full(name)
  return fair_left ~= nil and fair_left <= 0 and fair_names[name] == true
end

-- Tasks held back under another rate limit than this call's (or under one it no longer has:
-- the worker's handlers are the code in force) are planned again, before anything is promoted.
local planned = redis.call('HGETALL', P .. 'ratespec')
for i = 1, #planned, 2 do
  local rate = rates[planned[i]]
  if not rate or rate_spec(rate.count, rate.window) ~= planned[i + 1] then
    rate_replan(planned[i])
  end
end
for _, q in ipairs(queues) do
  promote(q, 1000)
end

local function held(name)
  return tonumber(redis.call('HGET', HELD, name) or '0')
end

local function held_by_key(name, ck)
  return tonumber(redis.call('HGET', P .. 'heldkey:' .. name, ck) or '0')
end

-- Names with tasks parked by key but no cap per key in this call (the cap removed, or one
-- this worker does not know): no freed slot may ever let those out, so they go back to their
-- names' parked sets, to be taken in order, their queues woken.
local unkeyed, unkeyed_queues = 0, {}
for _, name in ipairs(redis.call('SMEMBERS', KPARKED)) do
  if not key_caps[name] then
    for _, ck in ipairs(redis.call('SMEMBERS', P .. 'kparkkeys:' .. name)) do
      while unkeyed < PARK_MAX do
        local moved, queue = key_unpark_next(name, ck)
        if not moved then
          break
        end
        unkeyed = unkeyed + 1
        if queue then
          unkeyed_queues[queue] = true
        end
      end
    end
  end
end
for queue in pairs(unkeyed_queues) do
  wake(queue)
end

-- The names that have parked tasks: those of a name with free slots (or with no cap in this
-- call: a cap removed, or one this worker does not know) compete with the ready lists.
local parked_names = redis.call('SMEMBERS', PARKED)
local parked_seen = {}
for _, name in ipairs(parked_names) do
  parked_seen[name] = true
end

-- The run at of a source's first task (a ready list's read once, when a tie needs it).
local function run_at_of(source)
  if not source.at then
    source.at = tonumber(redis.call('HGET', tkey(redis.call('LINDEX', source.list, 0)), 'r'))
  end
  return source.at
end

-- Whether source `a` goes before source `b` of the same priority: the lower round between
-- a fair name's own sources of one queue (its fair set and its parked tasks), else the
-- earlier run at.
local function before(a, b)
  if a.round and b.round and a.name == b.name and a.queue == b.queue and a.round ~= b.round then
    return a.round < b.round
  end
  return run_at_of(a) < run_at_of(b)
end

-- Where to take from next: a ready list (`list`, its queue and priority `member`), a fair set
-- (`fset`, its name, queue and priority `member`) or a parked task (`pid`, its name and
-- priority `pprio`), as a table with its priority `prio`; and whether more than one source
-- ties for it (then take one task at a time, comparing them, so the order stays exact).
local function best()
  local chosen, tie = nil, false
  local function consider(source)
    if chosen == nil or source.prio > chosen.prio then
      chosen, tie = source, source.pid ~= nil
    elseif source.prio == chosen.prio then
      tie = true
      if before(source, chosen) then
        chosen = source
      end
    end
  end
  for _, q in ipairs(queues) do
    local top = redis.call('ZREVRANGE', P .. 'prio:' .. q, 0, 0, 'WITHSCORES')
    if top[1] then
      consider({prio = tonumber(top[2]), list = P .. 'ready:' .. q .. ':' .. top[1], queue = q,
        member = top[1]})
    end
    top = redis.call('ZREVRANGE', P .. 'fprio:' .. q, 0, 0, 'WITHSCORES')
    if top[1] and (chosen == nil or tonumber(top[2]) >= chosen.prio) then
      for _, name in ipairs(redis.call('SMEMBERS', P .. 'fnames:' .. q .. ':' .. top[1])) do
        -- (a fair name at the fair limit: its turns wait for the next claim)
        if not fair_full(name) then
          local set = fair_set(name, q, top[1])
          local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
          if first[1] then
            -- (its member starts with its run at: no read of its hash)
            consider({prio = tonumber(top[2]), fset = set, name = name, queue = q,
              member = top[1], round = tonumber(first[2]),
              at = tonumber(string.sub(first[1], 1, 20))})
          else
            fair_emptied(name, q, top[1]) -- a stray entry
          end
        end
      end
    end
  end
  for _, name in ipairs(parked_names) do
    if not caps[name] or held(name) < caps[name] then
      local id, prio_text, score = first_parked(name)
      local task = id and redis.call('HMGET', tkey(id), 'q', 'r', 'fr')
      if task and claimed_queue[task[1]] and not fair_full(name) then
        -- (a fair name's parked tasks are scored by round: its run at is in its hash)
        consider({prio = tonumber(prio_text), pid = id, name = name, pprio = prio_text,
          queue = task[1], at = tonumber(task[3] and task[2] or score),
          round = task[3] and tonumber(score)})
      end
    end
  end
  return chosen, tie
end

local out = {''}
local taken = 0
local parked = 0

-- A task of key `ck` of `name` was just leased: while the key has room left under `key_cap`
-- (its cap raised, or a task let out for a slot went elsewhere), its next task parked by key
-- competes again, in this call too (its queue woken if this call does not claim it).
local function key_room(name, ck, key_cap)
  if held_by_key(name, ck) >= key_cap then
    return
  end
  local moved, queue = key_unpark_next(name, ck)
  if moved and not parked_seen[name] then
    parked_seen[name] = true
    parked_names[#parked_names + 1] = name
  end
  if queue and not claimed_queue[queue] then
    wake(queue)
  end
end

-- A task a debounced submit joined while it waited due (`jd`, join_debounced in _common.lua)
-- stayed in its ready list or parked set: if its new run at is still ahead, it goes to the
-- schedule now (true), where promote brings it back when due.
local function not_due_after_all(id, key, queue, run_at)
  redis.call('HDEL', key, 'jd')
  if tonumber(run_at) <= NOWN then
    return false
  end
  redis.call('ZADD', P .. 'sched:' .. queue, run_at, id)
  return true
end

-- Take one popped (or unparked) task: lease it, or park it when its key or its name is at its
-- cap; one a debounced submit made due later goes to the schedule.
local function take(id)
  local key = tkey(id)
  local task = redis.call('HMGET', key, 's', 'n', 'p', 'r', 'q', 'd', 'c', 'rk', 'ck', 'jd', 'fr')
  -- The double check: still waiting and nobody's claim (a stray entry is dropped).
  if not waiting(task[1]) or redis.call('ZSCORE', LEASES, id) then
    return
  end
  local ck = task[9]
  local key_cap = ck and key_caps[task[2]]
  if task[10] and not_due_after_all(id, key, task[5], task[4]) then
    parked = parked + 1
    if key_cap then
      key_room(task[2], ck, key_cap) -- a slot of its key it was let out for goes on
    end
    return
  end
  local score = task[11] or task[4] -- parked by round (a task with one) or by run at
  if key_cap and held_by_key(task[2], ck) >= key_cap then
    -- Not in its fair parked set: waiting for its own key's slot, it is not being served, so
    -- its round is not the one a new key joins (key_unpark_next adds it once let out).
    key_park(id, task[2], ck, task[3], score)
    parked = parked + 1
    return
  end
  local cap = capped and caps[task[2]]
  if cap and held(task[2]) >= cap then
    park(id, task[2], task[3], score)
    if task[11] then
      fair_park(id, task[2], task[5], task[3], task[11])
    end
    parked = parked + 1
    return
  end
  local rate = rates[task[2]]
  local bucket
  if rate then
    bucket = rate_bucket(task[2], task[8])
    if not rate_take(bucket, rate.count, rate.window, task[2], task[8]) then
      local at = rate_slot(bucket, rate.count, rate.window)
      rate_wait(task[2], id, at, rate_spec(rate.count, rate.window))
      hold_back(id, key, task[5], at)
      parked = parked + 1
      return
    end
  end
  if fair_left and fair_names[task[2]] then
    fair_left = fair_left - 1
  end
  local token = redis.call('HINCRBY', key, 'k', step)
  redis.call('HSET', key, 'w', worker)
  lease(id, task[2], lease_until, ck)
  if key_cap then
    key_room(task[2], ck, key_cap)
  end
  local starts = to_start > 0 and (not task[6] or tonumber(task[6]) > NOWN)
  if bucket then
    rate_log(bucket, id .. ':' .. string.format('%.0f', token), id) -- as start.lua's ARGV
    if not starts then
      redis.call('HSET', key, 'rw', rate.window)
    end
  end
  if starts then
    to_start = to_start - 1
    -- now was read before this call was sent: a task submitted meanwhile is not started
    -- before it was created.
    redis.call('HSET', key, 's', 'RUNNING', 'st', tonumber(task[7]) > NOWN and task[7] or NOW)
    redis.call('HINCRBY', key, 'a', 1)
    redis.call('HINCRBY', key, 'b', 1)
    recount(task[5], task[1], 'RUNNING')
  end
  out[#out + 1] = id
  out[#out + 1] = redis.call('HMGET', key, unpack(CLAIMED_FIELDS))
  taken = taken + 1
end

while taken < limit and parked < PARK_MAX do
  local source, tie = best()
  if source == nil then
    break
  elseif source.pid then
    unpark_one(source.pid, source.name, source.pprio)
    if source.round then
      fair_unpark(source.pid, source.name, source.queue, source.pprio)
    end
    take(source.pid)
  elseif source.fset then
    local n = limit - taken
    if tie then
      n = 1
    elseif fair_left and fair_names[source.name] then
      n = math.min(n, fair_left)
    end
    local popped = redis.call('ZPOPMIN', source.fset, n)
    if redis.call('EXISTS', source.fset) == 0 then
      fair_emptied(source.name, source.queue, source.member)
    end
    for i = 1, #popped, 2 do
      take(fair_member_id(popped[i]))
    end
  else
    local ids = redis.call('LPOP', source.list, tie and 1 or (limit - taken)) or {}
    if redis.call('LLEN', source.list) == 0 then
      redis.call('ZREM', P .. 'prio:' .. source.queue, source.member)
    end
    for _, id in ipairs(ids) do
      take(id)
    end
  end
end

rate_flush()

local next_due
for _, q in ipairs(queues) do
  -- Work left behind a full batch (or the parking budget): wake another idle worker.
  if (taken >= limit or parked >= PARK_MAX)
      and redis.call('EXISTS', P .. 'prio:' .. q, P .. 'fprio:' .. q) > 0 then
    wake(q)
  end
  local first = redis.call('ZRANGE', P .. 'sched:' .. q, 0, 0, 'WITHSCORES')
  if first[2] and (next_due == nil or tonumber(first[2]) < tonumber(next_due)) then
    next_due = first[2]
  end
end
out[1] = next_due or ''
return out
