-- schedule_due: the active schedules due at now, earliest first, at most ARGV[3] of them.
-- Returns {id, {field, value, ...}, id, {...}, ...}: the due scan and the hashes in one call.
-- (HGETALL, not HMGET of the fields wanted: a small hash is a list Redis scans once for
-- HGETALL, but once per field for HMGET.)
local out = {}
local due = redis.call('ZRANGEBYSCORE', P .. 'schedules:due', '-inf', NOW, 'LIMIT', 0, ARGV[3])
for _, id in ipairs(due) do
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGETALL', P .. 's:' .. id)
end
return out
