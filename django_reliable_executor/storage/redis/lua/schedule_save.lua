-- schedule_save: create schedules, or give existing ones a new definition.
-- ARGV[3] a JSON array of {id, fields = {field: string}, drop = [field, ...], next, keep,
-- anchored, created, updated}: `fields` are the definition fields to write, `drop` those the
-- definition leaves empty. A new schedule gets them all plus its next run `next` and both
-- times. An existing one keeps its state (paused, last run, created); its next run becomes
-- `next` unless `keep`. `anchored`: the definition gave no start (its `sa` is the caller's
-- now); an existing one whose interval, cron and time zone are the same keeps its start `sa`
-- and its next run (another process saved it after this caller read it: the grid must not
-- move). (The times come from the caller's clock, which its answer already shows.)
-- Returns the number of schedules created.
local ALL, DUE = P .. 'schedules', P .. 'schedules:due'
local TIMING = {'ev', 'cr', 'tz'}
local created = 0
for _, item in ipairs(cjson.decode(ARGV[3])) do
  local key = P .. 's:' .. item.id
  local exists = redis.call('EXISTS', key) == 1
  local keep = item.keep
  if exists and item.anchored then
    local stored = redis.call('HMGET', key, unpack(TIMING))
    local same = true
    for index, field in ipairs(TIMING) do
      if (stored[index] or nil) ~= item.fields[field] then
        same = false
      end
    end
    if same then -- else the new definition's start and next run are written together
      item.fields.sa = nil
      keep = true
    end
  end
  for field, value in pairs(item.fields) do
    redis.call('HSET', key, field, value)
  end
  for _, field in ipairs(item.drop) do
    redis.call('HDEL', key, field)
  end
  redis.call('HSET', key, 'u', item.updated)
  if not exists then
    redis.call('HSET', key, 'c', item.created, 'nr', item.next)
    redis.call('ZADD', ALL, 0, item.id)
    redis.call('ZADD', DUE, item.next, item.id)
    created = created + 1
  elseif not keep then
    redis.call('HSET', key, 'nr', item.next)
    if redis.call('HEXISTS', key, 'pa') == 0 then
      redis.call('ZADD', DUE, item.next, item.id)
    end
  end
end
return created
