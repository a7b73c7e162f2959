-- lock_release: give the named lease up if `owner` holds it. ARGV[3] name, ARGV[4] owner.
local key = P .. 'lock:' .. ARGV[3]
local value = redis.call('GET', key)
if value then
  local sep = string.find(value, ':', 1, true)
  if string.sub(value, sep + 1) == ARGV[4] then
    redis.call('DEL', key)
    return 1
  end
end
return 0
