-- param_reindex: `manage.py executor index-parameters` on Redis: stored tasks given the
-- parameter index entries of the current SEARCHABLE_PARAMETERS (storage/redis/parameter_index.py),
-- those of keys no longer named dropped.
-- ARGV[3..]: per task 3 values: its id, the SHA-1 of the parameter JSON the caller read (its
-- entries were computed from it), and its entries as store_task takes them ('' = none). A task
-- purged since, or whose parameter changed since (a debounced join wrote its own entries), is
-- left as it is.
-- Returns per task 1 (its entries were replaced) or 0.
local out = {}
for i = 3, #ARGV, 3 do
  local id, entries = ARGV[i], ARGV[i + 2]
  local task = redis.call('HMGET', tkey(id), 'j', 'c', 'px')
  if task[1] and redis.sha1hex(task[1]) == ARGV[i + 1] and (task[3] or '') ~= entries then
    unindex_parameter(id, task[3])
    redis.call('HDEL', tkey(id), 'px')
    index_parameter(id, entries, task[2])
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
