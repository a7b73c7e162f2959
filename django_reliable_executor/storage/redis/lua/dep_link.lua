-- dep_link: on the shard of dependencies of a task of another shard (sharded), before that
-- task is stored there: register it as a dependent of each one still live ("<shard> <id>" in
-- P deps:<dependency>, see _common.lua), so that its ending sends it a message; one that
-- ended already is told by this reply instead (the same script as the ending: no race).
-- ARGV[3] the dependent's shard, ARGV[4] its id, ARGV[5..] dependency ids.
-- Returns per dependency its status now ('' when it does not exist).
local out = {}
local member = ARGV[3] .. ' ' .. ARGV[4]
for i = 5, #ARGV do
  local status = redis.call('HGET', tkey(ARGV[i]), 's')
  if status and not_ended(ARGV[i], status) then
    redis.call('SADD', P .. 'deps:' .. ARGV[i], member)
    if not live(status) then
      status = 'RUNNING' -- a timed-out one whose handler runs on has not ended either
    end
  end
  out[#out + 1] = status or ''
end
return out
