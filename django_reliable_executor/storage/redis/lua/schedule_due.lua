-- schedule_due: the active schedules due at now, earliest first, at most ARGV[3] of them.
-- ARGV[4..]: the hash fields to read of each; none: every field.
-- Returns {id, values, id, values, ...}: the due scan and the hashes in one call. values: the
-- fields asked for, in that order (false: absent), or HGETALL's {field, value, ...}.
-- (The master asks for the fields it plans and fires with: a small hash is a list that HMGET
-- scans per field, but each value returned costs more, through Lua, than that scan.)
local out = {}
local names = {unpack(ARGV, 4)}
local due = redis.call('ZRANGEBYSCORE', P .. 'schedules:due', '-inf', NOW, 'LIMIT', 0, ARGV[3])
for _, id in ipairs(due) do
  out[#out + 1] = id
  if #names > 0 then
    out[#out + 1] = redis.call('HMGET', P .. 's:' .. id, unpack(names))
  else
    out[#out + 1] = redis.call('HGETALL', P .. 's:' .. id)
  end
end
return out
