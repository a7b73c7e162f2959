-- debounce_join: on the shard of the task a debounced key names, a debounced submit of that
-- key joins the task (join_debounced in _common.lua) if it may still be joined (joinable):
-- waiting unclaimed, CREATED, never started. Runs only with more than one shard, where the
-- key's entry (on its home shard) and the task may be on different shards: submit.lua joins
-- a task of its own shard whose key lives there too.
-- ARGV[3] the task's id, ARGV[4] the submit's parameter JSON, ARGV[5] the submit's creation
-- (µs), ARGV[6] its debounce (µs), ARGV[7] its debounce_max_wait (µs, '' = none), ARGV[8] how
-- long the key outlives the task's run at (KEY_HOLD, µs), ARGV[9] the key digest when this
-- shard is the key's home (its window is then extended here, unless its entry names another
-- task by now; the caller extends it on the home shard otherwise), else '', ARGV[10] the
-- submit's parameter index entries (as store_task takes them: the task's move to them).
-- Returns {the key's new window end, the task's fields as they now stand}, or '' when the
-- task is not there or may not be joined (the submit then takes the key for a new task).
local id, digest = ARGV[3], ARGV[9]
if not joinable(id) then
  return ''
end
local run_at = join_debounced(id, ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[10])
local until_ = string.format('%.0f', tonumber(run_at) + tonumber(ARGV[8]))
if digest ~= '' then
  extend_key(P .. 'u:' .. digest, id, until_)
end
return {until_, redis.call('HGETALL', tkey(id))}
