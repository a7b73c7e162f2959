-- unique_release: on the home shard of a unique key, give back the key unique_reserve.lua
-- took for a task of another shard that its submit then did not store (the submit was
-- refused whole), unless the entry names another task or shard by now. Runs only with more
-- than one shard.
-- ARGV[3] the queue's shard (its index), ARGV[4] the key digest, ARGV[5] the task id.
-- Returns 1 when the entry was deleted, else 0.
local shard, digest, id = ARGV[3], ARGV[4], ARGV[5]
local key = P .. 'u:' .. digest
local held = redis.call('GET', key)
if not held then
  return 0
end
local rest = string.sub(held, string.find(held, ' ', 1, true) + 1)
if string.sub(rest, 1, #id + #shard + 2) ~= id .. ' ' .. shard .. ' ' then
  return 0
end
redis.call('DEL', key)
return 1
