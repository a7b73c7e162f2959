-- fail: record a failed attempt of a RUNNING task, if the token still holds.
-- ARGV[3] id, ARGV[4] token, ARGV[5] error, ARGV[6] the outcome without a cancel request
-- (PENDING, FAILED or TIMEOUT), ARGV[7] next run time for PENDING, ARGV[8] '1' for ERROR,
-- ARGV[9] this call's nonce.
-- A requested cancel turns any outcome but ERROR into CANCELLED.
-- Returns {status, cancel flag}, or nil when the attempt was no longer this claim's;
-- sharded, {status, cancel flag, 1} when the ending sent a message to another shard (the
-- caller then delivers its outbox).
local id, token = ARGV[3], ARGV[4]
local key = tkey(id)
local task = redis.call('HMGET', key, 's', 'k', 'q', 'p', 'x', 'rq')
if task[1] ~= 'RUNNING' or task[2] ~= token then
  if task[1] and task[2] == token and task[6] == ARGV[9] then
    return {task[1], task[5] or '0'} -- this very call, sent again after a lost reply
  end
  return nil
end
redis.call('HSET', key, 'rq', ARGV[9])
local status = ARGV[6]
if ARGV[8] == '1' then
  status = 'ERROR'
elseif task[5] == '1' then
  status = 'CANCELLED'
end
record_failure(id, key, task[3], task[4], status, ARGV[7], ARGV[5])
if SENT then
  return {status, task[5] or '0', 1}
end
return {status, task[5] or '0'}
