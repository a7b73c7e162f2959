-- id_reserve: on the directory shard of each id (sharding.py: crc32 of the id), reserve it for
-- the task about to be stored on another shard, its home, unless the id is already taken. The
-- directory shard decides every submit of an id, so two submits of one id to queues on two
-- shards cannot both store it. Runs only with more than one shard.
-- ARGV[3] the home shard (its index, a decimal string), ARGV[4..] pairs of task id and the
-- entry expected ('' to reserve a free id; else the entry a caller saw, to replace it: a
-- reservation whose home never stored the task, older than the grace the caller applies).
-- P i:<id>: STRING "<home shard> <reserved at>", the home of a task stored off its directory
-- shard; deleted by id_release.lua when the task is purged.
-- Returns per id '' (reserved for this home: store it there), 'here' (a task of this id lives
-- on this shard, its directory shard: it is the existing task), or the entry found (another
-- home holds or is storing it).
local home = ARGV[3]
local out = {}
for i = 4, #ARGV, 2 do
  local id, expected = ARGV[i], ARGV[i + 1]
  local key = P .. 'i:' .. id
  if redis.call('EXISTS', tkey(id)) == 1 then
    out[#out + 1] = 'here'
  else
    local entry = redis.call('GET', key)
    if not entry or entry == expected then
      redis.call('SET', key, home .. ' ' .. NOW)
      out[#out + 1] = ''
    elseif string.match(entry, '^(%d+) ') == home then
      out[#out + 1] = '' -- reserved for this home before: a repeated or resumed submit
    else
      out[#out + 1] = entry
    end
  end
end
return out
