-- id_release: on the directory shard of each id, forget the reservation of a task its home
-- purged (the purge chore calls it after purge.lua); an entry naming another home (the id
-- was submitted again elsewhere meanwhile) is kept. Runs only with more than one shard.
-- ARGV[3] the home shard, ARGV[4..] task ids. Returns how many entries were deleted.
local home = ARGV[3]
local released = 0
for i = 4, #ARGV do
  local key = P .. 'i:' .. ARGV[i]
  local entry = redis.call('GET', key)
  if entry and string.match(entry, '^(%d+) ') == home then
    redis.call('DEL', key)
    released = released + 1
  end
end
return released
