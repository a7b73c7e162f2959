-- unique_reserve: on the home shard of a unique key (sharding.py: crc32 of its digest), take
-- the key for a task about to be stored on another shard, its queue's, unless a task holds it
-- within its window. The home shard decides every submit of a key, so two submits of one key
-- to queues on two shards cannot both store a task. Runs only with more than one shard.
-- ARGV[3] the queue's shard (its index), ARGV[4] the key digest, ARGV[5] the task id, ARGV[6]
-- the end of the key's window, ARGV[7] the entry expected ('' to take a free key; else the
-- entry a caller saw, to replace it: its holder is terminal, or was never stored within the
-- grace the caller applies), ARGV[8] '1' to hold the key as an entry even when the queue's
-- shard is this one (a call of several shards reserves every key before its first write, so
-- that no submit takes one between; the task is then submitted without the key) or ''.
-- P u:<digest>: STRING "<window end> <task id>" (a task of this shard holds it, as submit.lua
-- writes it) or "<window end> <task id> <shard> <reserved at>" (a task of that shard), expiring
-- with the window (PX). When the queue's shard is this one and ARGV[8] is '' (a caller taking
-- over an entry before submit.lua), a replaced entry is deleted: submit.lua then takes the key.
-- Returns '' (taken: store the task, without the key) or the entry found (its task holds the
-- key, or is being stored; the caller checks which).
local shard, digest, id, until_, expected = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local hold = ARGV[8] == '1'
local key = P .. 'u:' .. digest
local held = redis.call('GET', key)
if held and held ~= expected then
  local space = string.find(held, ' ', 1, true)
  local rest = string.sub(held, space + 1)
  if tonumber(string.sub(held, 1, space - 1)) > NOWN
      and string.sub(rest, 1, #id + #shard + 2) ~= id .. ' ' .. shard .. ' ' then
    return held -- (a repeated or resumed submit of the same task finds its own entry)
  end
end
if tonumber(shard) == SHARD and not hold then
  redis.call('DEL', key)
else
  local ttl = math.max(1, math.ceil((tonumber(until_) - NOWN) / 1000))
  local entry = until_ .. ' ' .. id .. ' ' .. shard .. ' ' .. NOW
  redis.call('SET', key, entry, 'PX', string.format('%d', ttl))
end
return ''
