-- schedule_delete: forget the schedule ARGV[3] (tasks it fired stay). Returns 1, or 0 when
-- there was no such schedule.
local id = ARGV[3]
redis.call('ZREM', P .. 'schedules:due', id)
redis.call('ZREM', P .. 'schedules:paused', id)
redis.call('ZREM', P .. 'schedules', id)
return redis.call('DEL', P .. 's:' .. id)
