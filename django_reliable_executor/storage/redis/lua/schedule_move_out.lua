-- schedule_move_out: the first step of moving schedule ARGV[3] to shard ARGV[4] (its queue is
-- now on that shard; storage/redis/schedule_moves.py). Here it stops firing, its state kept:
-- its next run goes from `nr` to `mn` and it leaves the due index, so a fire planned before
-- stores nothing any more (schedule_fire.lua compares `nr`, and the due scan skips a hash
-- without one); `mt` = ARGV[4]. The hash stays, read and listed as the schedule, until the
-- move's last step deletes it. Run again on a hash moved out already, it changes nothing.
-- Returns the schedule's fields (HGETALL) as they were, or an empty list for an unknown id.
local id = ARGV[3]
local key = P .. 's:' .. id
local values = redis.call('HGETALL', key)
local next_run = redis.call('HGET', key, 'nr')
if next_run then
  redis.call('HSET', key, 'mn', next_run, 'mt', ARGV[4])
  redis.call('HDEL', key, 'nr')
  redis.call('ZREM', P .. 'schedules:due', id)
end
return values
