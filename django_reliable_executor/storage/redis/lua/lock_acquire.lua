-- lock_acquire: take or renew the named lease. The value is "<expiry>:<owner>"; the key also
-- expires by Redis's own clock (PX), so a lock whose holder vanished always goes away.
-- ARGV[3] name, ARGV[4] owner, ARGV[5] expiry, ARGV[6] ttl in milliseconds. Returns 1 or 0.
local key = P .. 'lock:' .. ARGV[3]
local owner = ARGV[4]
local value = redis.call('GET', key)
if value then
  local sep = string.find(value, ':', 1, true)
  if string.sub(value, sep + 1) ~= owner and tonumber(string.sub(value, 1, sep - 1)) >= NOWN then
    return 0
  end
end
redis.call('SET', key, ARGV[5] .. ':' .. owner, 'PX', ARGV[6])
return 1
