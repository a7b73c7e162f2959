-- schedule_move_in: the second step of moving schedule ARGV[3] to this shard: create it with
-- the fields ARGV[4] (a JSON object: its definition and the state schedule_move_out.lua
-- returned, next run `nr` included), in the paused index when `pa` is set, else in the due
-- index. A hash of the id here that was moved out (`mt`: the queue came back before a move
-- away finished) is replaced.
-- Returns 1, or 0 when this shard holds the schedule already (an earlier move of it got this
-- far, and its state here is the newer: the caller then saves the definition as usual).
local id = ARGV[3]
local key = P .. 's:' .. id
if redis.call('EXISTS', key) == 1 then
  if redis.call('HEXISTS', key, 'mt') == 0 then
    return 0
  end
  redis.call('DEL', key)
  redis.call('ZREM', P .. 'schedules:paused', id)
end
local values = cjson.decode(ARGV[4])
for field, value in pairs(values) do
  redis.call('HSET', key, field, value)
end
redis.call('ZADD', P .. 'schedules', 0, id)
if values.pa then
  redis.call('ZADD', P .. 'schedules:paused', 0, id)
else
  redis.call('ZADD', P .. 'schedules:due', values.nr, id)
end
return 1
