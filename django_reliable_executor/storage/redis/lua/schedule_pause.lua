-- schedule_pause: pause (ARGV[4] = '1') or resume (ARGV[4] = '0') the schedule ARGV[3].
-- A paused schedule leaves the due index and keeps its next run, so on resume the runs it
-- missed meet its misfire policy. Returns the schedule's fields, or nil for an unknown id.
local id, pause = ARGV[3], ARGV[4] == '1'
local key = P .. 's:' .. id
if redis.call('EXISTS', key) == 0 then
  return nil
end
local paused = redis.call('HEXISTS', key, 'pa') == 1
if pause and not paused then
  redis.call('HSET', key, 'pa', '1', 'u', NOW)
  redis.call('ZREM', P .. 'schedules:due', id)
  redis.call('ZADD', P .. 'schedules:paused', 0, id)
elseif paused and not pause then
  redis.call('HDEL', key, 'pa')
  redis.call('HSET', key, 'u', NOW)
  redis.call('ZADD', P .. 'schedules:due', redis.call('HGET', key, 'nr'), id)
  redis.call('ZREM', P .. 'schedules:paused', id)
end
return redis.call('HGETALL', key)
