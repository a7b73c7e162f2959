-- schedule_advance: after a fire's tasks were stored, move each schedule on to its next run.
-- ARGV[3..]: 5 values per schedule: id, the next run the fire planned from, the new next run,
-- the planned time of the latest run fired ('' = none) and its task id ('' = none).
-- A schedule that no longer expects that fire (paused, redefined, deleted, or moved on by
-- another master) is left alone. Returns 1 (moved on) or 0 per schedule.
local out = {}
for i = 3, #ARGV, 5 do
  local id, expected, next_run, last_run, last_task = ARGV[i], ARGV[i + 1], ARGV[i + 2],
    ARGV[i + 3], ARGV[i + 4]
  local key = P .. 's:' .. id
  local state = redis.call('HMGET', key, 'nr', 'pa')
  if state[1] == expected and not state[2] then
    redis.call('HSET', key, 'nr', next_run)
    if last_run ~= '' then
      redis.call('HSET', key, 'lr', last_run, 'lt', last_task)
    end
    redis.call('ZADD', P .. 'schedules:due', next_run, id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
