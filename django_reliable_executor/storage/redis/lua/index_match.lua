-- index_match: a listing's or a count's read of an index scored by creation time (a finished
-- status's done:<STATUS>, a tag's tag:<tag>), newest first, its tasks' status, name and queue checked here on
-- the server (storage/redis/listing.py): in the client each entry costs a task's fields read
-- and parsed, about 0.1 ms; here a few microseconds, so a count of dead letters of one name
-- reads its whole index instead of stopping at "at least".
-- ARGV[3] = the index's key (under P), ARGV[4] = the first rank to read (ZREVRANGE),
-- ARGV[5] = how many entries to read, ARGV[6] / ARGV[7] = '=' .. the task name / queue wanted
-- ('' = any), ARGV[8..] = the statuses accepted.
-- Returns {entries read, created, id, created, id, ...}: the matching tasks, newest first
-- (a task purged meanwhile is left out; created as its decimal string of microseconds).
local first = tonumber(ARGV[4])
local entries = redis.call('ZREVRANGE', ARGV[3], first, first + tonumber(ARGV[5]) - 1)
local name = ARGV[6] ~= '' and string.sub(ARGV[6], 2) or nil
local queue = ARGV[7] ~= '' and string.sub(ARGV[7], 2) or nil
local accept = {}
for i = 8, #ARGV do
  accept[ARGV[i]] = true
end
local out = {#entries}
for _, id in ipairs(entries) do
  local task = redis.call('HMGET', tkey(id), 'c', 's', 'n', 'q')
  if task[1] and accept[task[2]] and (not name or task[3] == name)
      and (not queue or task[4] == queue) then
    out[#out + 1] = task[1]
    out[#out + 1] = id
  end
end
return out
