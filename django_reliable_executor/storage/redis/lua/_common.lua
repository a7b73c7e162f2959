-- Prepended to every transition script (see storage/redis/scripts.py): key names and the
-- moves between indexes that several transitions share.
--
-- Every script gets ARGV[1] = the key prefix ("{KEY_PREFIX}:", one Cluster hash slot) and
-- ARGV[2] = now in microseconds since the epoch, as a decimal string. Timestamps stay strings
-- in Lua: Lua numbers print with 14 significant digits, so tostring() would round them.
local P = ARGV[1]
local NOW = ARGV[2]
local NOWN = tonumber(NOW)
-- A shard of a sharded layout ("{KEY_PREFIX:shard-<i>-of-<N>:<salt>}:", sharding.py): ids may
-- then live off their directory shard (id_reserve.lua).
local SHARDED = string.find(P, ':shard%-%d+%-of%-%d+:%d+}:$') ~= nil
-- This shard's index (0 with one shard), and the shard of every batch (see _batches.lua).
local SHARD = SHARDED and tonumber(string.match(P, ':shard%-(%d+)%-of%-%d+:%d+}:$')) or 0
local BATCH_HOME = 0
local LEASES = P .. 'leases'
local DEADLINES = P .. 'deadlines'
local FINISHED = P .. 'finished'
local COUNTS = P .. 'counts'
local HELD = P .. 'held'
local PARKED = P .. 'parked'
local PAUSED_QUEUES = P .. 'queues:paused'

local function tkey(id)
  return P .. 't:' .. id
end

local function waiting(status)
  return status == 'CREATED' or status == 'PENDING'
end

local function live(status)
  return status == 'CREATED' or status == 'PENDING' or status == 'RUNNING'
end

-- A task that has not *ended* (docs/guarantees.md): live, or terminal while the handler of
-- its last attempt runs on (`hr`, see end_running_on). `status` is the task's, read before.
local function not_ended(id, status)
  return live(status) or redis.call('HEXISTS', tkey(id), 'hr') == 1
end

-- Keep the per-status counts exact: one task of `queue` moves from one status to another.
local function recount(queue, from, to)
  if from then
    redis.call('HINCRBY', COUNTS, from .. ':' .. queue, -1)
  end
  if to then
    redis.call('HINCRBY', COUNTS, to .. ':' .. queue, 1)
  end
end

-- Every status a task can have (states.TaskStatus): the count fields a queue may hold.
local STATUSES = {'CREATED', 'PENDING', 'RUNNING', 'COMPLETED', 'FAILED', 'TIMEOUT',
  'CANCELLED', 'ERROR'}

-- A queue that holds no task in any status leaves the indexes: the queue set (which every
-- master round walks), its count fields and its wake token. Any submitter can make up queue
-- names, so remembering each one forever would grow these without bound. A later submit to
-- the name adds it again. Returns true when the queue was forgotten.
local function forget_if_empty(queue)
  local names = {}
  for i, status in ipairs(STATUSES) do
    names[i] = status .. ':' .. queue
  end
  for _, n in ipairs(redis.call('HMGET', COUNTS, unpack(names))) do
    if n and tonumber(n) ~= 0 then
      return false
    end
  end
  -- The counts say empty; the waiting indexes must agree (a stray entry keeps the queue).
  if redis.call('EXISTS', P .. 'prio:' .. queue, P .. 'sched:' .. queue,
      P .. 'fprio:' .. queue) > 0 then
    return false
  end
  redis.call('HDEL', COUNTS, unpack(names))
  redis.call('SREM', P .. 'queues', queue)
  redis.call('DEL', P .. 'wake:' .. queue)
  return true
end

-- A paused queue (executor.pause_queue): claims take none of its tasks, which wait where they
-- are (ready lists, schedule, parked sets) until it is resumed.
local function queue_paused(queue)
  return redis.call('SISMEMBER', PAUSED_QUEUES, queue) == 1
end

-- One token in the queue's wake list lets one idle worker's blocking pop return.
local function wake(queue)
  local key = P .. 'wake:' .. queue
  redis.call('LPUSH', key, '1')
  redis.call('LTRIM', key, 0, 0)
end

-- fairness="round_robin" (core/fairness.py): each task of a fair name carries its round
-- (`fr`, numbered by store_task), and waits due in a sorted set of its name, queue and
-- priority scored by that round, `fready:<len>:<name>:<queue>:<prio>` (the name's length in
-- bytes keeps names holding ':' apart, as key_bucket does), instead of the FIFO ready list:
-- claims take it in round order, one task of each key before the second of any, the oldest
-- first within a round (its member is its run at, zero-padded, then its id: the members of
-- one score sort as strings). `fnames:<queue>:<prio>` SET of the names with a non-empty one,
-- `fprio:<queue>` ZSET of the priorities with some (where claims find them: no scan). A
-- submit reads the round its name, queue and priority are at from their fair set's first
-- task and their fair parked set's (fair_view).
local function fair_set(name, queue, priority)
  return P .. 'fready:' .. #name .. ':' .. name .. ':' .. queue .. ':' .. priority
end

-- A task's member in its fair set, from its run at (a decimal string, as in its hash: the
-- set holds it under the run at it had when it came in) and its id (codec.fair_member_id).
local function fair_member(id, run_at)
  return string.rep('0', 20 - #run_at) .. run_at .. ':' .. id
end

local function fair_member_id(member)
  return string.sub(member, 22)
end

local function fair_push(id, name, queue, priority, round, run_at)
  redis.call('ZADD', fair_set(name, queue, priority), round, fair_member(id, run_at))
  redis.call('SADD', P .. 'fnames:' .. queue .. ':' .. priority, name)
  redis.call('ZADD', P .. 'fprio:' .. queue, priority, priority)
end

-- The fair set of `name`, `queue` and `priority` is empty: it leaves the indexes.
local function fair_emptied(name, queue, priority)
  local names = P .. 'fnames:' .. queue .. ':' .. priority
  redis.call('SREM', names, name)
  if redis.call('EXISTS', names) == 0 then
    redis.call('ZREM', P .. 'fprio:' .. queue, priority)
  end
  -- (`fsets:<name>`, the name's fair sets as "<prio>:<queue>", was kept before rounds were
  -- counted per queue and priority: drained as those empty, never added to)
  redis.call('SREM', P .. 'fsets:' .. name, priority .. ':' .. queue)
end

-- Make a task claimable: the tail of its priority's ready list (new work), or the head
-- (work handed back, which was first in line). A task of a fair name goes to its fair set by
-- its round, wherever it comes from: `fair` is {name, round, run at}, false for a task
-- without a round, nil to read them from its hash.
local function push_ready(id, queue, priority, at_head, fair)
  if fair == nil then
    fair = redis.call('HMGET', tkey(id), 'n', 'fr', 'r')
  end
  if fair and fair[2] then
    fair_push(id, fair[1], queue, priority, fair[2], fair[3])
    return
  end
  local list = P .. 'ready:' .. queue .. ':' .. priority
  if at_head then
    redis.call('LPUSH', list, id)
  else
    redis.call('RPUSH', list, id)
  end
  redis.call('ZADD', P .. 'prio:' .. queue, priority, priority)
end

-- max_concurrency: a due task of a capped name that a claim could not take (its name held
-- its cap) waits in the name's parked set of its priority, scored by run at (a task with a
-- round, `fr`, by its round: it keeps its turn). Claims knowing the cap take parked tasks
-- straight from there, in order with the ready lists, while the name has free slots.
local function park(id, name, priority, score)
  redis.call('ZADD', P .. 'parked:' .. name .. ':' .. priority, score, id)
  redis.call('ZADD', P .. 'parkprio:' .. name, priority, priority)
  redis.call('SADD', PARKED, name)
end

-- A parked score below this is a round, one at or above it a run at (µs: any time after
-- 1970-01-13; a key would need 2^40 tasks to reach it in rounds).
local ROUNDS_BELOW = 1099511627776

-- The first task of a parked set (by name or by key) and its score: the lowest score, but
-- when the set holds tasks scored by run at beside tasks scored by round (their name gained
-- or lost fairness while they waited: rounds all sort first), the first of each kind with
-- the earlier run at, so tasks parked before the change are not left behind those parked
-- after it (the run at's kind on a tie: the name's older tasks). One more command than a
-- ZRANGE when the first has a round, two more when the set mixes.
local function first_in(set)
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  if not first[1] or tonumber(first[2]) >= ROUNDS_BELOW then
    return first[1], first[2]
  end
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')
  if tonumber(last[2]) < ROUNDS_BELOW then
    return first[1], first[2]
  end
  local timed = redis.call('ZRANGEBYSCORE', set, ROUNDS_BELOW, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
  if tonumber(timed[2]) <= tonumber(redis.call('HGET', tkey(first[1]), 'r') or '0') then
    return timed[1], timed[2]
  end
  return first[1], first[2]
end

-- fairness: `fparked:<len>:<name>:<queue>:<prio>` ZSET of the tasks with a round of a name,
-- queue and priority in the name's parked set (parked at its cap, or let out there by their
-- key), scored by round: where a submit finds the round those are at (fair_round). A task
-- parked by key (waiting for its own key's slot) is not in it: it is not being served, and a
-- new key does not join its round (as on the databases, where it leaves the name's range).
-- A task enters it where it enters the name's parked set (claim.lua's take, key_unpark_next)
-- and leaves it where it leaves that set (claim.lua, once unparked to be taken, and unqueue).
local function fair_parked_set(name, queue, priority)
  return P .. 'fparked:' .. #name .. ':' .. name .. ':' .. queue .. ':' .. priority
end

local function fair_park(id, name, queue, priority, round)
  redis.call('ZADD', fair_parked_set(name, queue, priority), round, id)
end

local function fair_unpark(id, name, queue, priority)
  redis.call('ZREM', fair_parked_set(name, queue, priority), id)
end

-- Take one task out of its name's parked set (if it is there).
local function unpark_one(id, name, priority)
  local set = P .. 'parked:' .. name .. ':' .. priority
  if redis.call('ZREM', set, id) > 0 and redis.call('EXISTS', set) == 0 then
    redis.call('ZREM', P .. 'parkprio:' .. name, priority)
    if redis.call('EXISTS', P .. 'parkprio:' .. name) == 0 then
      redis.call('SREM', PARKED, name)
    end
  end
end

-- The next parked task of `name` (highest priority, then earliest, see first_in): id,
-- priority, score (its run at, or its round).
local function first_parked(name)
  local top = redis.call('ZREVRANGE', P .. 'parkprio:' .. name, 0, 0)
  if not top[1] then
    return nil
  end
  local id, score = first_in(P .. 'parked:' .. name .. ':' .. top[1])
  return id, top[1], score
end

-- Wake the workers of the queue of the next parked task of `name` (a slot of it is free).
local function wake_parked(name)
  local id = first_parked(name)
  if id then
    wake(redis.call('HGET', tkey(id), 'q'))
  end
end

-- max_concurrency_per_key: a due task whose concurrency key (`ck`) held its name's cap per key
-- waits parked by key, where no claim looks (a thousand full keys cost a claim nothing):
-- `kparked:<bucket>:<prio>` ZSET of its tasks of that priority scored by run at (one with a
-- round by its round, as in its parked set),
-- `kparkprio:<bucket>` ZSET of the priorities with some, the bucket being
-- `<length of name>:<name>:<key>` (names and keys may hold ':', as in rate_bucket);
-- `kparkkeys:<name>` SET of the name's keys with tasks parked so, KPARKED SET of those names.
-- A slot of the key freed (unlease) sends its first one to the name's parked set, where claims
-- compete for it in order (key_unpark_next).
local KPARKED = P .. 'kparked'

local function key_bucket(name, ck)
  return #name .. ':' .. name .. ':' .. ck
end

local function key_park(id, name, ck, priority, score)
  local bucket = key_bucket(name, ck)
  redis.call('ZADD', P .. 'kparked:' .. bucket .. ':' .. priority, score, id)
  redis.call('ZADD', P .. 'kparkprio:' .. bucket, priority, priority)
  redis.call('SADD', P .. 'kparkkeys:' .. name, ck)
  redis.call('SADD', KPARKED, name)
end

-- Take one task out of its key's parked set: true when it was there.
local function key_unpark_one(id, name, ck, priority)
  local bucket = key_bucket(name, ck)
  local set = P .. 'kparked:' .. bucket .. ':' .. priority
  if redis.call('ZREM', set, id) == 0 then
    return false
  end
  if redis.call('EXISTS', set) == 0 then
    redis.call('ZREM', P .. 'kparkprio:' .. bucket, priority)
    if redis.call('EXISTS', P .. 'kparkprio:' .. bucket) == 0 then
      redis.call('SREM', P .. 'kparkkeys:' .. name, ck)
      if redis.call('EXISTS', P .. 'kparkkeys:' .. name) == 0 then
        redis.call('SREM', KPARKED, name)
      end
    end
  end
  return true
end

-- A slot of key `ck` of `name` may be free: the key's first parked task (highest priority,
-- then earliest, see first_in) moves to the name's parked set, where claims take it in order
-- with the ready lists (a claim that finds the key full again parks it by key again); one
-- with a round joins its fair parked set there (being served again). Returns its id and its queue (nil: a stray entry,
-- which the claim drops), or nil when none is parked.
local function key_unpark_next(name, ck)
  local bucket = key_bucket(name, ck)
  local top = redis.call('ZREVRANGE', P .. 'kparkprio:' .. bucket, 0, 0)
  if not top[1] then
    return nil
  end
  local id, score = first_in(P .. 'kparked:' .. bucket .. ':' .. top[1])
  key_unpark_one(id, name, ck, top[1])
  park(id, name, top[1], score)
  local task = redis.call('HMGET', tkey(id), 'q', 'fr')
  if task[1] and task[2] then
    fair_park(id, name, task[1], top[1], task[2])
  end
  return id, task[1] or nil
end

-- rate_limit (core/rate_limits.py): the sliding log of the claims of one task name and rate key, a
-- sorted set `rate:<bucket>` of claim times (microseconds) kept for the limit's log window
-- (window + margin, microseconds) and expiring with it once idle. The bucket is
-- `<length of name>:<name>:<rate key>`: the length keeps names holding ':' apart.
local function rate_bucket(name, rate_key)
  return #name .. ':' .. name .. ':' .. (rate_key or '')
end

-- How many more claims the bucket's limit allows now (claims older than the window trimmed).
local function rate_room(bucket, count, window)
  local log = P .. 'rate:' .. bucket
  redis.call('ZREMRANGEBYSCORE', log, '-inf', string.format('%.0f', NOWN - window))
  return count - redis.call('ZCARD', log)
end

-- A claim call's buckets: each trimmed and counted once (`room`), its writes that need doing
-- once (the log's expiry, `ratekeys:<len>:<name>` listing the name's rate keys by latest
-- claim, for rate_use) done by rate_flush at the end of the call.
local rate_seen = {}

-- Room for one more claim in `bucket` now: taken (true), or none (false).
local function rate_take(bucket, count, window, name, rate_key)
  local b = rate_seen[bucket]
  if not b then
    b = {room = rate_room(bucket, count, window), window = window, name = name,
      key = rate_key or '', logged = false,
      waits = redis.call('EXISTS', P .. 'ratewait:' .. #name .. ':' .. name) == 1}
    rate_seen[bucket] = b
  end
  if b.room <= 0 then
    return false
  end
  b.room = b.room - 1
  return true
end

-- Log a claim (`member`: "<task id>:<token>") of task `id` in `bucket` (after rate_take) at
-- now; a task held back before leaves `ratewait:` (see rate_wait).
local function rate_log(bucket, member, id)
  local b = rate_seen[bucket]
  redis.call('ZADD', P .. 'rate:' .. bucket, NOW, member)
  b.logged = true
  if b.waits then
    redis.call('ZREM', P .. 'ratewait:' .. #b.name .. ':' .. b.name, id)
  end
end

local function rate_flush()
  for bucket, b in pairs(rate_seen) do
    if b.logged then
      local ttl = math.ceil(b.window / 1000) + 1
      redis.call('PEXPIRE', P .. 'rate:' .. bucket, ttl)
      local keys = P .. 'ratekeys:' .. #b.name .. ':' .. b.name
      redis.call('ZREMRANGEBYSCORE', keys, '-inf', string.format('%.0f', NOWN - b.window))
      redis.call('ZADD', keys, NOW, b.key)
      redis.call('PEXPIRE', keys, ttl)
    end
  end
end

-- A limit as its held-back tasks record it: "<count>/<log window in µs>".
local function rate_spec(count, window)
  return string.format('%d/%.0f', count, window)
end

-- Note task `id` of `name` as held back by its rate limit (`spec`, rate_spec) until `at`:
-- `ratewait:<len>:<name>` lists them (for rate_use, and for rate_replan: the set expires only
-- after its last task's slot), `ratespec` HASH name -> the limit they were planned under.
local function rate_wait(name, id, at, spec)
  local key = P .. 'ratewait:' .. #name .. ':' .. name
  redis.call('ZREMRANGEBYSCORE', key, '-inf', NOW)
  redis.call('ZADD', key, at, id)
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  redis.call('PEXPIRE', key, math.ceil((tonumber(last[2]) - NOWN) / 1000) + 1000)
  redis.call('HSET', P .. 'ratespec', name, spec)
end

-- The limit of `name` in force (rate_spec; '' for none) is not the one its held-back tasks
-- were planned under (a deploy raised, lowered or removed it): each of them still waiting in
-- its queue's schedule is due now, to be claimed or held back again under the limit in
-- force, and its queue woken. One call re-plans them all, so none keeps an old slot.
local function rate_replan(name)
  local key = P .. 'ratewait:' .. #name .. ':' .. name
  local woken = {}
  for _, id in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    local queue = redis.call('HGET', tkey(id), 'q')
    -- XX: only a task still in the schedule (not claimed, cancelled or purged since)
    if queue and redis.call('ZADD', P .. 'sched:' .. queue, 'XX', 'CH', NOW, id) == 1 then
      redis.call('HSET', tkey(id), 'r', NOW)
      woken[queue] = true
    end
  end
  redis.call('DEL', key)
  redis.call('HDEL', P .. 'ratespec', name)
  for queue in pairs(woken) do
    wake(queue)
  end
end

-- When a task held back at its bucket's limit tries again: once the earliest claim leaves the
-- window; past the first `count` tasks held back for that moment, a window later per `count`
-- (`ratenext:<bucket>` = "<slot>:<tasks given it>"), so that a backlog comes back about once
-- per task rather than all of it at every window. The saved slot holds the limit it was
-- planned under ("<slot>:<given>:<spec>"): one planned under another limit is not followed.
local function rate_slot(bucket, count, window)
  local first = redis.call('ZRANGE', P .. 'rate:' .. bucket, 0, 0, 'WITHSCORES')
  local slot, given = first[2] and (tonumber(first[2]) + window) or NOWN, 0
  local key = P .. 'ratenext:' .. bucket
  local spec = rate_spec(count, window)
  local saved = redis.call('GET', key)
  if saved then
    local at, n, planned = string.match(saved, '^(%d+):(%d+):(.*)$')
    if planned == spec and tonumber(at) >= slot then
      slot, given = tonumber(at), tonumber(n)
    end
  end
  if given >= count then
    slot, given = slot + window, 0
  end
  local text = string.format('%.0f', slot)
  redis.call('SET', key, text .. ':' .. (given + 1) .. ':' .. spec, 'PX',
    math.ceil((slot + window - NOWN) / 1000))
  return text
end

-- start.lua: a claimed task's logged claim (`member` in its bucket) moves to now if it is
-- still in the window (`window`, µs): false when it left it (the claim waited too long).
local function rate_restamp(bucket, member, window)
  local log = P .. 'rate:' .. bucket
  local at = redis.call('ZSCORE', log, member)
  if not at or tonumber(at) <= NOWN - window then
    return false
  end
  redis.call('ZADD', log, NOW, member)
  redis.call('PEXPIRE', log, math.ceil(window / 1000) + 1)
  return true
end

-- A waiting task a claim popped but may not take yet: scheduled again at `at` (its run at
-- too: the next time it may start), where promote brings it back and idle workers wait for.
local function hold_back(id, key, queue, at)
  redis.call('HSET', key, 'r', at)
  redis.call('ZADD', P .. 'sched:' .. queue, at, id)
end

-- Durable waits (suspend.lua): P waits holds each waiting task's kind of wait, and P waits:count
-- how many wait of each kind (the waiting-tasks gauge). A task leaves them when it is claimed
-- (resumed) or ends waiting (cancelled, timed out): one HGET on a small hash, or none there.
local WAITS = P .. 'waits'
local function unwait(id)
  local kind = redis.call('HGET', WAITS, id)
  if kind then
    redis.call('HDEL', WAITS, id)
    redis.call('HINCRBY', WAITS .. ':count', kind, -1)
    redis.call('HDEL', tkey(id), 'wt', 'wf') -- resumed (or ended): it waits no more
  end
end

-- The only ways into and out of the leases: `held` counts the leased tasks of each name
-- (max_concurrency), `heldkey:<name>` (HASH concurrency key -> count, a key at 0 removed)
-- those of each of its keys (max_concurrency_per_key), whatever this call's caps: a later
-- claim may cap them. A slot freed sends the next task parked by its key to the name's parked
-- set, and wakes the workers of a parked task of the name.
local function lease(id, name, lease_until, ck)
  redis.call('ZADD', LEASES, lease_until, id)
  redis.call('HINCRBY', HELD, name, 1)
  if ck then
    redis.call('HINCRBY', P .. 'heldkey:' .. name, ck, 1)
  end
  unwait(id)
end

local function unlease(id, key)
  if redis.call('ZREM', LEASES, id) == 0 then
    return
  end
  local task = redis.call('HMGET', key, 'n', 'ck')
  local name, ck = task[1], task[2]
  if redis.call('HINCRBY', HELD, name, -1) <= 0 then
    redis.call('HDEL', HELD, name)
  end
  if ck then
    -- (below 0: leased before keys were counted, as `held` before caps; dropped alike)
    if redis.call('HINCRBY', P .. 'heldkey:' .. name, ck, -1) <= 0 then
      redis.call('HDEL', P .. 'heldkey:' .. name, ck)
    end
    local _, queue = key_unpark_next(name, ck)
    if queue then
      wake(queue)
    end
  end
  if redis.call('SISMEMBER', PARKED, name) == 1 then
    wake_parked(name)
  end
end

-- Take a waiting, unclaimed task out of its ready list (a fair name's: its fair set), the
-- schedule or its parked sets.
local function unqueue(id, queue, priority)
  local task = redis.call('HMGET', tkey(id), 'n', 'ck', 'jd', 'fr', 'r')
  if task[4] then
    local set = fair_set(task[1], queue, priority)
    if redis.call('ZREM', set, fair_member(id, task[5])) > 0
        and redis.call('EXISTS', set) == 0 then
      fair_emptied(task[1], queue, priority)
    end
  else
    local list = P .. 'ready:' .. queue .. ':' .. priority
    if redis.call('LREM', list, 1, id) > 0 and redis.call('LLEN', list) == 0 then
      redis.call('ZREM', P .. 'prio:' .. queue, priority)
    end
  end
  redis.call('ZREM', P .. 'sched:' .. queue, id)
  if task[3] then
    redis.call('HDEL', tkey(id), 'jd') -- (see join_debounced: it waits nowhere now)
  end
  if task[4] then
    fair_unpark(id, task[1], queue, priority)
  end
  unpark_one(id, task[1], priority)
  if task[2] and not key_unpark_one(id, task[1], task[2], priority) then
    -- It may be the task a freed slot of its key let out of the key's parked sets: that slot
    -- goes to the next one parked there, which would otherwise wait for a slot no lease
    -- frees (when the key is full after all, a claim parks it by key again).
    local _, next_queue = key_unpark_next(task[1], task[2])
    if next_queue then
      wake(next_queue)
    end
  end
end

-- The parameter index (SEARCHABLE_PARAMETERS; storage/redis/parameter_index.py): task `id`
-- joins the `P pidx:<len>:<key>:<text>` set of each entry of `entries` (a JSON list of their
-- names after 'pidx:', '' = none), scored by its creation `created`, and keeps the list as `px`.
local function index_parameter(id, entries, created)
  if entries and entries ~= '' then
    redis.call('HSET', tkey(id), 'px', entries)
    for _, entry in ipairs(cjson.decode(entries)) do
      redis.call('ZADD', P .. 'pidx:' .. entry, created, id)
    end
  end
end

-- Task `id` leaves the index sets its `px` lists (a set emptied goes: ZREM deletes it).
local function unindex_parameter(id, entries)
  if entries then
    for _, entry in ipairs(cjson.decode(entries)) do
      redis.call('ZREM', P .. 'pidx:' .. entry, id)
    end
  end
end

-- Debounce (core/debouncing.py). A submit of a debounced key may join the task holding it:
-- one waiting unclaimed (not in the leases), CREATED and never started.
local function joinable(id)
  local task = redis.call('HMGET', tkey(id), 's', 'a')
  return task[1] == 'CREATED' and task[2] == '0' and not redis.call('ZSCORE', LEASES, id)
end

-- Join task `id` (joinable): its parameter becomes `param` (JSON), its parameter index entries
-- the submit's `entries` (as store_task takes them), and it runs `debounce` µs
-- after the submit's `created`, but never later than `max_wait` µs ('' = no limit) after its
-- own creation (debounced_run_at); its max duration counts from then, as the service set it
-- for the first submit. Not due yet, it moves in the schedule. Due already, it stays where it
-- waits: a ready list, where only a walk of the list could find it, or a parked set,
-- rescored (a fair name's task keeps its round there, and in its fair set, where its member
-- follows its run at); if its run at is now ahead, `jd` marks it, and the claim that pops it
-- puts it back in the schedule (claim.lua's take). Returns its new run at (µs, a string).
local function join_debounced(id, param, created, debounce, max_wait, entries)
  local key = tkey(id)
  local task = redis.call('HMGET', key, 'q', 'p', 'n', 'ck', 'r', 'c', 'md', 'fr', 'px')
  if (task[9] or '') ~= entries then -- its entries move with its parameter, its score kept
    unindex_parameter(id, task[9])
    redis.call('HDEL', key, 'px')
    index_parameter(id, entries, task[6])
  end
  local run_at = tonumber(created) + tonumber(debounce)
  if max_wait ~= '' then
    run_at = math.min(run_at, tonumber(task[6]) + tonumber(max_wait))
  end
  local at = string.format('%.0f', run_at)
  redis.call('HSET', key, 'j', param, 'r', at)
  if task[7] then
    local deadline = string.format('%.0f', run_at + tonumber(task[7]) * 1000)
    redis.call('HSET', key, 'd', deadline)
    redis.call('ZADD', DEADLINES, deadline, id)
  end
  local sched = P .. 'sched:' .. task[1]
  if redis.call('ZSCORE', sched, id) then
    redis.call('ZADD', sched, at, id)
    if run_at < tonumber(task[5]) then
      wake(task[1]) -- (a shorter debounce than the last submit's) idle workers wait less
    end
    return at
  end
  local set = task[8] and fair_set(task[3], task[1], task[2])
  if set and redis.call('ZREM', set, fair_member(id, task[5])) == 1 then
    redis.call('ZADD', set, task[8], fair_member(id, at))
  elseif not set then
    redis.call('ZADD', P .. 'parked:' .. task[3] .. ':' .. task[2], 'XX', at, id)
    if task[4] then
      local bucket = key_bucket(task[3], task[4])
      redis.call('ZADD', P .. 'kparked:' .. bucket .. ':' .. task[2], 'XX', at, id)
    end
  end
  if run_at > NOWN then
    redis.call('HSET', key, 'jd', '1')
  end
  return at
end

-- The key `ukey` of task `id`, just joined, holds until `until_` (µs, a string), as a new
-- window's would from its run at; unless the key names another task by now. Its entry keeps
-- whatever follows the window end (sharded: "<id> <shard> <taken at>", see unique_reserve.lua).
local function extend_key(ukey, id, until_)
  local held = redis.call('GET', ukey)
  local space = held and string.find(held, ' ', 1, true)
  if not space or string.match(held, '^(%S+)', space + 1) ~= id then
    return
  end
  local ttl = math.max(1, math.ceil((tonumber(until_) - NOWN) / 1000))
  redis.call('SET', ukey, until_ .. string.sub(held, space), 'PX', string.format('%d', ttl))
end

-- Scheduled tasks of `queue` that are due go to the ready lists (or fair sets), earliest
-- first.
local function promote(queue, limit)
  local sched = P .. 'sched:' .. queue
  local due = redis.call('ZRANGEBYSCORE', sched, '-inf', NOW, 'LIMIT', 0, limit)
  for _, id in ipairs(due) do
    redis.call('ZREM', sched, id)
    local task = redis.call('HMGET', tkey(id), 'p', 'n', 'fr', 'r')
    push_ready(id, queue, task[1], false, {task[2], task[3], task[4]})
  end
  return #due
end

-- A task waits again from `run_at` (a string): ready at once when due, else scheduled.
local function to_waiting(id, queue, priority, run_at)
  if tonumber(run_at) <= NOWN then
    promote(queue, 1000) -- earlier due tasks keep their place ahead of this one
    push_ready(id, queue, priority, false)
    wake(queue)
  else
    redis.call('ZADD', P .. 'sched:' .. queue, run_at, id)
    wake(queue) -- an idle worker then waits until this one is due, not a whole poll
  end
end

-- A claimed task goes back to the head of its ready list (a fair name's: to its fair set,
-- by its round): unclaimed, old token dead.
local function hand_back(id, key, queue, priority)
  unlease(id, key)
  redis.call('HDEL', key, 'w')
  redis.call('HINCRBY', key, 'k', 1)
  push_ready(id, queue, priority, true)
  wake(queue)
end

-- The admin's throughput chart (throughput.py): one HASH per UTC minute, "<status>" (and
-- "RETRIED") -> tasks that ended so in the minute, and "c:<queue>" -> tasks of the queue
-- completed in the minute (the summary's sparklines). Its expiry is set by the first count of
-- a status (HINCRBY answers 1; a queue's count always follows its COMPLETED's, in the same
-- hash), so each ending costs one command, a completion two, rarely one more. Seconds, as
-- throughput.COUNTER_RETENTION_SECONDS.
local ENDINGS_TTL = 7200
local function count_ending(field, queue)
  local minute = P .. 'tput:' .. string.format('%d', math.floor(NOWN / 60000000))
  if redis.call('HINCRBY', minute, field, 1) == 1 then
    redis.call('EXPIRE', minute, ENDINGS_TTL)
  end
  if queue and field == 'COMPLETED' then
    redis.call('HINCRBY', minute, 'c:' .. queue, 1)
  end
end

-- Batches (_batches.lua, defined there: it stores callbacks with store_task): count a member's
-- end in its batch, and finish the batch when that was the last.
local settle_batch

-- A terminal status: out of the lease and deadline indexes, into the finished index (by
-- finish time, for purging) and its status's done index (by creation time, for listing).
-- Only finish (below) and the settling of dependents call it: every other ending goes
-- through finish, so that its dependents are settled.
local function end_task(id, key, queue, from, status)
  count_ending(status, queue)
  unwait(id)
  redis.call('HSET', key, 's', status, 'f', NOW)
  redis.call('HDEL', key, 'd', 'wf')
  unlease(id, key)
  redis.call('ZREM', DEADLINES, id)
  redis.call('ZADD', FINISHED, NOW, id)
  redis.call('ZADD', P .. 'done:' .. status, redis.call('HGET', key, 'c'), id)
  recount(queue, from, status)
  settle_batch(id, key, status)
end

-- Sharded: what a change on this shard tells another shard (a dependency ended, a batch
-- member ended or was retried, a batch callback to store) goes into this shard's outbox in
-- the script that made the change, as a JSON message {to = target shard, f = this shard, m =
-- its number here, k = kind, ...}. storage/redis/outbox.py delivers it (outbox_apply.lua on
-- the target, which applies each message once) and only then removes it from the outbox.
-- P outbox: LIST of messages; P outbox:seq: STRING, the last message number.
local SENT = false -- whether this call sent a message (complete.lua says so in its reply)
local function send(to, message)
  SENT = true
  message.to = to
  message.f = SHARD
  message.m = tostring(redis.call('INCR', P .. 'outbox:seq'))
  redis.call('RPUSH', P .. 'outbox', cjson.encode(message))
end

-- Dependencies (dependencies.py). A waiting dependent is CREATED, in its queue's schedule at
-- the far-future WAITING_RUN_AT (so no claim or promote takes it), with `wf` the JSON list of
-- the dependencies it still awaits; `deps:<id>` is the SET of the dependents of task <id>:
-- their ids, and (sharded) "<shard> <id>" for a dependent of another shard (a task id holds
-- no whitespace), registered there by dep_link.lua and told of the ending by a message.

-- A waiting dependent with nothing left to await becomes due now; its max duration counts
-- from now.
local function release_dependent(id, key, queue, priority, max_duration)
  redis.call('HDEL', key, 'wf')
  redis.call('ZREM', P .. 'sched:' .. queue, id)
  redis.call('HSET', key, 'r', NOW)
  if max_duration then
    local deadline = string.format('%.0f', NOWN + tonumber(max_duration) * 1000)
    redis.call('HSET', key, 'd', deadline)
    redis.call('ZADD', DEADLINES, deadline, id)
  end
  to_waiting(id, queue, priority, NOW)
end

-- A waiting dependent cancelled because dependency `cause` ended `status` (not COMPLETED).
local function cancel_dependent(id, key, queue, cause, status)
  redis.call('ZREM', P .. 'sched:' .. queue, id)
  redis.call('HSET', key, 'e', 'dependency ' .. cause .. ' ended ' .. status .. ': cancelled')
  redis.call('HINCRBY', key, 'k', 1)
  end_task(id, key, queue, 'CREATED', 'CANCELLED')
end

-- Task `id` just ended `status`: each dependent still awaiting it is released (the last one
-- awaited), cancelled (it failed, unless the dependent said "run"; the cancel cascades to
-- the dependents' dependents) or left waiting for the rest. A dependent that no longer
-- awaits it (settled before, cancelled, retried) is left alone: settled exactly once.
-- Dependent `dep` (of this shard) learns that `cause` ended `ended`: released, cancelled
-- (returns true: its own dependents are to be settled) or left waiting for the rest; nothing
-- when it does not await `cause` (any more).
local function settle_dependent(dep, cause, ended)
  local key = tkey(dep)
  local t = redis.call('HMGET', key, 's', 'wf', 'of', 'q', 'p', 'md')
  if t[1] == 'PENDING' and t[2] then -- a durable wait_for (suspend.lua): woken by any ending
    local remaining = {}
    for _, w in ipairs(cjson.decode(t[2])) do
      if w ~= cause then
        remaining[#remaining + 1] = w
      end
    end
    if #remaining > 0 then
      redis.call('HSET', key, 'wf', cjson.encode(remaining))
    else
      redis.call('HDEL', key, 'wf')
      if redis.call('ZREM', P .. 'sched:' .. t[4], dep) == 1 then -- not due (or claimed) yet
        redis.call('HSET', key, 'r', NOW)
        to_waiting(dep, t[4], t[5], NOW)
      end
    end
  elseif t[1] == 'CREATED' and t[2] then
    local remaining, awaited = {}, false
    for _, w in ipairs(cjson.decode(t[2])) do
      if w == cause then
        awaited = true
      else
        remaining[#remaining + 1] = w
      end
    end
    if awaited then
      if ended ~= 'COMPLETED' and t[3] ~= 'run' then
        cancel_dependent(dep, key, t[4], cause, ended)
        return true
      elseif #remaining == 0 then
        release_dependent(dep, key, t[4], t[5], t[6])
      else
        redis.call('HSET', key, 'wf', cjson.encode(remaining))
      end
    end
  end
  return false
end

local function settle_dependents(id, status)
  local todo, n = {{id, status}}, 1
  while todo[n] do
    local cause, ended = todo[n][1], todo[n][2]
    n = n + 1
    for _, dep in ipairs(redis.call('SMEMBERS', P .. 'deps:' .. cause)) do
      local space = SHARDED and string.find(dep, ' ', 1, true)
      if space then -- a dependent of another shard: told by a message
        send(tonumber(string.sub(dep, 1, space - 1)),
          {k = 'dep', id = string.sub(dep, space + 1), d = cause, s = ended})
      elseif settle_dependent(dep, cause, ended) then
        todo[#todo + 1] = {dep, 'CANCELLED'}
      end
    end
  end
end

-- A task ends: end_task, and its dependents are settled in the same script.
local function finish(id, key, queue, from, status)
  end_task(id, key, queue, from, status)
  settle_dependents(id, status)
end

-- A RUNNING task becomes `status` (TIMEOUT) while its handler runs on: terminal in every
-- index, but it keeps its lease (the heartbeat renews it, max_concurrency counts it) and has
-- not *ended*: `hr` marks it, and its batch and dependents are settled only by
-- handler_ended, when the handler returns (handler_returned.lua) or the lease lapses
-- (recover.lua).
local function end_running_on(id, key, queue, status)
  count_ending(status)
  redis.call('HSET', key, 's', status, 'f', NOW, 'hr', '1')
  redis.call('HDEL', key, 'd', 'wf')
  redis.call('ZREM', DEADLINES, id)
  redis.call('ZADD', FINISHED, NOW, id)
  redis.call('ZADD', P .. 'done:' .. status, redis.call('HGET', key, 'c'), id)
  recount(queue, 'RUNNING', status)
end

-- The handler of a task end_running_on ended has returned, or its lease lapsed: it leaves
-- the leases and ends now (its batch counts it, its dependents are settled). False when it
-- was not running on (nothing changes).
local function handler_ended(id, key)
  if redis.call('HDEL', key, 'hr') == 0 then
    return false
  end
  local status = redis.call('HGET', key, 's')
  unlease(id, key)
  settle_batch(id, key, status)
  settle_dependents(id, status)
  return true
end

-- A failed attempt of a RUNNING task: back to waiting at `run_at`, or a terminal status.
local function record_failure(id, key, queue, priority, status, run_at, err)
  redis.call('HSET', key, 'e', err)
  if status == 'PENDING' then
    redis.call('HSET', key, 's', 'PENDING', 'r', run_at)
    redis.call('HDEL', key, 'wt', 'wf') -- a retry, not a durable wait (suspend.lua)
    unlease(id, key)
    recount(queue, 'RUNNING', 'PENDING')
    count_ending('RETRIED')
    to_waiting(id, queue, priority, run_at)
  else
    finish(id, key, queue, 'RUNNING', status)
  end
end


-- The rounds of a fair name's new tasks (core/fairness.py's number_rounds), counted apart for
-- each queue and priority of the name, as the claims serve them:
-- `fround:<len>:<name>:<queue>:<prio>` ZSET of the keys (core/fairness.fair_key) of a fair
-- name, queue and priority, scored by the round each one's next task there gets. A new task's
-- round is its key's next, but never below the round its name, queue and priority are at
-- (`current`: the lowest round of their due tasks being served, in their fair set or in
-- their name's parked set (fparked), not those parked by key; with none, the highest next
-- round handed out there), so a key idle for a while joins the round being served, and a
-- burst after the backlog drained starts after every round numbered there so far (tasks
-- still scheduled keep theirs). A key's tasks in one call get consecutive rounds. An entry at or below that lowest round says no more than
-- `current` would: the first store of a call in a queue and priority drops those (all but the
-- highest when nothing there is due), so the set keeps about one entry per key with work due
-- there, and one once idle.
local fair_seen = {} -- this call's view of each fair name, queue and priority

-- The round of the first task of a set scored by round, or nil when it is empty.
local function first_round(set)
  local first = redis.call('ZRANGE', set, 0, 0, 'WITHSCORES')
  return first[2] and tonumber(first[2])
end

-- The lower of two rounds, either maybe nil.
local function lower(a, b)
  if a == nil or (b ~= nil and b < a) then
    return b
  end
  return a
end

-- The highest next round handed out in a `fround` set, 0 for none.
local function top_round(rounds)
  local top = redis.call('ZRANGE', rounds, -1, -1, 'WITHSCORES')
  return top[2] and tonumber(top[2]) or 0
end

-- This call's view of the rounds of `name`, `queue` and `priority`: {rounds (the fround
-- key), current, nexts (key -> next round, once numbered in this call)}. The first look of a
-- call drops the entries `current` makes redundant (see above); the highest always stays.
local function fair_view(name, queue, priority)
  local bucket = #name .. ':' .. name .. ':' .. queue .. ':' .. priority
  local seen = fair_seen[bucket]
  if seen then
    return seen
  end
  local rounds = P .. 'fround:' .. bucket
  local lowest = lower(first_round(fair_set(name, queue, priority)),
    first_round(fair_parked_set(name, queue, priority)))
  local top = top_round(rounds)
  if lowest and lowest < top then
    redis.call('ZREMRANGEBYSCORE', rounds, '-inf', lowest)
  else
    redis.call('ZREMRANGEBYRANK', rounds, 0, -2)
  end
  seen = {rounds = rounds, current = lowest or top, nexts = {}}
  fair_seen[bucket] = seen
  return seen
end

-- The round of a new task of fair name `name`, `queue` and `priority`, of key `fair_key`, as
-- a string ('%.0f': exact up to 2^53, where tostring would round past 14 digits).
local function fair_round(name, queue, priority, fair_key)
  local seen = fair_view(name, queue, priority)
  local round = seen.nexts[fair_key]
  if not round then
    round = math.max(tonumber(redis.call('ZSCORE', seen.rounds, fair_key) or 0), seen.current)
  end
  seen.nexts[fair_key] = round + 1
  redis.call('ZADD', seen.rounds, round + 1, fair_key)
  return string.format('%.0f', round)
end

-- How many values submit.lua (and schedule_fire.lua) take per task (codec.submit_args).
local TASK_ARGS = 21

-- Store a new task from the TASK_ARGS values submit.lua takes per task, starting at ARGV[i] (its id
-- must not exist). `promoted` and `woken` are the calling script's sets of queues: promoted
-- once per call, and to be woken once at its end. With `batch` (a table the caller passes to
-- flush_stored at its end), a task due now joins its ready list and the CREATED count in one
-- command per list and queue for the whole call, in the order stored. `values`: read the
-- values from this table instead of ARGV (a batch's callback, see _batches.lua). A task of a
-- fair name (its last value: ':' and its fair key) gets its round (`fr`, fair_round).
local function store_task(i, promoted, woken, batch, values)
  local A = values or ARGV
  local id, queue, priority = A[i], A[i + 2], A[i + 3]
  local key = tkey(id)
  local run_at, deadline = A[i + 10], A[i + 11]
  redis.call('HSET', key, 'n', A[i + 1], 'q', queue, 'p', priority, 's', 'CREATED',
    'j', A[i + 4], 'rl', A[i + 5], 'ri', A[i + 6], 'rb', A[i + 7],
    'c', A[i + 9], 'r', run_at, 'a', 0, 'b', 0, 'k', 0)
  if A[i + 8] ~= '' then
    redis.call('HSET', key, 'md', A[i + 8])
  end
  if deadline ~= '' then
    redis.call('HSET', key, 'd', deadline)
    redis.call('ZADD', DEADLINES, deadline, id)
  end
  if A[i + 12] ~= '' then
    redis.call('HSET', key, 'rk', A[i + 12]) -- rate_key
  end
  if A[i + 13] ~= '' then
    redis.call('HSET', key, 'tc', A[i + 13]) -- the submitter's trace context
  end
  if A[i + 14] ~= '' then -- a batch member: counted in its batch's total as it is stored
    redis.call('HSET', key, 'bt', A[i + 14])
    if A[i + 15] and A[i + 15] ~= '' then -- (a callback packed before it existed has none)
      redis.call('HSET', key, 'bg', A[i + 15]) -- which batch of that id (see _batches.lua)
    end
    if SHARD == BATCH_HOME then
      redis.call('HINCRBY', P .. 'b:' .. A[i + 14], 'n', 1)
      redis.call('ZADD', P .. 'bm:' .. A[i + 14] .. ':LIVE', A[i + 9], id) -- see _batches.lua
    end -- else batch_join.lua counts it on the batch's shard, called right after this
  end
  if A[i + 16] and A[i + 16] ~= '' then -- (a callback packed before it existed has none)
    redis.call('HSET', key, 'at', A[i + 16]) -- attempt_timeout, seconds
  end
  if A[i + 17] and A[i + 17] ~= '' then -- (a callback packed before it existed has none)
    redis.call('HSET', key, 'ck', A[i + 17]) -- concurrency_key
  end
  if A[i + 19] and A[i + 19] ~= '' then -- tags, a JSON list (a callback packed before: none)
    redis.call('HSET', key, 'tg', A[i + 19])
    for _, tag in ipairs(cjson.decode(A[i + 19])) do
      redis.call('ZADD', P .. 'tag:' .. tag, A[i + 9], id) -- list_tasks(tag=...), by creation
    end
  end
  -- its parameter index entries (a JSON list; a callback packed before they existed: none)
  index_parameter(id, A[i + 20], A[i + 9])
  if not promoted[queue] then
    promoted[queue] = true
    redis.call('SADD', P .. 'queues', queue)
    promote(queue, 1000) -- earlier due tasks keep their place ahead of these
  end
  woken[queue] = true -- a delayed task too: an idle worker then waits until it is due
  if batch then
    batch.counts[queue] = (batch.counts[queue] or 0) + 1
  else
    recount(queue, nil, 'CREATED')
  end
  local fair = false
  if A[i + 18] and A[i + 18] ~= '' then -- (a callback packed before it existed has none)
    -- (after the promote above: the tasks it made due count in the round the name is at)
    local round = fair_round(A[i + 1], queue, priority, string.sub(A[i + 18], 2))
    redis.call('HSET', key, 'fr', round)
    fair = {A[i + 1], round, run_at}
  end
  if tonumber(run_at) > NOWN then
    redis.call('ZADD', P .. 'sched:' .. queue, run_at, id)
  elseif batch and not fair then
    local list = queue .. ':' .. priority
    local ids = batch.ready[list]
    if not ids then
      ids = {}
      batch.ready[list] = ids
      batch.lists[#batch.lists + 1] = {queue, priority}
    end
    ids[#ids + 1] = id
  else
    push_ready(id, queue, priority, false, fair)
  end
end

local function new_batch()
  return {counts = {}, ready = {}, lists = {}}
end

-- What store_task left in `batch`: the CREATED counts, then the ready lists (ids in the order
-- stored, a few thousand per command at most: unpack's limit).
local function flush_stored(batch)
  for queue, n in pairs(batch.counts) do
    redis.call('HINCRBY', COUNTS, 'CREATED:' .. queue, n)
  end
  for _, list in ipairs(batch.lists) do
    local queue, priority = list[1], list[2]
    local ids = batch.ready[queue .. ':' .. priority]
    for first = 1, #ids, 4000 do
      redis.call('RPUSH', P .. 'ready:' .. queue .. ':' .. priority,
        unpack(ids, first, math.min(first + 3999, #ids)))
    end
    redis.call('ZADD', P .. 'prio:' .. queue, priority, priority)
  end
end
